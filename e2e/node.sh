#!/usr/bin/env bash
# One real node for the e2e cluster started by e2e/cluster.sh: containerd + runc (Debian),
# the CNI bridge, the kubelet and kube-proxy (built from the same k8s.io/kubernetes module
# as the API server) and CoreDNS (built from its module), all as processes of the cluster's
# state folder. kwok's fake nodes stay; this is one more node of the same cluster, tainted
# rljob.io/e2e-real-node=true:NoSchedule so that only pods that ask for it land on it.
#
#   e2e/node.sh check    exit 0 if this machine can run it; else print what is missing
#   e2e/node.sh start    join the node (cluster must run), wait until it is Ready
#   e2e/node.sh stop     kill its pods, stop it, undo every host change (sysctls restored)
#   e2e/node.sh status   what runs; exit 0 only if all of it runs and the node is Ready
#
# Needs root, e2e/node-deps.sh's packages, overlayfs and cgroups; see e2e/README.md.
set -euo pipefail

# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=state.sh
. "$(dirname "${BASH_SOURCE[0]}")/state.sh"

NODE_DIR="${STATE}/node"
NODE_NAME="${RLJOB_E2E_NODE_NAME:-rljob-e2e-node}"
CTRD_DIR="${NODE_DIR}/containerd"
CTRD_SOCK="${CTRD_DIR}/containerd.sock"
CNI_BIN_DIR="/usr/lib/cni"
PAUSE_IMAGE="rljob.e2e/pause:local"
TEST_IMAGE="rljob.e2e/busybox:local"
NODE_COMPONENTS=(kube-proxy kubelet containerd coredns api-forward registry)

# shellcheck source=node-host.sh
. "$(dirname "${BASH_SOURCE[0]}")/node-host.sh"
# shellcheck source=node-registry.sh
. "$(dirname "${BASH_SOURCE[0]}")/node-registry.sh"

ctr_() { ctr --address "${CTRD_SOCK}" "$@"; }

# ---------------------------------------------------------------- check
missing() { # prints one line per thing this machine lacks
  [[ "$(id -u)" == 0 ]] || echo "root (the kubelet, containerd and the bridge need it)"
  local c
  for c in containerd ctr runc iptables ip socat htpasswd; do
    command -v "${c}" >/dev/null || echo "${c} (run e2e/node-deps.sh)"
  done
  for c in bridge host-local loopback; do
    [[ -x "${CNI_BIN_DIR}/${c}" ]] || echo "${CNI_BIN_DIR}/${c} (containernetworking-plugins)"
  done
  [[ -x /bin/busybox ]] && ! ldd /bin/busybox >/dev/null 2>&1 || echo "static /bin/busybox (busybox-static)"
  grep -qw overlay /proc/filesystems || echo "overlayfs in the kernel (/proc/filesystems)"
  [[ -d /sys/fs/cgroup/memory || -f /sys/fs/cgroup/cgroup.controllers ]] || echo "cgroups under /sys/fs/cgroup"
  [[ -d /proc/sys/net/bridge ]] || echo "bridge netfilter (/proc/sys/net/bridge)"
  for c in kubelet kube-proxy coredns kubectl registry; do
    [[ -x "${E2E_BIN}/${c}" ]] || echo "${E2E_BIN}/${c} (run e2e/build.sh)"
  done
}

# ---------------------------------------------------------------- configuration
node_pki() {
  local client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  # the kubelet's one certificate: its client identity (Node authorizer, NodeRestriction) and
  # its serving certificate (the API server reaches it at the node's InternalIP)
  sign_cert node "/O=system:nodes/CN=system:node:${NODE_NAME}" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth,serverAuth
subjectAltName=IP:${NODE_GATEWAY},IP:127.0.0.1,DNS:${NODE_NAME}"
  sign_cert kube-proxy "/CN=system:kube-proxy" "${client}" # bound by system:node-proxier
  sign_cert coredns "/CN=system:coredns" "${client}"       # bound below
  local u
  for u in node kube-proxy coredns; do write_kubeconfig "${NODE_DIR}/${u}.kubeconfig" "${u}"; done
  registry_pki
}

write_containerd_config() {
  cat >"${CTRD_DIR}/config.toml" <<EOF
version = 2
root = "${CTRD_DIR}/root"
state = "${CTRD_DIR}/state"
disabled_plugins = ["io.containerd.snapshotter.v1.aufs", "io.containerd.snapshotter.v1.btrfs",
  "io.containerd.snapshotter.v1.devmapper", "io.containerd.snapshotter.v1.zfs"]
[grpc]
  address = "${CTRD_SOCK}"
[ttrpc]
  address = "${CTRD_SOCK}.ttrpc"
[plugins."io.containerd.internal.v1.opt"]
  path = "${CTRD_DIR}/opt"
[plugins."io.containerd.grpc.v1.cri"]
  sandbox_image = "${PAUSE_IMAGE}"
  # no CAP_SYS_RESOURCE here: without it runc fails every sandbox ("can't get final child's PID")
  restrict_oom_score_adj = true
  netns_mounts_under_state_dir = true
  stream_server_address = "127.0.0.1"
  stream_server_port = "0"
  disable_apparmor = true
  [plugins."io.containerd.grpc.v1.cri".containerd]
    snapshotter = "overlayfs"
    default_runtime_name = "runc"
    [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc]
      runtime_type = "io.containerd.runc.v2"
      [plugins."io.containerd.grpc.v1.cri".containerd.runtimes.runc.options]
        SystemdCgroup = false
        Root = "${CTRD_DIR}/runc"
  [plugins."io.containerd.grpc.v1.cri".registry]
    config_path = "${CTRD_DIR}/certs.d"
  [plugins."io.containerd.grpc.v1.cri".cni]
    bin_dir = "${CNI_BIN_DIR}"
    conf_dir = "${NODE_DIR}/cni/net.d"
    max_conf_num = 1
EOF
}

# bridge plugin: pods on ${BRIDGE} with addresses from NODE_POD_CIDR; no default route and no
# masquerade, only routes to the pod and service ranges, so pod traffic cannot leave the machine.
write_cni_config() {
  mkdir -p "${NODE_DIR}/cni/net.d" "${NODE_DIR}/cni/ipam"
  cat >"${NODE_DIR}/cni/net.d/10-rljob-e2e.conflist" <<EOF
{
  "cniVersion": "1.0.0",
  "name": "rljob-e2e",
  "plugins": [
    {
      "type": "bridge", "bridge": "${BRIDGE}", "isGateway": true, "isDefaultGateway": false,
      "ipMasq": false, "hairpinMode": true,
      "ipam": {
        "type": "host-local", "dataDir": "${NODE_DIR}/cni/ipam",
        "ranges": [[{"subnet": "${NODE_POD_CIDR}", "gateway": "${NODE_GATEWAY}"}]],
        "routes": [{"dst": "${CLUSTER_CIDR}"}, {"dst": "${SERVICE_CIDR}"}]
      }
    }
  ]
}
EOF
}

write_kubelet_config() {
  cat >"${NODE_DIR}/kubelet.yaml" <<EOF
apiVersion: kubelet.config.k8s.io/v1beta1
kind: KubeletConfiguration
address: ${NODE_GATEWAY}
port: ${KUBELET_PORT}
readOnlyPort: 0
healthzBindAddress: 127.0.0.1
healthzPort: ${KUBELET_HEALTHZ_PORT}
tlsCertFile: ${PKI}/node.crt
tlsPrivateKeyFile: ${PKI}/node.key
authentication:
  anonymous: {enabled: false}
  webhook: {enabled: true}
  x509: {clientCAFile: ${PKI}/ca.crt}
authorization: {mode: Webhook}
containerRuntimeEndpoint: unix://${CTRD_SOCK}
cgroupDriver: cgroupfs
cgroupRoot: ${CGROUP_ROOT}
failCgroupV1: false
failSwapOn: false
clusterDNS: [${SERVICE_DNS_IP}]
clusterDomain: cluster.local
resolvConf: ""
podLogsDir: ${NODE_DIR}/pod-logs
maxPods: 30
imageGCHighThresholdPercent: 100
imageGCLowThresholdPercent: 99
evictionHard: {memory.available: 100Mi, nodefs.available: 1%, imagefs.available: 1%, nodefs.inodesFree: 1%}
registerWithTaints: [{key: rljob.io/e2e-real-node, value: "true", effect: NoSchedule}]
nodeStatusUpdateFrequency: 5s
syncFrequency: 10s
EOF
}

write_kube_proxy_config() {
  cat >"${NODE_DIR}/kube-proxy.yaml" <<EOF
apiVersion: kubeproxy.config.k8s.io/v1alpha1
kind: KubeProxyConfiguration
clientConnection: {kubeconfig: ${NODE_DIR}/kube-proxy.kubeconfig}
hostnameOverride: ${NODE_NAME}
mode: iptables
clusterCIDR: ${CLUSTER_CIDR}
bindAddress: ${NODE_GATEWAY}
healthzBindAddress: 127.0.0.1:${PROXY_HEALTHZ_PORT}
metricsBindAddress: 127.0.0.1:${PROXY_METRICS_PORT}
nodePortAddresses: ["${NODE_GATEWAY}/32"]
iptables: {localhostNodePorts: false, syncPeriod: 30s, minSyncPeriod: 0s}
# 0: leave the host's conntrack sysctls as they are
conntrack: {maxPerCore: 0, min: 0, tcpEstablishedTimeout: 0s, tcpCloseWaitTimeout: 0s, udpTimeout: 0s, udpStreamTimeout: 0s}
EOF
}

write_corefile() {
  cat >"${NODE_DIR}/Corefile" <<EOF
cluster.local:53 {
  bind ${NODE_GATEWAY}
  errors
  health 127.0.0.1:${DNS_HEALTH_PORT}
  ready 127.0.0.1:${DNS_READY_PORT}
  kubernetes cluster.local {
    kubeconfig ${NODE_DIR}/coredns.kubeconfig rljob-e2e
    pods insecure
    ttl 5
  }
  cache 5
}
EOF
}

# ---------------------------------------------------------------- API objects
# The "kubernetes" Service's endpoint (the API server runs with --endpoint-reconciler-type=none)
# is the forwarder on the bridge; "kube-dns" is CoreDNS on the bridge, a Service without selector.
apply_cluster_objects() {
  sed -e "s|@GATEWAY@|${NODE_GATEWAY}|g" -e "s|@API_PORT@|${API_PORT}|g" \
    -e "s|@DNS_IP@|${SERVICE_DNS_IP}|g" "${E2E_DIR}/node-objects.yaml" |
    kc apply --server-side --force-conflicts -f - >/dev/null
}

# ---------------------------------------------------------------- images
import_images() {
  local t0 img="${NODE_DIR}/images"
  t0="$(e2e_now)"
  mkdir -p "${img}"
  python3 "${E2E_DIR}/oci_image.py" "${img}/pause.tar" "${PAUSE_IMAGE}" \
    --entrypoint '["/bin/sh", "-c", "trap \"exit 0\" TERM INT; sleep 2147483647 & wait"]'
  # the test image also has our static kubectl: an in-cluster client of the API server
  python3 "${E2E_DIR}/oci_image.py" "${img}/busybox.tar" "${TEST_IMAGE}" --cmd '["/bin/sh"]' \
    --add "${E2E_BIN}/kubectl"
  ctr_ -n k8s.io images import --no-unpack "${img}/pause.tar" >/dev/null
  ctr_ -n k8s.io images import --no-unpack "${img}/busybox.tar" >/dev/null
  log "node: images ${PAUSE_IMAGE}, ${TEST_IMAGE} (busybox, kubectl) made and imported in $(e2e_since "${t0}")"
}

# ---------------------------------------------------------------- processes
pick_node_ports() {
  read -r KUBELET_PORT KUBELET_HEALTHZ_PORT PROXY_HEALTHZ_PORT PROXY_METRICS_PORT \
    DNS_HEALTH_PORT DNS_READY_PORT REGISTRY_PORT <<<"$(free_ports 7)"
  cat >"${NODE_DIR}/ports.env" <<EOF2
KUBELET_PORT=${KUBELET_PORT}
KUBELET_HEALTHZ_PORT=${KUBELET_HEALTHZ_PORT}
PROXY_HEALTHZ_PORT=${PROXY_HEALTHZ_PORT}
PROXY_METRICS_PORT=${PROXY_METRICS_PORT}
DNS_HEALTH_PORT=${DNS_HEALTH_PORT}
DNS_READY_PORT=${DNS_READY_PORT}
REGISTRY_PORT=${REGISTRY_PORT}
EOF2
}

node_ready() {
  [[ "$(kc get node "${NODE_NAME}" -o jsonpath='{.status.conditions[?(@.type=="Ready")].status}' 2>/dev/null)" == True ]]
}

start_runtime() { # the registry, containerd with the pause and test images
  start_registry
  # No registry but the node's own is reachable, and none may be tried: every other pull goes to a
  # closed local port.
  HTTP_PROXY=http://127.0.0.1:9 HTTPS_PROXY=http://127.0.0.1:9 NO_PROXY="${NODE_GATEWAY}" \
    launch_exe containerd "$(command -v containerd)" --config "${CTRD_DIR}/config.toml"
  wait_for "containerd" containerd ctr_ version
  import_images
}

start_node_agents() { # the API forwarder, CoreDNS, the kubelet, kube-proxy
  # Pods reach the API server (127.0.0.1 only) through this TCP forwarder on the bridge.
  launch_exe api-forward "$(command -v socat)" \
    "TCP-LISTEN:${API_PORT},bind=${NODE_GATEWAY},reuseaddr,fork" "TCP:127.0.0.1:${API_PORT}"
  apply_cluster_objects
  launch coredns -conf "${NODE_DIR}/Corefile"
  launch kubelet --config="${NODE_DIR}/kubelet.yaml" \
    --kubeconfig="${NODE_DIR}/node.kubeconfig" \
    --hostname-override="${NODE_NAME}" --node-ip="${NODE_GATEWAY}" \
    --root-dir="${NODE_DIR}/kubelet" --cert-dir="${NODE_DIR}/kubelet/pki" \
    --node-labels=rljob.io/e2e-node=real --v=1
  launch kube-proxy --config="${NODE_DIR}/kube-proxy.yaml" --v=1
}

# A node killed without its stop (the machine's processes killed, a test run cut off) leaves
# its bridge behind, which would bar every later node. If none of the owner's processes runs,
# stop that node from its own state folder (or, if the folder is gone, remove its network).
take_over_stale_bridge() {
  local owner c
  owner="$(bridge_owner)"
  for c in "${NODE_COMPONENTS[@]}"; do
    if (STATE="${owner}" PIDS="${owner}/pids" && pid_of "${c}" >/dev/null); then
      die "another real node runs on this machine (bridge ${BRIDGE}, state '${owner}', its ${c} runs); stop it first"
    fi
  done
  log "node: bridge ${BRIDGE} of '${owner}' is stale (none of its processes runs): stopping that node first"
  if [[ -d "${owner}/node" ]]; then
    RLJOB_E2E_STATE="${owner}" bash "${BASH_SOURCE[0]}" stop || log "node: stopping '${owner}' failed; removing its network"
  fi
  (STATE="${owner}" && teardown_network)
  if ip link show "${BRIDGE}" >/dev/null 2>&1; then die "bridge ${BRIDGE} of '${owner}' could not be removed"; fi
}

cmd_start() {
  local gaps t0 c
  gaps="$(missing)"
  [[ -z "${gaps}" ]] || die "cannot run a real node on this machine; missing: $(tr '\n' ';' <<<"${gaps}")"
  load_ports
  kc get --raw /readyz >/dev/null 2>&1 || die "the cluster of ${STATE} is not ready: run e2e/cluster.sh start"
  if ip link show "${BRIDGE}" >/dev/null 2>&1 && [[ "$(bridge_owner)" != "${STATE}" ]]; then
    take_over_stale_bridge
  fi
  for c in "${NODE_COMPONENTS[@]}"; do
    if pid_of "${c}" >/dev/null; then die "${c} already runs from ${STATE}: run e2e/node.sh stop first"; fi
  done
  [[ -d "${NODE_DIR}" ]] && cmd_stop # leftovers of an earlier node of this state folder
  t0="$(e2e_now)"
  rm -rf "${NODE_DIR}"
  mkdir -p "${NODE_DIR}" "${CTRD_DIR}"
  pick_node_ports
  save_host_state
  setup_network
  setup_cgroups
  node_pki
  write_containerd_config
  write_registry_config
  write_cni_config
  write_kubelet_config
  write_kube_proxy_config
  write_corefile
  start_runtime
  start_node_agents
  wait_for "CoreDNS /ready" coredns curl -fsS "http://127.0.0.1:${DNS_READY_PORT}/ready"
  wait_for "node ${NODE_NAME} Ready" kubelet node_ready
  # healthy once it has written the rules for the node's Services (it waits for the Node first)
  wait_for "kube-proxy /healthz" kube-proxy curl -fsS "http://127.0.0.1:${PROXY_HEALTHZ_PORT}/healthz"
  log "node ${NODE_NAME} Ready after $(e2e_since "${t0}") (taint rljob.io/e2e-real-node=true:NoSchedule)"
}

cmd_stop() {
  [[ -d "${NODE_DIR}" ]] || return 0
  local t0 ours=1
  t0="$(e2e_now)"
  if ip link show "${BRIDGE}" >/dev/null 2>&1 && [[ "$(bridge_owner)" != "${STATE}" ]]; then
    ours=0 # another state folder's node runs now: leave the host's network to it
  fi
  stop_all kube-proxy kubelet
  kill_containers
  stop_all containerd
  kill_shims
  kill_cgroup_leftovers
  unmount_under "${NODE_DIR}"
  stop_all coredns api-forward registry
  if ((ours)); then
    "${E2E_BIN}/kube-proxy" --cleanup >"${LOGS}/kube-proxy-cleanup.log" 2>&1 || true
    teardown_network
  fi
  teardown_cgroups
  restore_host_state
  log "node ${NODE_NAME} stopped in $(e2e_since "${t0}")"
}

cmd_status() {
  local c pid ok=0
  for c in "${NODE_COMPONENTS[@]}"; do
    if pid="$(pid_of "${c}")"; then
      printf '%-24s running (pid %s)\n' "${c}" "${pid}"
    else
      printf '%-24s NOT RUNNING\n' "${c}"
      ok=1
    fi
  done
  if [[ -f "${STATE}/ports.env" ]] && node_ready; then
    printf '%-24s Ready\n' "node/${NODE_NAME}"
  else
    printf '%-24s NOT READY\n' "node/${NODE_NAME}"
    ok=1
  fi
  return "${ok}"
}

case "${1:-}" in
  check)
    gaps="$(missing)"
    [[ -z "${gaps}" ]] || { echo "${gaps}"; exit 1; }
    ;;
  start) cmd_start ;;
  stop) cmd_stop ;;
  status) cmd_status ;;
  *)
    echo "usage: $0 check|start|stop|status" >&2
    exit 2
    ;;
esac
