# shellcheck shell=bash
# Shared by e2e/cluster.sh and e2e/node.sh: the state folder, the network plan, logging,
# processes started by pid, ports, certificates and kubeconfigs. Source it after lib.sh.
# shellcheck disable=SC2034 # the variables are used by the scripts that source this file

# resolved: the node unmounts what lies under it by its real path (a symlinked path would miss them)
STATE="$(realpath -m "${RLJOB_E2E_STATE:-/tmp/rljob-e2e}")"
PKI="${STATE}/pki"
LOGS="${STATE}/logs"
PIDS="${STATE}/pids"
KUBECONFIG_FILE="${STATE}/kubeconfig"
TIMEOUT="${RLJOB_E2E_TIMEOUT:-120}"
MARKER=".rljob-e2e-state"
COMPONENTS=(etcd kube-apiserver kube-controller-manager kube-scheduler kwok kuberay-operator)

# Network plan, all inside the benchmarking range 198.18.0.0/15 (RFC 2544), which no real
# network here uses; nothing of it is routed off this machine (see e2e/node.sh).
CLUSTER_CIDR="198.18.0.0/16"     # pods: kube-proxy's cluster CIDR
NODE_POD_CIDR="198.18.0.0/24"    # the real node's bridge (e2e/node.sh)
NODE_GATEWAY="198.18.0.1"        # the bridge's address: the node's InternalIP, API and DNS for pods
KWOK_POD_CIDR="198.18.128.1/17"  # kwok's fake pod IPs (never routed)
KWOK_NODE_IP="198.18.127.254"    # every fake node's InternalIP (never routed)
SERVICE_CIDR="198.19.0.0/16"
SERVICE_API_IP="198.19.0.1"      # the "kubernetes" Service: the first IP of SERVICE_CIDR
SERVICE_DNS_IP="198.19.0.10"     # the "kube-dns" Service (CoreDNS on the real node)

log() { printf '[cluster %s] %s\n' "$(date +%H:%M:%S)" "$*" >&2; }
die() {
  log "ERROR: $*"
  exit 1
}

kc() { "${E2E_BIN}/kubectl" --kubeconfig "${KUBECONFIG_FILE}" "$@"; }

# ---------------------------------------------------------------- processes
pid_of() { # component -> pid if it runs and is ours
  local f="${PIDS}/$1.pid" pid
  [[ -f "${f}" ]] || return 1
  pid="$(cat "${f}")"
  [[ -r "/proc/${pid}/cmdline" ]] || return 1
  # guard against a reused pid: the process must run the binary we started (from the bin
  # folder recorded at start, which outlives a later change of the versions hash)
  # (or, for a program not built by us, the executable recorded by launch_exe)
  local bin="${E2E_BIN}" exe
  [[ -f "${STATE}/bin" ]] && bin="$(cat "${STATE}/bin")"
  exe="${bin}/$1"
  [[ -f "${PIDS}/$1.exe" ]] && exe="$(cat "${PIDS}/$1.exe")"
  tr '\0' ' ' <"/proc/${pid}/cmdline" | grep -qF "${exe} " || return 1
  echo "${pid}"
}

launch() { # component args...  (a binary we built: ${E2E_BIN}/component)
  launch_exe "$1" "${E2E_BIN}/$1" "${@:2}"
}

launch_exe() { # component executable args...
  local name="$1" exe="$2"
  shift 2
  [[ "${exe}" == "${E2E_BIN}/${name}" ]] || echo "${exe}" >"${PIDS}/${name}.exe"
  # setsid: own session and process group, so the component survives this script, ignores
  # its terminal, and stop_all can signal it together with any children it forked.
  setsid "${exe}" "$@" >"${LOGS}/${name}.log" 2>&1 </dev/null &
  local pid=$!
  echo "${pid}" >"${PIDS}/${name}.pid"
  wait_exec "${pid}" "${exe}"
  log "${name} started (pid ${pid}, log ${LOGS}/${name}.log)"
}

wait_exec() { # pid exe : until the forked child runs exe (or has exited)
  # Until its exec, the child runs this script's command line, and pid_of would call a component
  # that a loaded machine is slow to start dead. Within the exec its command line reads empty until the
  # kernel has set up the new image's arguments, which takes a while for a large binary
  # (kube-controller-manager) under load: that is no death either. Only a zombie or a gone pid has exited.
  local pid="$1" exe="$2" cmdline deadline=$((SECONDS + TIMEOUT))
  while ((SECONDS <= deadline)); do
    [[ "$(process_state "${pid}")" =~ ^(Z|X|)$ ]] && return 0 # exited: alive/pid_of will say so, with its log
    cmdline="$(tr '\0' ' ' <"/proc/${pid}/cmdline" 2>/dev/null)" || return 0
    # Its own command line starts with exe: `setsid exe ...` holds it too, and setsid's exec of exe follows
    # (an empty command line then, which pid_of took for a death: CI's "kuberay-operator exited (runs: )").
    [[ "${cmdline}" == "${exe} "* ]] && return 0
    sleep 0.05
  done
}

process_state() { # pid -> its state letter (R, S, Z, ...), empty when it is gone
  sed -n 's/^.*) \([A-Za-z]\).*$/\1/p' "/proc/$1/stat" 2>/dev/null || true
}

wait_for() { # what component command... (component: the process that must stay alive, or -)
  local what="$1" comp="$2" t0 deadline
  shift 2
  t0="$(e2e_now)"
  deadline=$((SECONDS + TIMEOUT))
  until "$@" >/dev/null 2>&1; do
    [[ "${comp}" == - ]] || alive "${comp}"
    if ((SECONDS > deadline)); then
      die "timed out after ${TIMEOUT}s waiting for ${what}"
    fi
    sleep 0.5
  done
  log "${what}: ok after $(e2e_since "${t0}")"
}

alive() {
  pid_of "$1" >/dev/null && return 0
  die "$1 exited ($(how_it_ended "$1")); see ${LOGS}/$1.log: $(tail -n 5 "${LOGS}/$1.log")"
}

how_it_ended() { # component -> its exit status where this shell launched it, else what holds its pid
  local pid code
  pid="$(cat "${PIDS}/$1.pid" 2>/dev/null)" || { echo "no pid file"; return; }
  if [[ ! "$(process_state "${pid}")" =~ ^(Z|X|)$ ]]; then
    echo "pid ${pid} runs: $(tr '\0' ' ' <"/proc/${pid}/cmdline" | cut -c1-200)" # not ours, or not exec'd yet
    return
  fi
  # a component gone at once with an empty log: its status tells a signal (128+N)
  wait "${pid}" 2>/dev/null && code=0 || code=$?
  if ((code == 127)); then echo "pid ${pid} gone, not this shell's child"; else echo "exit status ${code}"; fi
}

stop_all() { # components... : TERM them together, wait up to 10s, then KILL what is left
  local name pid i pids=() names=()
  for name in "$@"; do
    if pid="$(pid_of "${name}")"; then
      # its process group (launch_exe made it a group leader): forked children go too
      kill -TERM -- "-${pid}" 2>/dev/null || kill -TERM "${pid}" 2>/dev/null || true
      pids+=("${pid}")
      names+=("${name}")
    fi
    rm -f "${PIDS}/${name}.pid" "${PIDS}/${name}.exe"
  done
  for ((i = 0; i < ${#pids[@]}; i++)); do
    local j
    for ((j = 0; j < 100; j++)); do
      [[ -d "/proc/${pids[i]}" ]] || break
      sleep 0.1
    done
    if [[ -d "/proc/${pids[i]}" ]]; then
      kill -KILL -- "-${pids[i]}" 2>/dev/null || kill -KILL "${pids[i]}" 2>/dev/null || true
      log "${names[i]} (pid ${pids[i]}) killed"
    else
      log "${names[i]} (pid ${pids[i]}) stopped"
    fi
  done
}

# ---------------------------------------------------------------- ports
free_ports() { # n -> n free TCP ports on 127.0.0.1, all held at once while picking
  python3 - "$1" <<'PY'
import socket, sys
socks = []
for _ in range(int(sys.argv[1])):
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    socks.append(s)
print(" ".join(str(s.getsockname()[1]) for s in socks))
PY
}

load_ports() {
  [[ -f "${STATE}/ports.env" ]] || die "no cluster state in ${STATE}: run e2e/cluster.sh start"
  # shellcheck source=/dev/null
  . "${STATE}/ports.env"
}

# ---------------------------------------------------------------- certificates
gen_key() { openssl genpkey -algorithm RSA -pkeyopt rsa_keygen_bits:2048 -out "$1" 2>/dev/null; }

sign_cert() { # name subject extensions
  local name="$1" subj="$2" ext="$3"
  gen_key "${PKI}/${name}.key"
  openssl req -new -key "${PKI}/${name}.key" -subj "${subj}" -out "${PKI}/${name}.csr" 2>/dev/null
  printf '%s\n' "${ext}" >"${PKI}/${name}.ext"
  openssl x509 -req -in "${PKI}/${name}.csr" -CA "${PKI}/ca.crt" -CAkey "${PKI}/ca.key" \
    -CAcreateserial -days 365 -sha256 -extfile "${PKI}/${name}.ext" \
    -out "${PKI}/${name}.crt" 2>/dev/null
  rm -f "${PKI}/${name}.csr" "${PKI}/${name}.ext"
}

write_kubeconfig() { # file user
  cat >"$1" <<EOF
apiVersion: v1
kind: Config
clusters:
- name: rljob-e2e
  cluster:
    server: https://127.0.0.1:${API_PORT}
    certificate-authority: ${PKI}/ca.crt
users:
- name: $2
  user:
    client-certificate: ${PKI}/$2.crt
    client-key: ${PKI}/$2.key
contexts:
- name: rljob-e2e
  context:
    cluster: rljob-e2e
    user: $2
current-context: rljob-e2e
EOF
}
