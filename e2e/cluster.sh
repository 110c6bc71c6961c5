#!/usr/bin/env bash
# A local Kubernetes control plane for the e2e suites, on 127.0.0.1 only:
# etcd, kube-apiserver, kube-controller-manager, kube-scheduler, kwok (fake nodes/pods),
# and, on request, the KubeRay operator with its CRDs and one real node (e2e/node.sh).
#
#   e2e/cluster.sh start      fresh cluster (wipes the previous state folder), waits for /readyz
#   e2e/cluster.sh kuberay    install KubeRay's CRDs and run its operator against the cluster
#   e2e/cluster.sh node       join one real node (kubelet, containerd, kube-proxy, CoreDNS;
#                             needs root): e2e/node.sh start
#   e2e/cluster.sh stop       stop every process this state folder started (state is kept),
#                             the real node's included (and undo its host changes)
#   e2e/cluster.sh clean      stop, then remove the state folder
#   e2e/cluster.sh status     what runs; exit 0 only if all of it runs and the API is ready
#   e2e/cluster.sh env        shell exports: eval "$(e2e/cluster.sh env)"
#
# Environment:
#   RLJOB_E2E_STATE      state folder (default /tmp/rljob-e2e): pki, etcd data, logs, pids, kubeconfig
#   RLJOB_E2E_PORT_BASE  use fixed ports BASE..BASE+6; default: free ports picked at start
#   RLJOB_E2E_CACHE      build cache root (see build.sh); binaries must be built first
#   RLJOB_E2E_TIMEOUT    seconds to wait for readiness (default 120)
set -euo pipefail

# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
# shellcheck source=state.sh
. "$(dirname "${BASH_SOURCE[0]}")/state.sh"

need_binaries() {
  local b
  for b in etcd kube-apiserver kube-controller-manager kube-scheduler kubectl kwok; do
    [[ -x "${E2E_BIN}/${b}" ]] || die "${E2E_BIN}/${b} missing: run e2e/build.sh first"
  done
}

pick_ports() {
  local p
  if [[ -n "${RLJOB_E2E_PORT_BASE:-}" ]]; then
    local b="${RLJOB_E2E_PORT_BASE}"
    p="${b} $((b + 1)) $((b + 2)) $((b + 3)) $((b + 4)) $((b + 5)) $((b + 6))"
  else
    p="$(free_ports 7)"
  fi
  read -r ETCD_PORT ETCD_PEER_PORT API_PORT KCM_PORT SCHED_PORT KWOK_PORT KUBERAY_PORT <<<"${p}"
  cat >"${STATE}/ports.env" <<EOF
ETCD_PORT=${ETCD_PORT}
ETCD_PEER_PORT=${ETCD_PEER_PORT}
API_PORT=${API_PORT}
KCM_PORT=${KCM_PORT}
SCHED_PORT=${SCHED_PORT}
KWOK_PORT=${KWOK_PORT}
KUBERAY_PORT=${KUBERAY_PORT}
EOF
}

make_pki() {
  local t0
  t0="$(e2e_now)"
  mkdir -p "${PKI}"
  gen_key "${PKI}/ca.key"
  openssl req -x509 -new -key "${PKI}/ca.key" -subj "/CN=rljob-e2e-ca" -days 3650 -sha256 \
    -addext "basicConstraints=critical,CA:TRUE" \
    -addext "keyUsage=critical,keyCertSign,cRLSign,digitalSignature" \
    -out "${PKI}/ca.crt" 2>/dev/null
  local client="basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=clientAuth"
  sign_cert apiserver "/CN=kube-apiserver" "basicConstraints=CA:FALSE
keyUsage=critical,digitalSignature,keyEncipherment
extendedKeyUsage=serverAuth
subjectAltName=IP:127.0.0.1,IP:${SERVICE_API_IP},IP:${NODE_GATEWAY},DNS:localhost,DNS:kubernetes,DNS:kubernetes.default,DNS:kubernetes.default.svc,DNS:kubernetes.default.svc.cluster.local"
  sign_cert admin "/O=system:masters/CN=rljob-e2e-admin" "${client}"
  sign_cert controller-manager "/CN=system:kube-controller-manager" "${client}"
  sign_cert scheduler "/CN=system:kube-scheduler" "${client}"
  sign_cert kwok "/O=system:masters/CN=kwok" "${client}"
  sign_cert kuberay "/O=system:masters/CN=kuberay-operator" "${client}"
  # the API server's client certificate towards kubelets (logs, exec, port-forward)
  sign_cert apiserver-kubelet-client "/O=system:masters/CN=kube-apiserver-kubelet-client" "${client}"
  # service-account token signing key pair
  gen_key "${PKI}/sa.key"
  openssl pkey -in "${PKI}/sa.key" -pubout -out "${PKI}/sa.pub" 2>/dev/null
  chmod 600 "${PKI}"/*.key
  log "certificates made with openssl in $(e2e_since "${t0}") (${PKI})"
}

# kwok's built-in stages (copied from the kwok module, as kwokctl uses them): fast node
# initialisation, node heartbeat via Lease, and pods that go Running at once; plus ours from
# e2e/stages/ (pod-ready-resync: a Running pod marked NotReady becomes Ready again, as a kubelet's
# status sync would make it).
write_kwok_config() {
  local dir
  dir="$(cd "${E2E_DIR}/tools/kwok" && e2e_go_env && go mod download -json "sigs.k8s.io/kwok@${KWOK_VERSION}" |
    sed -n 's/^[[:space:]]*"Dir": "\(.*\)",$/\1/p')"
  [[ -d "${dir}" ]] || die "kwok module source not found in the Go module cache"
  # No KwokConfiguration document: with one, kwok v0.8.0 skips its defaults (parallelism 0).
  {
    for f in "${dir}"/kustomize/stage/node/fast/node-initialize.yaml \
      "${dir}"/kustomize/stage/node/heartbeat-with-lease/node-heartbeat-with-lease.yaml \
      "${dir}"/kustomize/stage/pod/fast/pod-ready.yaml \
      "${dir}"/kustomize/stage/pod/fast/pod-complete.yaml \
      "${dir}"/kustomize/stage/pod/fast/pod-delete.yaml \
      "${E2E_DIR}"/stages/*.yaml; do
      echo "---"
      grep -v '^---$' "${f}"
    done
  } >"${STATE}/kwok.yaml"
}

# ---------------------------------------------------------------- commands
start_storage_and_api() { # etcd, then the API server; waits for both
  launch etcd --name=rljob-e2e --data-dir="${STATE}/etcd" \
    --listen-client-urls="http://127.0.0.1:${ETCD_PORT}" \
    --advertise-client-urls="http://127.0.0.1:${ETCD_PORT}" \
    --listen-peer-urls="http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-advertise-peer-urls="http://127.0.0.1:${ETCD_PEER_PORT}" \
    --initial-cluster="rljob-e2e=http://127.0.0.1:${ETCD_PEER_PORT}" \
    --listen-metrics-urls="" --unsafe-no-fsync=true \
    --quota-backend-bytes=$((2 * 1024 * 1024 * 1024))
  wait_for "etcd /health" etcd curl -fsS "http://127.0.0.1:${ETCD_PORT}/health"

  # Admission: the default set (NamespaceLifecycle, LimitRanger, ServiceAccount, Priority,
  # DefaultTolerationSeconds, DefaultStorageClass, ResourceQuota, PodSecurity,
  # MutatingAdmissionWebhook, ValidatingAdmissionPolicy, ValidatingAdmissionWebhook, ...)
  # plus NodeRestriction, and OwnerReferencesPermissionEnforcement (an ownerReference with
  # blockOwnerDeletion needs update on the owner's finalizers, as on OpenShift). CRD validation with CEL
  # (x-kubernetes-validations) is GA, always on.
  # Endpoint reconciler "none": the default refuses a loopback advertise address; the real
  # node (e2e/node.sh) points the "kubernetes" Service at its own forwarder instead.
  # Audit: every request of the operator's ServiceAccount (the chart installs it in rljob-system), so a
  # test can compare what the operator does with what the chart grants (tests/operator/audit.py).
  cat >"${STATE}/audit-policy.yaml" <<'POLICY'
apiVersion: audit.k8s.io/v1
kind: Policy
omitStages: [RequestReceived]
rules:
  - level: Metadata
    userGroups: ["system:serviceaccounts:rljob-system"]
  - level: None
POLICY
  launch kube-apiserver \
    --audit-policy-file="${STATE}/audit-policy.yaml" --audit-log-path="${STATE}/audit.log" \
    --audit-log-maxsize=200 --audit-log-maxbackup=1 \
    --etcd-servers="http://127.0.0.1:${ETCD_PORT}" \
    --bind-address=127.0.0.1 --advertise-address=127.0.0.1 --secure-port="${API_PORT}" \
    --tls-cert-file="${PKI}/apiserver.crt" --tls-private-key-file="${PKI}/apiserver.key" \
    --client-ca-file="${PKI}/ca.crt" \
    --service-account-issuer=https://kubernetes.default.svc.cluster.local \
    --service-account-key-file="${PKI}/sa.pub" \
    --service-account-signing-key-file="${PKI}/sa.key" \
    --service-cluster-ip-range="${SERVICE_CIDR}" \
    --kubelet-client-certificate="${PKI}/apiserver-kubelet-client.crt" \
    --kubelet-client-key="${PKI}/apiserver-kubelet-client.key" \
    --kubelet-preferred-address-types=InternalIP,Hostname \
    --authorization-mode=Node,RBAC \
    --enable-admission-plugins=NodeRestriction,OwnerReferencesPermissionEnforcement \
    --endpoint-reconciler-type=none \
    --allow-privileged=true \
    --profiling=false \
    --event-ttl=1h
  wait_for "kube-apiserver /readyz" kube-apiserver kc get --raw /readyz
  alive etcd
}

# Node heartbeats: a real kubelet renews its own node's Lease every 10 s; here one kwok process renews
# the Leases of every fake node, four at a time. At kwok's default pace (every 40/4 = 10 s) the scale
# test's 1,000 nodes are 100 Lease writes a second, more than a busy machine of few cores serves: renewals
# fall behind, the node lifecycle controller taints the nodes unreachable after its grace period, and
# pods stay Pending. So kwok renews every 240/4 = 60 s (17 writes a second) and a node counts as lost
# after 5 minutes without a renewal, not 50 s. A new node gets the same 5 minutes for its first Lease:
# with the default 1 minute, the scale test's nodes whose first Lease comes late are tainted unreachable
# at once. No test loses a node through its heartbeat: test_reward_node_lost_and_back deletes the Node.
start_controllers() { # controller-manager, scheduler, kwok (waited for by cmd_start)
  launch kube-controller-manager \
    --node-monitor-grace-period=5m --node-startup-grace-period=5m \
    --kubeconfig="${STATE}/controller-manager.kubeconfig" \
    --authentication-kubeconfig="${STATE}/controller-manager.kubeconfig" \
    --authorization-kubeconfig="${STATE}/controller-manager.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="${KCM_PORT}" \
    --service-account-private-key-file="${PKI}/sa.key" \
    --root-ca-file="${PKI}/ca.crt" \
    --cluster-signing-cert-file="${PKI}/ca.crt" --cluster-signing-key-file="${PKI}/ca.key" \
    --use-service-account-credentials=true \
    --controllers='*' \
    --enable-garbage-collector=true \
    --service-cluster-ip-range="${SERVICE_CIDR}" \
    --leader-elect=false
  launch kube-scheduler \
    --kubeconfig="${STATE}/scheduler.kubeconfig" \
    --authentication-kubeconfig="${STATE}/scheduler.kubeconfig" \
    --authorization-kubeconfig="${STATE}/scheduler.kubeconfig" \
    --bind-address=127.0.0.1 --secure-port="${SCHED_PORT}" \
    --leader-elect=false
  launch kwok \
    --kubeconfig="${STATE}/kwok.kubeconfig" \
    --config="${STATE}/kwok.yaml" \
    --manage-all-nodes=false \
    --manage-nodes-with-annotation-selector=kwok.x-k8s.io/node=fake \
    --node-lease-duration-seconds=240 \
    --cidr="${KWOK_POD_CIDR}" --node-ip="${KWOK_NODE_IP}" \
    --server-address="127.0.0.1:${KWOK_PORT}"
}

cmd_start() {
  need_binaries
  local c t0
  for c in "${COMPONENTS[@]}"; do
    if pid_of "${c}" >/dev/null; then
      die "${c} already runs from ${STATE}: run e2e/cluster.sh stop first"
    fi
  done
  # a real node left from an earlier start holds mounts and host settings: undo them first
  if [[ -f "${STATE}/${MARKER}" && -d "${STATE}/node" ]]; then bash "${E2E_DIR}/node.sh" stop; fi
  if [[ -e "${STATE}" ]]; then
    if [[ -f "${STATE}/${MARKER}" ]]; then
      rm -rf "${STATE}"
    elif [[ -n "$(ls -A "${STATE}")" ]]; then
      die "${STATE} exists, is not empty and is not an e2e state folder; refusing to wipe it"
    fi
  fi
  t0="$(e2e_now)"
  mkdir -p "${STATE}" "${LOGS}" "${PIDS}" "${STATE}/etcd"
  touch "${STATE}/${MARKER}"
  echo "${E2E_BIN}" >"${STATE}/bin"
  pick_ports
  make_pki
  write_kubeconfig "${KUBECONFIG_FILE}" admin
  write_kubeconfig "${STATE}/controller-manager.kubeconfig" controller-manager
  write_kubeconfig "${STATE}/scheduler.kubeconfig" scheduler
  write_kubeconfig "${STATE}/kwok.kubeconfig" kwok
  write_kubeconfig "${STATE}/kuberay.kubeconfig" kuberay
  write_kwok_config

  start_storage_and_api
  start_controllers
  wait_for "kube-controller-manager /healthz" kube-controller-manager curl -fsSk "https://127.0.0.1:${KCM_PORT}/healthz"
  wait_for "kube-scheduler /healthz" kube-scheduler curl -fsSk "https://127.0.0.1:${SCHED_PORT}/healthz"
  wait_for "kwok /healthz" kwok curl -fsS "http://127.0.0.1:${KWOK_PORT}/healthz"
  # Pods can be created once the service-account controller made the default account.
  wait_for "default ServiceAccount" kube-controller-manager kc -n default get serviceaccount default
  alive kube-apiserver
  log "cluster up in $(e2e_since "${t0}"): kubeconfig ${KUBECONFIG_FILE}"
  log "use: eval \"\$(e2e/cluster.sh env)\""
}

cmd_kuberay() {
  load_ports
  [[ -x "${E2E_BIN}/kuberay-operator" ]] || die "kuberay-operator not built: run e2e/build.sh"
  local t0 crds="${E2E_OUT}/crds/kuberay"
  t0="$(e2e_now)"
  # The ray.io CRDs are too large for client-side apply's last-applied annotation.
  kc apply --server-side --force-conflicts -f "${crds}" >/dev/null
  for f in "${crds}"/ray.io_*.yaml; do
    kc wait --for=condition=Established --timeout=60s -f "${f}" >/dev/null
  done
  log "KubeRay CRDs established: $(cd "${crds}" && printf '%s ' ray.io_*.yaml)"
  if ! pid_of kuberay-operator >/dev/null; then
    KUBECONFIG="${STATE}/kuberay.kubeconfig" launch kuberay-operator \
      --metrics-addr=0 \
      --health-probe-bind-address="127.0.0.1:${KUBERAY_PORT}" \
      --enable-leader-election=false
  fi
  wait_for "kuberay-operator /readyz" kuberay-operator curl -fsS "http://127.0.0.1:${KUBERAY_PORT}/readyz"
  log "KubeRay ready in $(e2e_since "${t0}")"
}

cmd_stop() {
  [[ -d "${PIDS}" ]] || {
    log "nothing started from ${STATE}"
    return 0
  }
  # the real node first (it drains its pods through the API server), if one was started
  if [[ -d "${STATE}/node" ]]; then bash "${E2E_DIR}/node.sh" stop; fi
  # clients first, then the API server, then its storage
  stop_all kuberay-operator kwok kube-scheduler kube-controller-manager
  stop_all kube-apiserver
  stop_all etcd
}

cmd_status() {
  local c pid ok=0
  for c in "${COMPONENTS[@]}"; do
    if pid="$(pid_of "${c}")"; then
      printf '%-24s running (pid %s)\n' "${c}" "${pid}"
    elif [[ "${c}" == kuberay-operator ]]; then
      printf '%-24s not started\n' "${c}"
    else
      printf '%-24s NOT RUNNING\n' "${c}"
      ok=1
    fi
  done
  if [[ -f "${STATE}/ports.env" ]] && kc get --raw /readyz >/dev/null 2>&1; then
    printf '%-24s ready (https://127.0.0.1:%s)\n' "/readyz" "$(sed -n 's/^API_PORT=//p' "${STATE}/ports.env")"
  else
    printf '%-24s NOT READY\n' "/readyz"
    ok=1
  fi
  return "${ok}"
}

cmd_env() {
  cat <<EOF
export KUBECONFIG='${KUBECONFIG_FILE}'
export PATH='${E2E_BIN}':"\${PATH}"
export RLJOB_E2E_STATE='${STATE}'
export RLJOB_E2E_BIN='${E2E_BIN}'
export RLJOB_E2E_KUBERAY_CRDS='${E2E_OUT}/crds/kuberay'
EOF
}

case "${1:-}" in
  start) cmd_start ;;
  kuberay) cmd_kuberay ;;
  stop) cmd_stop ;;
  clean)
    cmd_stop
    if [[ -f "${STATE}/${MARKER}" ]]; then rm -rf "${STATE}"; fi
    ;;
  status)
    cmd_status
    if [[ -d "${STATE}/node" ]]; then bash "${E2E_DIR}/node.sh" status; fi
    ;;
  node) exec bash "${E2E_DIR}/node.sh" start ;;
  env) cmd_env ;;
  *)
    echo "usage: $0 start|kuberay|node|stop|clean|status|env" >&2
    exit 2
    ;;
esac
