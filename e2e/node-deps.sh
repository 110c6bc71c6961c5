#!/usr/bin/env bash
# Debian packages the real e2e node needs (e2e/node.sh): the container runtime, the CNI
# plugins, the tools kube-proxy and the node scripts call, and a static busybox for the
# locally made pause and test images. Idempotent: runs apt-get (update, then install) only
# when a command is missing. Needs root and apt; elsewhere it says what is missing and
# exits 0, so CI on a machine without them still runs the rest (the real-node test then
# skips, naming what is missing).
#
#   e2e/node-deps.sh          install what is missing
#   e2e/node-deps.sh check    exit 0 only if everything is there
set -euo pipefail

# command (or file) that must exist -> Debian package that provides it
DEPS=(
  "containerd=containerd"
  "ctr=containerd"
  "runc=runc"
  "/usr/lib/cni/bridge=containernetworking-plugins"
  "/usr/lib/cni/host-local=containernetworking-plugins"
  "/usr/lib/cni/loopback=containernetworking-plugins"
  "iptables=iptables"
  "ip6tables=iptables"
  "conntrack=conntrack"
  "ip=iproute2"
  "socat=socat"
  "htpasswd=apache2-utils"
  "/bin/busybox=busybox-static"
)

have() { # command or absolute path
  if [[ "$1" == /* ]]; then [[ -x "$1" ]]; else command -v "$1" >/dev/null 2>&1; fi
}

# busybox-static (not the dynamic busybox): the images have no libc.
busybox_is_static() { have /bin/busybox && ! LC_ALL=C ldd /bin/busybox >/dev/null 2>&1; }

missing_packages() {
  local dep what pkg
  for dep in "${DEPS[@]}"; do
    what="${dep%%=*}"
    pkg="${dep#*=}"
    have "${what}" || echo "${pkg}"
  done
  busybox_is_static || echo busybox-static
}

main() {
  local missing
  missing="$(missing_packages | sort -u | tr '\n' ' ')"
  if [[ -z "${missing// /}" ]]; then
    echo "node deps: all present"
    return 0
  fi
  if [[ "${1:-}" == check ]]; then
    echo "node deps missing: ${missing}" >&2
    return 1
  fi
  if [[ "$(id -u)" != 0 ]] || ! have apt-get; then
    echo "node deps missing (${missing}) and cannot install them (needs root and apt-get); the real-node test will skip" >&2
    return 0
  fi
  echo "node deps: installing ${missing}"
  export DEBIAN_FRONTEND=noninteractive
  apt-get update -qq
  # shellcheck disable=SC2086 # a list of package names
  apt-get install -y -qq --no-install-recommends ${missing} >/dev/null
  missing="$(missing_packages | sort -u | tr '\n' ' ')"
  [[ -z "${missing// /}" ]] || { echo "node deps still missing after apt-get: ${missing}" >&2; return 1; }
  echo "node deps: installed"
}

main "$@"
