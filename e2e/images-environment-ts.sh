#!/usr/bin/env bash
# The TypeScript environment server of examples/environment-server-ts as an image of its own, for the real
# node's `kind: image` environment (tests/operator/test_e2e_real_environments.py): the server built here with
# npm ci and tsc as its README says, then examples/environment-server-ts/Dockerfile run by buildah on a local
# stand-in for node:<version>-bookworm-slim made with mmdebstrap (Debian bookworm's nodejs). Written as an OCI
# archive, cached by the hash of its inputs.
#
#   e2e/images-environment-ts.sh [build]   build it (needs root, buildah, mmdebstrap, node and npm)
#   e2e/images-environment-ts.sh check     exit 0 only if it is built
#   e2e/images-environment-ts.sh env       RLJOB_E2E_ENVIRONMENT_TS_* lines (image name, archive) for eval
set -euo pipefail

# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPO="$(cd "${E2E_DIR}/.." && pwd)"
IMG="${E2E_CACHE}/images"
EXAMPLE=examples/environment-server-ts
NODE_SUITE=bookworm
NODE_PACKAGES=nodejs,ca-certificates
MIRROR="${RLJOB_IMAGES_MIRROR:-http://deb.debian.org/debian}"
SECURITY="${RLJOB_IMAGES_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
EPOCH=1700000000

log() { echo "images-environment-ts: $*" >&2; }
die() { log "$*"; exit 1; }
bah() { buildah --root "${IMG}/storage" --runroot "${IMG}/run" --storage-driver vfs "$@"; }
short() { sha256sum | cut -c1-12; }

# Bump the "v1"s when a recipe here changes.
NODE_HASH="$(echo "${NODE_SUITE} ${NODE_PACKAGES} v1" | short)"
TS_HASH="$(
  cd "${REPO}" && {
    echo "${NODE_HASH} v1"
    find "${EXAMPLE}" proto/rljob -type f ! -path '*/node_modules/*' ! -path '*/dist/*' | LC_ALL=C sort | xargs sha256sum
  } | short
)"
TS_DIR="${IMG}/environment-ts-${TS_HASH}"
IMAGE="rljob.e2e/rljob-environment-ts:${TS_HASH}"
ARCHIVE="${TS_DIR}/environment-ts.tar"

# Debian bookworm minbase with its nodejs, in buildah's storage as localhost/rljob-node-base:<hash>.
node_base() {
  local ref="localhost/rljob-node-base:${NODE_HASH}" tar="${IMG}/node-base-${NODE_HASH}.tar" c
  bah inspect --type image "${ref}" >/dev/null 2>&1 && { echo "${ref}"; return 0; }
  if [[ ! -s "${tar}" ]]; then
    log "node base: mmdebstrap ${NODE_SUITE} (${NODE_PACKAGES})"
    SOURCE_DATE_EPOCH="${EPOCH}" mmdebstrap --quiet --format=tar --variant=minbase --include="${NODE_PACKAGES}" \
      "${NODE_SUITE}" "${tar%.tar}.tmp.tar" \
      "deb ${MIRROR} ${NODE_SUITE} main" "deb ${MIRROR} ${NODE_SUITE}-updates main" \
      "deb ${SECURITY} ${NODE_SUITE}-security main" >&2
    mv "${tar%.tar}.tmp.tar" "${tar}"
  fi
  c="$(bah from scratch)"
  bah add --quiet "${c}" "${tar}" / >/dev/null
  bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 "${c}"
  bah commit --quiet --timestamp "${EPOCH}" --rm "${c}" "${ref}" >/dev/null
  echo "${ref}"
}

# The build context the Dockerfile expects, the server built in it: npm ci, tsc, the dev packages pruned.
context() { # dir
  mkdir -p "$1/${EXAMPLE}" "$1/proto"
  (cd "${REPO}/${EXAMPLE}" && tar -cf - --exclude=node_modules --exclude=dist .) | tar -xf - -C "$1/${EXAMPLE}"
  cp -r "${REPO}/proto/rljob" "$1/proto/"
  (cd "$1/${EXAMPLE}" && npm ci --no-audit --no-fund --loglevel=error && npm run --silent build &&
    npm prune --omit=dev --no-audit --no-fund --loglevel=error) >&2
}

build() {
  [[ -s "${ARCHIVE}" ]] && { log "cached ${ARCHIVE}"; return 0; }
  [[ "$(id -u)" == 0 ]] || die "needs root (buildah chroot isolation, vfs storage, mmdebstrap)"
  for tool in buildah mmdebstrap node npm; do
    command -v "${tool}" >/dev/null 2>&1 || die "${tool} not found"
  done
  local t0 base ctx
  t0="$(e2e_now)"
  mkdir -p "${TS_DIR}"
  base="$(node_base)"
  ctx="$(mktemp -d "${IMG}/ctx-ts.XXXXXX")"
  context "${ctx}"
  bah bud --quiet --isolation chroot --pull=never --timestamp "${EPOCH}" --build-arg "NODE_IMAGE=${base}" \
    -f "${ctx}/${EXAMPLE}/Dockerfile" -t "${IMAGE}" "${ctx}" >/dev/null
  rm -rf "${ctx}"
  rm -f "${ARCHIVE}.tmp"
  bah push --quiet "${IMAGE}" "oci-archive:${ARCHIVE}.tmp:${IMAGE}"
  mv "${ARCHIVE}.tmp" "${ARCHIVE}"
  bah rmi "${IMAGE}" >/dev/null
  log "${IMAGE}: $(du -h "${ARCHIVE}" | cut -f1) in $(e2e_since "${t0}")"
}

case "${1:-build}" in
  build) build ;;
  check) [[ -s "${ARCHIVE}" ]] || { echo "the TypeScript environment image is not built: e2e/images-environment-ts.sh"; exit 1; } ;;
  env)
    echo "export RLJOB_E2E_ENVIRONMENT_TS_IMAGE=${IMAGE}"
    echo "export RLJOB_E2E_ENVIRONMENT_TS_ARCHIVE=${ARCHIVE}"
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
