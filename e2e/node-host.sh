# shellcheck shell=bash
# The host side of the real e2e node (sourced by e2e/node.sh): what it changes on this
# machine outside its state folder, and how each change is undone. Everything it adds is
# named after rljob (bridge rljob0, iptables chain RLJOB-E2E-FWD, cgroup /rljob-e2e) and
# recorded in ${NODE_DIR}, so `e2e/node.sh stop` removes exactly that and nothing else.

BRIDGE="rljob0"
FWD_CHAIN="RLJOB-E2E-FWD"
CGROUP_ROOT="/rljob-e2e" # kubelet's cgroupRoot, made in every cgroup v1 hierarchy (or in v2)
# Sysctls the kubelet sets at start (vm.overcommit_memory=1, kernel.panic=10, ...), the CNI bridge
# plugin sets (ip_forward=1) and we set (bridge-nf-call-iptables=1): saved here, restored at stop.
SYSCTLS=(vm.overcommit_memory vm.panic_on_oom kernel.panic kernel.panic_on_oops
  kernel.keys.root_maxkeys kernel.keys.root_maxbytes net.ipv4.ip_forward
  net.bridge.bridge-nf-call-iptables net.ipv4.conf.all.route_localnet)
# Host folders the kubelet or containerd create outside the state folder; removed at stop
# when empty and absent before start.
HOST_DIRS=(/var/log/containers /var/log/pods /var/lib/cni/results /var/lib/cni /run/containerd/s /run/containerd)

# ---------------------------------------------------------------- sysctls, folders
save_host_state() {
  local k v d
  [[ -f "${NODE_DIR}/sysctl.saved" ]] && return 0 # a restart keeps the first saved values
  for k in "${SYSCTLS[@]}"; do
    v="$(sysctl -n "${k}" 2>/dev/null)" && echo "${k}=${v}"
  done >"${NODE_DIR}/sysctl.saved.tmp"
  for d in "${HOST_DIRS[@]}"; do
    [[ -e "${d}" ]] || echo "${d}"
  done >"${NODE_DIR}/host-dirs.absent"
  mv "${NODE_DIR}/sysctl.saved.tmp" "${NODE_DIR}/sysctl.saved"
}

restore_host_state() {
  local line d changed=()
  if [[ -f "${NODE_DIR}/sysctl.saved" ]]; then
    while IFS= read -r line; do
      [[ "$(sysctl -n "${line%%=*}" 2>/dev/null)" == "${line#*=}" ]] && continue
      sysctl -qw "${line}" && changed+=("${line}")
    done <"${NODE_DIR}/sysctl.saved"
    rm -f "${NODE_DIR}/sysctl.saved"
    log "node: sysctls restored: ${changed[*]:-none had changed}"
  fi
  # kubelet's symlinks to our containers' logs
  if [[ -d /var/log/containers ]]; then
    find /var/log/containers -maxdepth 1 -type l -lname "${NODE_DIR}/*" -delete 2>/dev/null || true
  fi
  # libcni's result cache of our network (containerd 1.6 has no setting for its folder)
  rm -f /var/lib/cni/results/rljob-e2e-* 2>/dev/null || true
  if [[ -f "${NODE_DIR}/host-dirs.absent" ]]; then
    while IFS= read -r d; do
      rmdir "${d}" 2>/dev/null || true
    done <"${NODE_DIR}/host-dirs.absent"
    rm -f "${NODE_DIR}/host-dirs.absent"
  fi
}

# ---------------------------------------------------------------- network
# The bridge exists before any pod (the CNI bridge plugin would make it only with the first
# pod), so CoreDNS, the API forwarder and the kubelet can bind its address at start.
bridge_owner() { ip -o link show "${BRIDGE}" 2>/dev/null | sed -n 's/.* alias \(.*\)$/\1/p'; }

setup_network() {
  ip link add "${BRIDGE}" type bridge
  ip link set "${BRIDGE}" alias "${STATE}" # who owns it, for the next start's check
  ip addr add "${NODE_GATEWAY}/${NODE_POD_CIDR#*/}" dev "${BRIDGE}"
  ip link set "${BRIDGE}" up
  # Service IPs go to the bridge, where kube-proxy's DNAT catches them (also for the host's
  # own connections); the rest of the pod range (kwok's fake IPs) goes nowhere.
  ip route add "${SERVICE_CIDR}" dev "${BRIDGE}" src "${NODE_GATEWAY}"
  ip route add blackhole "${CLUSTER_CIDR}" 2>/dev/null || true
  sysctl -qw net.ipv4.ip_forward=1                    # service traffic between pods is routed
  sysctl -qw net.bridge.bridge-nf-call-iptables=1     # ... and its replies cross the bridge
  # Forward nothing but bridge-to-bridge: no pod traffic ever leaves the machine.
  iptables -w -N "${FWD_CHAIN}"
  iptables -w -A "${FWD_CHAIN}" -i "${BRIDGE}" -o "${BRIDGE}" -j RETURN
  iptables -w -A "${FWD_CHAIN}" -i "${BRIDGE}" -j DROP
  iptables -w -A "${FWD_CHAIN}" -o "${BRIDGE}" -j DROP
  iptables -w -I FORWARD 1 -j "${FWD_CHAIN}"
  log "node: bridge ${BRIDGE} ${NODE_GATEWAY}/${NODE_POD_CIDR#*/}, services ${SERVICE_CIDR} via it"
}

teardown_network() {
  local t c
  while iptables -w -D FORWARD -j "${FWD_CHAIN}" 2>/dev/null; do :; done
  iptables -w -F "${FWD_CHAIN}" 2>/dev/null && iptables -w -X "${FWD_CHAIN}" 2>/dev/null
  # what `kube-proxy --cleanup` leaves: the kubelet's canary chains (it watches them to notice
  # an iptables flush), its hint chain, and the (emptied) KUBE-FIREWALL chain with its jumps
  for c in iptables ip6tables; do
    for t in mangle nat filter; do
      "${c}" -w -t "${t}" -X KUBE-KUBELET-CANARY 2>/dev/null || true
    done
    "${c}" -w -t mangle -X KUBE-IPTABLES-HINT 2>/dev/null || true # the kubelet's "iptables in use" mark
    while "${c}" -w -D INPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    while "${c}" -w -D OUTPUT -j KUBE-FIREWALL 2>/dev/null; do :; done
    if "${c}" -w -F KUBE-FIREWALL 2>/dev/null; then "${c}" -w -X KUBE-FIREWALL 2>/dev/null || true; fi
  done
  ip route del blackhole "${CLUSTER_CIDR}" 2>/dev/null || true
  if [[ "$(bridge_owner)" == "${STATE}" ]]; then ip link del "${BRIDGE}"; fi
}

# ---------------------------------------------------------------- cgroups
cgroup_dirs() { # the kubelet's cgroup root in each mounted hierarchy
  if [[ -f /sys/fs/cgroup/cgroup.controllers ]]; then
    echo "/sys/fs/cgroup${CGROUP_ROOT}"
    return
  fi
  local d # every hierarchy, the named "systemd" one included: the kubelet checks them all
  for d in /sys/fs/cgroup/*/; do
    [[ -d "${d}" ]] && echo "${d%/}${CGROUP_ROOT}"
  done
}

setup_cgroups() {
  local d
  for d in $(cgroup_dirs); do mkdir -p "${d}"; done
}

teardown_cgroups() { # deepest first; a cgroup still holding a process stays (and is named)
  local d
  for d in $(cgroup_dirs); do
    [[ -d "${d}" ]] || continue
    find "${d}" -depth -type d -exec rmdir {} \; 2>/dev/null || log "node: cgroup ${d} not empty, left"
  done
}

# ---------------------------------------------------------------- mounts and leftover processes
unmount_under() { # folder: unmount everything mounted below it, deepest first
  local m
  awk -v p="$1/" 'index($5, p) == 1 { print $5 }' /proc/self/mountinfo | sort -r | while read -r m; do
    umount "${m}" 2>/dev/null || umount -l "${m}" 2>/dev/null || true
  done
}

kill_containers() { # every container of our containerd, without the kubelet (stopped first)
  pid_of containerd >/dev/null || return 0
  local ns id n=0
  for ns in $(ctr_ namespaces ls -q 2>/dev/null); do
    for id in $(ctr_ -n "${ns}" tasks ls -q 2>/dev/null); do
      ctr_ -n "${ns}" tasks kill -a -s SIGKILL "${id}" >/dev/null 2>&1 || true
      n=$((n + 1))
    done
    for id in $(ctr_ -n "${ns}" tasks ls -q 2>/dev/null); do
      ctr_ -n "${ns}" tasks rm -f "${id}" >/dev/null 2>&1 || true
    done
    for id in $(ctr_ -n "${ns}" containers ls -q 2>/dev/null); do
      ctr_ -n "${ns}" containers rm "${id}" >/dev/null 2>&1 || true
      # libcni's cached results of this sandbox (no CNI DEL runs for it now)
      rm -f /var/lib/cni/results/*-"${id}"-* 2>/dev/null || true
    done
  done
  log "node: ${n} container task(s) killed"
}

kill_cgroup_leftovers() { # processes still in the node's cgroups once their containers are gone (a container
  # whose task `ctr` no longer lists, such as a restarted operator pod's, keeps running after the node stops)
  local d pids try
  for try in 1 2 3 4 5; do
    pids="$(for d in $(cgroup_dirs); do
      [[ -d "${d}" ]] && find "${d}" -name cgroup.procs -exec cat {} + 2>/dev/null
    done | sort -u | tr '\n' ' ')"
    [[ -n "${pids// /}" ]] || return 0
    ((try > 1)) || log "node: killing process(es) left in its cgroups: ${pids}"
    # shellcheck disable=SC2086  # one pid a word
    kill -KILL ${pids} 2>/dev/null || true
    sleep 0.2
  done
  log "node: process(es) ${pids} would not die"
}

kill_shims() { # containerd shims of our containerd (they outlive it by design)
  local p
  for p in /proc/[0-9]*; do
    { tr '\0' ' ' <"${p}/cmdline"; } 2>/dev/null | grep -qF -- "-address ${CTRD_SOCK} " || continue
    kill -KILL "${p#/proc/}" 2>/dev/null || true
  done
}
