#!/usr/bin/env bash
# Push the images e2e/images.sh built to a registry, with the project's version tag
# (pyproject.toml's version, the chart's appVersion and the CRD's default worker tag):
#
#   e2e/images-push.sh REGISTRY [IMAGE...]     IMAGE: operator worker worker-test rollout-vllm-test environment-ts
#                                              (default: operator worker)
#
# REGISTRY is host[:port]/path, e.g. ghcr.io/rljob, so rljob-operator goes to
# ghcr.io/rljob/rljob-operator:<version> (the chart's and the CRD's defaults with REGISTRY=ghcr.io/rljob).
# Credentials are buildah's: `buildah login REGISTRY` first, or REGISTRY_AUTH_FILE naming an auth.json.
# RLJOB_REGISTRY_CERT_DIR: a folder with the registry's CA (ca.crt), for a registry with a private CA.
# Prints one "image digest" line per image pushed. `make images REGISTRY=... PUSH=1` calls it.
set -euo pipefail

# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPO="$(cd "${E2E_DIR}/.." && pwd)"
IMG="${E2E_CACHE}/images"

log() { echo "images-push: $*" >&2; }
die() { log "$*"; exit 1; }
bah() { buildah --root "${IMG}/storage" --runroot "${IMG}/run" --storage-driver vfs "$@"; }

(($# >= 1)) || die "usage: $0 REGISTRY [operator|worker|worker-test|rollout-vllm-test|environment-ts]..."
registry="${1%/}"
shift
[[ "${registry}" =~ ^[a-z0-9.-]+(:[0-9]+)?(/[a-z0-9._/-]+)?$ ]] ||
  die "REGISTRY '${registry}': expected host[:port]/path, e.g. ghcr.io/rljob"
version="$(sed -n 's/^version = "\(.*\)"$/\1/p' "${REPO}/pyproject.toml" | head -n1)"
[[ -n "${version}" ]] || die "no version in ${REPO}/pyproject.toml"
eval "$(bash "${E2E_DIR}/images.sh" env)"
eval "$(bash "${E2E_DIR}/images-environment-ts.sh" env)"

push_args=()
[[ -n "${RLJOB_REGISTRY_CERT_DIR:-}" ]] && push_args+=(--cert-dir "${RLJOB_REGISTRY_CERT_DIR}")

push_one() { # name archive
  local name="$1" archive="$2" target id digest kept
  [[ -s "${archive}" ]] || die "${name}: ${archive} is not built (make images)"
  target="${registry}/${name}:${version}"
  kept="$(bah images --quiet --no-trunc | sort)"
  id="$(bah pull --quiet "oci-archive:${archive}")"
  bah push --quiet "${push_args[@]}" --digestfile "${IMG}/.push-digest" "${id}" "docker://${target}"
  digest="$(cat "${IMG}/.push-digest")"
  rm -f "${IMG}/.push-digest"
  # leave buildah's storage as it was: the operator and the full worker live there as archives only
  grep -qF "${id#sha256:}" <<<"${kept}" || bah rmi "${id}" >/dev/null
  echo "${target} ${digest}"
}

images=("$@")
((${#images[@]})) || images=(operator worker)
for image in "${images[@]}"; do
  case "${image}" in
    operator) push_one rljob-operator "${RLJOB_E2E_OPERATOR_ARCHIVE}" ;;
    worker) push_one rljob-worker "${RLJOB_E2E_WORKER_ARCHIVE}" ;;
    worker-test) push_one rljob-worker-test "${RLJOB_E2E_WORKER_TEST_ARCHIVE}" ;;
    rollout-vllm-test) push_one rljob-rollout-vllm-test "${RLJOB_E2E_ROLLOUT_VLLM_TEST_ARCHIVE}" ;;
    environment-ts) push_one rljob-environment-ts "${RLJOB_E2E_ENVIRONMENT_TS_ARCHIVE}" ;;
    *) die "unknown image '${image}': operator, worker, worker-test, rollout-vllm-test or environment-ts" ;;
  esac
done
