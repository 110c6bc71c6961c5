# shellcheck shell=bash
# Shared by e2e/build.sh and e2e/cluster.sh: pinned versions, the versions hash, cache paths.
# Source it; it sets E2E_DIR, E2E_CACHE, E2E_HASH, E2E_OUT (the per-hash folder), E2E_BIN.

E2E_DIR="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
E2E_CACHE="${RLJOB_E2E_CACHE:-${HOME}/.cache/rljob/e2e}"

# shellcheck source=versions.env
. "${E2E_DIR}/versions.env"
: "${KUBERNETES_VERSION:?}" "${ETCD_VERSION:?}" "${KWOK_VERSION:?}" "${HELM_VERSION:?}" "${KUBERAY_VERSION:?}" "${COREDNS_VERSION:?}" "${REGISTRY_VERSION:?}"

# Tools we build: name, Go module, pinned version. Binaries come from e2e/tools/<name>/go.mod.
E2E_TOOLS=(etcd kube kwok helm kuberay coredns prometheus registry)
e2e_tool_module() {
  case "$1" in
    etcd) echo "go.etcd.io/etcd/server/v3 ${ETCD_VERSION}" ;;
    kube) echo "k8s.io/kubernetes ${KUBERNETES_VERSION}" ;;
    kwok) echo "sigs.k8s.io/kwok ${KWOK_VERSION}" ;;
    helm) echo "helm.sh/helm/v3 ${HELM_VERSION}" ;;
    kuberay) echo "github.com/ray-project/kuberay/ray-operator ${KUBERAY_VERSION}" ;;
    coredns) echo "github.com/coredns/coredns ${COREDNS_VERSION}" ;;
    prometheus) echo "github.com/prometheus/prometheus ${PROMETHEUS_VERSION}" ;;
    registry) echo "github.com/distribution/distribution/v3 ${REGISTRY_VERSION}" ;;
    *) return 1 ;;
  esac
}

# The versions hash: versions.env's KEY=value lines (not its comments) plus the wrapper
# modules generated from it and their own Go sources (tools/coredns/main.go).
e2e_hash() {
  (
    cd "${E2E_DIR}" || exit 1
    grep -E '^[A-Z0-9_]+=' versions.env
    for t in "${E2E_TOOLS[@]}"; do
      cat "tools/${t}/go.mod" "tools/${t}/go.sum" "tools/${t}"/*.go 2>/dev/null || true
    done
  ) | sha256sum | cut -c1-12
}

E2E_HASH="$(e2e_hash)"
# shellcheck disable=SC2034 # used by the scripts that source this file
E2E_OUT="${E2E_CACHE}/${E2E_HASH}"
# shellcheck disable=SC2034
E2E_BIN="${E2E_OUT}/bin"

# Go caches shared by every versions hash, so a version bump reuses what it can.
e2e_go_env() {
  export GOMODCACHE="${E2E_CACHE}/go/mod"
  export GOCACHE="${E2E_CACHE}/go/build"
  export GOWORK=off
  export GOTOOLCHAIN=local
  export CGO_ENABLED=0
}

e2e_now() { date +%s.%N; }
e2e_since() { awk -v a="$1" -v b="$(date +%s.%N)" 'BEGIN { printf "%.1fs", b - a }'; }
