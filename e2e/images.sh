#!/usr/bin/env bash
# Build the rljob images here, with no registry and no Docker engine: buildah (a Debian package;
# vfs storage, chroot isolation, run as root, no daemon) executes docker/operator.Dockerfile and
# docker/worker.Dockerfile themselves, on a local stand-in for python:3.11-slim made with
# mmdebstrap (Debian bookworm, whose python3 is 3.11). Each image is written as an OCI archive
# for `ctr -n k8s.io images import`; the pods use them with imagePullPolicy: Never.
#
#   e2e/images.sh [build]          operator image + worker-test image + its environment
#   e2e/images.sh operator         the operator image only
#   e2e/images.sh worker-test      the worker-test image (`--target worker-test`) and its environment
#   e2e/images.sh worker           the full worker image, once per dependency hash, smoke-tested
#   e2e/images.sh rollout-vllm-test  engine vllm's rollout-vllm-test image and its environment (vLLM's
#                                  CPU build, runtimes/vllm/requirements.lock; about 6 GB; `make e2e-real-vllm`)
#   e2e/images.sh check            exit 0 only if what `build` makes is there
#   e2e/images.sh prune            drop all but the newest two deps/src builds (build does this too)
#   e2e/images.sh env              RLJOB_E2E_* lines (image names, archives, environment) for eval
#   e2e/images.sh import [ADDR] [full]  ctr -n k8s.io images import of the operator and worker-test
#                                  archives (and the full worker's) into the containerd at ADDR
#   e2e/images.sh smoke [--read-only] [--mount HOST:PATH]... ARCHIVE CMD...
#                                  import ARCHIVE into a private containerd, run CMD in it
#   e2e/images.sh deps             apt-get install buildah and mmdebstrap (root)
#
# Output: ${RLJOB_E2E_CACHE:-$HOME/.cache/rljob/e2e}/images/ (see e2e/README.md, "Images").
# On a busy machine: nice -n 10 e2e/images.sh
set -euo pipefail

# shellcheck source=lib.sh
. "$(dirname "${BASH_SOURCE[0]}")/lib.sh"
REPO="$(cd "${E2E_DIR}/.." && pwd)"
IMG="${E2E_CACHE}/images"
PYTHON_VERSION=3.11 # the Dockerfiles' ARG PYTHON_VERSION; Debian bookworm's python3
BASE_SUITE=bookworm
BASE_PACKAGES=python3,python3-pip,python3-venv,python-is-python3,ca-certificates,netbase,tzdata
BASE_MIRROR="${RLJOB_IMAGES_MIRROR:-http://deb.debian.org/debian}"
BASE_SECURITY="${RLJOB_IMAGES_SECURITY_MIRROR:-http://deb.debian.org/debian-security}"
EPOCH=1700000000 # file and image times, so one recipe gives one digest where the inputs allow
# The host's CA bundle is mounted over the image's for RUN steps only (pip behind a TLS-inspecting
# proxy); it replaces an existing file, so nothing of it is committed. Empty: no mount.
BUILD_CA="${RLJOB_IMAGES_CA-/etc/ssl/certs/ca-certificates.crt}"
VENV=/opt/rljob/venv # where the worker-test pods mount their environment

log() { echo "images: $*" >&2; }
die() { log "$*"; exit 1; }
bah() { buildah --root "${IMG}/storage" --runroot "${IMG}/run" --storage-driver vfs "$@"; }

# ---------------------------------------------------------------- hashes
sha_files() { (cd "${REPO}" && sha256sum "$@"); }
short() { sha256sum | cut -c1-12; }

# The hashes cover the recipes' inputs, not this script: bump a "v1" below when a recipe here changes.
# The base: its recipe only (a rebuild later may get newer Debian security updates).
base_hash() { echo "${BASE_SUITE} ${BASE_PACKAGES} ${PYTHON_VERSION} v1" | short; }

# pyproject.toml's dependency tables alone: a change to its tool settings (pytest, ruff) or scripts is the
# rljob package's (src_hash), and would rebuild the 6 GB environment for nothing.
pyproject_deps() {
  (cd "${REPO}" && python3 -c 'import json, sys, tomllib
doc = tomllib.load(open("pyproject.toml", "rb")); project = doc.get("project", {})
keys = ("requires-python", "dependencies", "optional-dependencies")
print(json.dumps([doc.get("build-system"), *(project.get(key) for key in keys)], sort_keys=True))')
}

# What the worker's Python packages depend on: the base, the pins, the worker recipe.
deps_hash() {
  { base_hash; pyproject_deps; sha_files constraints.txt docker/worker.Dockerfile .dockerignore; echo "venv ${VENV} v2"; } | short
}

# Everything the operator image and the worker environment's rljob package are built from.
src_files() {
  (cd "${REPO}" && find api operator workers proto/gen -type f ! -path '*/__pycache__/*' \
    ! -name '*.pyc' ! -path '*.egg-info/*' | LC_ALL=C sort)
}
src_hash() {
  { deps_hash; sha_files pyproject.toml README.md docker/operator.Dockerfile; src_files | (cd "${REPO}" && xargs sha256sum); } | short
}

# engine vllm's rollout pods: their own environment (vLLM's pins), the same base and Python.
vllm_hash() {
  { base_hash; sha_files runtimes/vllm/requirements.lock docker/rollout-vllm.Dockerfile; echo "venv ${VENV} v1"; } | short
}

BASE_HASH="$(base_hash)"
DEPS_HASH="$(deps_hash)"
SRC_HASH="$(src_hash)"
VLLM_HASH="$(vllm_hash)"
VLLM_DIR="${IMG}/vllm-${VLLM_HASH}"
ROLLOUT_VLLM_TEST_IMAGE="rljob.e2e/rljob-rollout-vllm-test:${VLLM_HASH}"
BASE_TAR="${IMG}/base-${BASE_HASH}.tar"
DEPS_DIR="${IMG}/deps-${DEPS_HASH}"
SRC_DIR="${IMG}/src-${SRC_HASH}"
OPERATOR_IMAGE="rljob.e2e/rljob-operator:${SRC_HASH}"
WORKER_TEST_IMAGE="rljob.e2e/rljob-worker-test:${DEPS_HASH}"
WORKER_IMAGE="rljob.e2e/rljob-worker:${DEPS_HASH}"

need() { # command package
  command -v "$1" >/dev/null 2>&1 || die "$1 not found: apt-get install $2 (or: e2e/images.sh deps)"
}
preflight() {
  [[ "$(id -u)" == 0 ]] || die "needs root (buildah chroot isolation, vfs storage, mmdebstrap)"
  need buildah buildah
  need mmdebstrap mmdebstrap
  mkdir -p "${IMG}"
}
timed() { # file label command...: run, append "label seconds" to file
  local t0 file="$1" label="$2"
  shift 2
  t0="$(e2e_now)"
  "$@"
  echo "${label} $(e2e_since "${t0}")" | tee -a "${file}" >&2
}

# ---------------------------------------------------------------- base
make_base() { # -> ${BASE_TAR}: Debian bookworm minbase + python3 + pip, as one rootfs tar
  [[ -s "${BASE_TAR}" ]] && return 0
  log "base: mmdebstrap ${BASE_SUITE} (${BASE_PACKAGES})"
  # shellcheck disable=SC2016 # $1 is mmdebstrap's hook argument (the root), not ours
  SOURCE_DATE_EPOCH="${EPOCH}" mmdebstrap --quiet --format=tar --variant=minbase --include="${BASE_PACKAGES}" \
    --customize-hook='rm -f "$1"/usr/lib/python3*/EXTERNALLY-MANAGED' \
    "${BASE_SUITE}" "${BASE_TAR%.tar}.tmp.tar" \
    "deb ${BASE_MIRROR} ${BASE_SUITE} main" "deb ${BASE_MIRROR} ${BASE_SUITE}-updates main" \
    "deb ${BASE_SECURITY} ${BASE_SUITE}-security main"
  tar -tvf "${BASE_TAR%.tar}.tmp.tar" ./usr/bin/python3 | grep -q "python${PYTHON_VERSION}\$" ||
    die "base: python3 of ${BASE_SUITE} is not ${PYTHON_VERSION}"
  mv "${BASE_TAR%.tar}.tmp.tar" "${BASE_TAR}"
}

# The base in buildah's storage, tagged python:<version>-slim so the Dockerfiles' FROM finds it.
load_base() {
  local ref="localhost/rljob-base:${BASE_HASH}" c
  if ! bah inspect --type image "${ref}" >/dev/null 2>&1; then
    make_base
    c="$(bah from scratch)"
    bah add --quiet "${c}" "${BASE_TAR}" / >/dev/null
    bah config --env PATH=/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin --env LANG=C.UTF-8 \
      --cmd python3 --label "io.rljob.base=mmdebstrap ${BASE_SUITE} ${BASE_PACKAGES}" "${c}"
    bah commit --quiet --timestamp "${EPOCH}" --rm "${c}" "${ref}" >/dev/null
  fi
  bah tag "${ref}" "docker.io/library/python:${PYTHON_VERSION}-slim"
}

# ---------------------------------------------------------------- images
ca_mount() { [[ -n "${BUILD_CA}" && -f "${BUILD_CA}" ]] && echo "-v=${BUILD_CA}:/etc/ssl/certs/ca-certificates.crt:ro"; }

bud() { # dockerfile image [buildah bud args...]
  local file="$1" image="$2"
  shift 2
  # shellcheck disable=SC2046 # ca_mount prints one word or nothing
  bah bud --quiet --isolation chroot --pull=never --timestamp "${EPOCH}" --build-arg "PYTHON_VERSION=${PYTHON_VERSION}" \
    $(ca_mount) -f "${REPO}/${file}" -t "${image}" "$@" "${REPO}" >/dev/null
}

# Write image as an OCI archive (ref name = image, which ctr import keeps), then drop it from storage.
push() { # image archive
  rm -f "$2.tmp"
  bah push --quiet "$1" "oci-archive:$2.tmp:$1"
  mv "$2.tmp" "$2"
  bah rmi "$1" >/dev/null
  log "$1: $(du -h "$2" | cut -f1) archive $2"
}

build_operator() {
  [[ -s "${SRC_DIR}/operator.tar" ]] && { log "operator: cached ${SRC_DIR}/operator.tar"; return 0; }
  preflight
  mkdir -p "${SRC_DIR}"
  load_base
  timed "${SRC_DIR}/times.txt" "operator-build" bud docker/operator.Dockerfile "${OPERATOR_IMAGE}"
  timed "${SRC_DIR}/times.txt" "operator-pack" push "${OPERATOR_IMAGE}" "${SRC_DIR}/operator.tar"
}

build_worker_test_image() {
  [[ -s "${DEPS_DIR}/worker-test.tar" ]] && return 0
  preflight
  mkdir -p "${DEPS_DIR}"
  load_base
  timed "${DEPS_DIR}/times.txt" "worker-test-build" bud docker/worker.Dockerfile "${WORKER_TEST_IMAGE}" \
    --target worker-test
  bah push --quiet "${WORKER_TEST_IMAGE}" "oci-archive:${DEPS_DIR}/worker-test.tar.tmp:${WORKER_TEST_IMAGE}"
  mv "${DEPS_DIR}/worker-test.tar.tmp" "${DEPS_DIR}/worker-test.tar"
  log "${WORKER_TEST_IMAGE}: $(du -h "${DEPS_DIR}/worker-test.tar" | cut -f1)"
}

# The build context of the Dockerfiles' build stage, as a writable copy (pip builds in the tree).
copy_context() { # dir
  (cd "${REPO}" && { printf '%s\n' pyproject.toml constraints.txt README.md runtimes/vllm/requirements.lock; src_files; } |
    tar -cf - -T -) |
    tar -xf - -C "$1"
}

# Run a shell script as root in a container of the worker-test image, the venv folder at ${VENV}.
in_worker_test() { # venv-dir script
  local c ctx
  ctx="$(mktemp -d "${IMG}/ctx.XXXXXX")"
  copy_context "${ctx}"
  bah inspect --type image "${WORKER_TEST_IMAGE}" >/dev/null 2>&1 ||
    bah pull --quiet "oci-archive:${DEPS_DIR}/worker-test.tar" >/dev/null
  c="$(bah from --quiet --pull=never "${WORKER_TEST_IMAGE}")"
  # shellcheck disable=SC2046
  bah run --isolation chroot --user 0:0 $(ca_mount) -v "$1:${VENV}" -v "${ctx}:/src" "${c}" -- sh -euc "$2" || {
    bah rm "${c}" >/dev/null
    rm -rf "${ctx}"
    return 1
  }
  bah rm "${c}" >/dev/null
  rm -rf "${ctx}"
}

# The worker-test pods' environment: a venv of the image's own python3 with '.[workers]', pinned.
build_deps_venv() {
  [[ -f "${DEPS_DIR}/venv/.done" ]] && return 0
  rm -rf "${DEPS_DIR}/venv.tmp" && mkdir -p "${DEPS_DIR}/venv.tmp"
  log "worker env: python3 -m venv + pip install '.[workers]' (about 6 GB)"
  timed "${DEPS_DIR}/times.txt" "worker-env-deps" in_worker_test "${DEPS_DIR}/venv.tmp" "
    python3 -m venv ${VENV}
    ${VENV}/bin/pip install --quiet --no-cache-dir -c /src/constraints.txt '/src[workers]'"
  touch "${DEPS_DIR}/venv.tmp/.done"
  mv "${DEPS_DIR}/venv.tmp" "${DEPS_DIR}/venv"
}

# Per source hash: a hard-linked copy of the dependency venv with this tree's rljob put in.
build_worker_env() {
  [[ -f "${SRC_DIR}/worker-env/.done" ]] && { log "worker env: cached ${SRC_DIR}/worker-env"; return 0; }
  preflight
  build_worker_test_image
  build_deps_venv
  mkdir -p "${SRC_DIR}"
  rm -rf "${SRC_DIR}/worker-env.tmp"
  cp -al "${DEPS_DIR}/venv" "${SRC_DIR}/worker-env.tmp"
  rm -f "${SRC_DIR}/worker-env.tmp/.done"
  timed "${SRC_DIR}/times.txt" "worker-env-rljob" in_worker_test "${SRC_DIR}/worker-env.tmp" "
    ${VENV}/bin/pip install --quiet --no-cache-dir --no-deps --force-reinstall /src
    ${VENV}/bin/rljob --help >/dev/null"
  touch "${SRC_DIR}/worker-env.tmp/.done"
  mv "${SRC_DIR}/worker-env.tmp" "${SRC_DIR}/worker-env"
  log "worker env: $(du -sh "${SRC_DIR}/worker-env" | cut -f1) (hard links into ${DEPS_DIR}/venv)"
}

# engine vllm's pods on the e2e node: the rollout-vllm-test image (the rollout-vllm image's runtime) and,
# mounted at ${VENV} like the worker's, vLLM's environment made from the lock (per lock hash) in the
# worker-test image, whose base and python3 are the rollout image's, with this tree's rljob put in (per
# source hash); the smoke run is in the rollout image itself.
build_rollout_vllm_test() {
  local env="${SRC_DIR}/rollout-vllm-env-${VLLM_HASH}" # this tree's rljob in that lock's environment
  [[ -f "${env}/.done" && -s "${VLLM_DIR}/rollout-vllm-test.tar" ]] && { log "rollout-vllm: cached ${env}"; return 0; }
  preflight
  build_worker_env # its image runs the installs below; its folders are this tree's
  mkdir -p "${VLLM_DIR}"
  if [[ ! -s "${VLLM_DIR}/rollout-vllm-test.tar" ]]; then
    load_base
    timed "${VLLM_DIR}/times.txt" "rollout-vllm-test-build" bud docker/rollout-vllm.Dockerfile \
      "${ROLLOUT_VLLM_TEST_IMAGE}" --target rollout-vllm-test
    push "${ROLLOUT_VLLM_TEST_IMAGE}" "${VLLM_DIR}/rollout-vllm-test.tar"
  fi
  if [[ ! -f "${VLLM_DIR}/venv/.done" ]]; then
    rm -rf "${VLLM_DIR}/venv.tmp" && mkdir -p "${VLLM_DIR}/venv.tmp"
    log "rollout-vllm env: python3 -m venv + pip install the lock (about 6 GB)"
    timed "${VLLM_DIR}/times.txt" "rollout-vllm-env-deps" in_worker_test "${VLLM_DIR}/venv.tmp" "
      python3 -m venv ${VENV}
      ${VENV}/bin/pip install --quiet --no-cache-dir --no-deps -r /src/runtimes/vllm/requirements.lock"
    touch "${VLLM_DIR}/venv.tmp/.done"
    mv "${VLLM_DIR}/venv.tmp" "${VLLM_DIR}/venv"
  fi
  rm -rf "${env}.tmp"
  cp -al "${VLLM_DIR}/venv" "${env}.tmp"
  rm -f "${env}.tmp/.done"
  timed "${SRC_DIR}/times.txt" "rollout-vllm-env-rljob" in_worker_test "${env}.tmp" "
    ${VENV}/bin/pip install --quiet --no-cache-dir --no-deps --force-reinstall /src"
  # in the rollout image itself: vLLM's CPU kernels load there (they link libraries the image must bring)
  timed "${SRC_DIR}/times.txt" "rollout-vllm-smoke" smoke --mount "${env}.tmp:${VENV}" \
    "${VLLM_DIR}/rollout-vllm-test.tar" python -c "${ROLLOUT_VLLM_SMOKE}"
  touch "${env}.tmp/.done"
  rm -rf "${env}"
  mv "${env}.tmp" "${env}"
}
# vLLM's CPU kernels load; torch's inductor compiles (vLLM's CPU sampler does, at the first sample); Ray's
# dashboard agent, which KubeRay's probes ask, has its modules (ray[default])
ROLLOUT_VLLM_SMOKE="import torch, vllm, vllm._C, ray, aiohttp_cors, rljob_workers.engines.vllm
assert torch.compile(lambda x: x.sin() + 1)(torch.zeros(4)).tolist() == [1.0] * 4
print('vllm', vllm.__version__, 'torch', torch.__version__, 'ray', ray.__version__)"

# ---------------------------------------------------------------- private containerd
# A containerd of our own (its own root, state and socket under a temporary folder, no CRI
# plugin): imports an archive and runs one command in it, then stops and removes everything.
CTD_DIR=""
CTD_PID=""
ctd_stop() {
  if [[ -n "${CTD_PID}" ]]; then
    kill "${CTD_PID}" 2>/dev/null || true
    wait "${CTD_PID}" 2>/dev/null || true
  fi
  CTD_PID=""
  if [[ -n "${CTD_DIR}" && -d "${CTD_DIR}" ]]; then
    grep -o " ${CTD_DIR}/[^ ]*" /proc/mounts | sort -r | xargs -r -n1 umount -l 2>/dev/null || true
    rm -rf "${CTD_DIR}"
  fi
  CTD_DIR=""
}
ctd_start() {
  need containerd containerd
  need runc runc
  CTD_DIR="$(mktemp -d "${TMPDIR:-/tmp}/rljob-ctd.XXXXXX")"
  cat >"${CTD_DIR}/config.toml" <<TOML
version = 2
root = "${CTD_DIR}/root"
state = "${CTD_DIR}/state"
disabled_plugins = ["io.containerd.grpc.v1.cri"]
[grpc]
  address = "${CTD_DIR}/sock"
[ttrpc]
  address = "${CTD_DIR}/sock.ttrpc"
TOML
  containerd --config "${CTD_DIR}/config.toml" >"${CTD_DIR}/containerd.log" 2>&1 &
  CTD_PID=$!
  local _
  for _ in $(seq 100); do
    ctr -a "${CTD_DIR}/sock" version >/dev/null 2>&1 && return 0
    kill -0 "${CTD_PID}" 2>/dev/null || break
    sleep 0.1
  done
  cat "${CTD_DIR}/containerd.log" >&2
  die "private containerd did not start"
}

# Import ARCHIVE (its one image) into a private containerd and run CMD in it as the image says
# (its user, env, working directory); each --mount HOST:PATH is bound read-only, as a pod's hostPath;
# --read-only: a read-only root file system, as the operator chart's securityContext asks.
smoke() { # [--read-only] [--mount host:path]... archive cmd...
  local mounts=() ref t0
  while [[ "${1:-}" == --* ]]; do
    case "$1" in
      --read-only) mounts+=(--read-only) && shift ;;
      --mount) mounts+=(--mount "type=bind,src=${2%%:*},dst=${2#*:},options=rbind:ro") && shift 2 ;;
      *) die "smoke: unknown option $1" ;;
    esac
  done
  local archive="$1"
  shift
  [[ "$(id -u)" == 0 ]] || die "smoke: needs root (containerd, runc)"
  trap ctd_stop EXIT
  ctd_start
  t0="$(e2e_now)"
  ref="$(ctr -a "${CTD_DIR}/sock" -n k8s.io images import "${archive}" | sed -n 's/^unpacking \([^ ]*\) .*/\1/p')"
  [[ -n "${ref}" ]] || die "smoke: ctr images import named no image"
  log "smoke: imported ${ref} in $(e2e_since "${t0}")"
  ctr -a "${CTD_DIR}/sock" -n k8s.io run --rm "${mounts[@]}" "${ref}" "rljob-smoke-$$" "$@"
  ctd_stop
  trap - EXIT
}

# ---------------------------------------------------------------- full worker
WORKER_SMOKE="import sys, rljob_workers.driver.cli, torch, ray, transformers, importlib.util as u
assert u.find_spec('kopf') is None
print('python', sys.version.split()[0], 'torch', torch.__version__, 'ray', ray.__version__,
      'transformers', transformers.__version__)"

# Built from the current tree once per dependency hash (not per source change: it is a packaging
# check, ~6 GB; the e2e pods run the worker-test image), then smoke-tested in a private containerd.
build_worker() {
  local d="${DEPS_DIR}"
  if [[ -s "${d}/worker.tar" && -s "${d}/worker-smoke.txt" ]]; then
    log "worker: cached ${d}/worker.tar ($(cat "${d}/worker-smoke.txt"))"
    return 0
  fi
  preflight
  mkdir -p "${d}"
  if [[ ! -s "${d}/worker.tar" ]]; then
    load_base
    timed "${d}/times.txt" "worker-build" bud docker/worker.Dockerfile "${WORKER_IMAGE}"
    timed "${d}/times.txt" "worker-pack" push "${WORKER_IMAGE}" "${d}/worker.tar"
    echo "${SRC_HASH}" >"${d}/worker-source-hash"
  fi
  timed "${d}/times.txt" "worker-smoke" smoke "${d}/worker.tar" python -c "${WORKER_SMOKE}" |
    tee "${d}/worker-smoke.txt.tmp"
  mv "${d}/worker-smoke.txt.tmp" "${d}/worker-smoke.txt"
}

# ---------------------------------------------------------------- prune
# Each dependency change leaves a ~6 GB deps folder and a worker-test image behind; a disk that fills
# makes Ray refuse to create objects. Keep this tree's build and the newest other one (another clone's
# run may be using it), drop the rest.
prune_stale() {
  local kind keep dir tag
  touch "${DEPS_DIR}" "${SRC_DIR}"
  for kind in deps src vllm; do
    if [[ "${kind}" == vllm ]]; then
      keep="${VLLM_DIR}" # 6 GB each, and only `make e2e-real-vllm` builds one (there may be none)
    else
      keep="$(ls -dt "${IMG}/${kind}-"* 2>/dev/null | head -n 2 | tr '\n' ' ')"
    fi
    for dir in "${IMG}/${kind}-"*; do
      [[ -d "${dir}" && " ${keep} " != *" ${dir} "* ]] || continue
      log "prune: ${dir} ($(du -sh "${dir}" | cut -f1))"
      rm -rf "${dir}"
    done
  done
  for dir in "${IMG}"/base-*.tar; do
    [[ -f "${dir}" && "${dir}" != "${BASE_TAR}" ]] && rm -f "${dir}"
  done
  for tag in $(bah images --format '{{.Name}}:{{.Tag}}' | sed -n 's|^rljob.e2e/rljob-worker-test:||p'); do
    [[ -d "${IMG}/deps-${tag}" ]] || bah rmi -f "rljob.e2e/rljob-worker-test:${tag}" >/dev/null 2>&1 || true
  done
}

# ---------------------------------------------------------------- main
is_built() {
  [[ -s "${SRC_DIR}/operator.tar" && -s "${DEPS_DIR}/worker-test.tar" && -f "${SRC_DIR}/worker-env/.done" ]]
}

print_env() {
  cat <<ENV
export RLJOB_E2E_OPERATOR_IMAGE=${OPERATOR_IMAGE}
export RLJOB_E2E_OPERATOR_ARCHIVE=${SRC_DIR}/operator.tar
export RLJOB_E2E_WORKER_TEST_IMAGE=${WORKER_TEST_IMAGE}
export RLJOB_E2E_WORKER_TEST_ARCHIVE=${DEPS_DIR}/worker-test.tar
export RLJOB_E2E_WORKER_ENV=${SRC_DIR}/worker-env
export RLJOB_E2E_WORKER_ENV_MOUNT=${VENV}
export RLJOB_E2E_WORKER_IMAGE=${WORKER_IMAGE}
export RLJOB_E2E_WORKER_ARCHIVE=${DEPS_DIR}/worker.tar
export RLJOB_E2E_ROLLOUT_VLLM_TEST_IMAGE=${ROLLOUT_VLLM_TEST_IMAGE}
export RLJOB_E2E_ROLLOUT_VLLM_TEST_ARCHIVE=${VLLM_DIR}/rollout-vllm-test.tar
export RLJOB_E2E_ROLLOUT_VLLM_ENV=${SRC_DIR}/rollout-vllm-env-${VLLM_HASH}
ENV
}

# What the e2e pods run (operator, worker-test); with "full", the full worker image too.
import_all() { # [containerd address] [full]
  local addr="${1:-/run/containerd/containerd.sock}" a archives=("${SRC_DIR}/operator.tar" "${DEPS_DIR}/worker-test.tar")
  [[ "${2:-}" == full ]] && archives+=("${DEPS_DIR}/worker.tar")
  for a in "${archives[@]}"; do
    [[ -s "${a}" ]] || die "import: ${a} not built (e2e/images.sh$([[ "${a}" == */worker.tar ]] && echo " worker"))"
    ctr -a "${addr}" -n k8s.io images import "${a}"
  done
}

case "${1:-build}" in
  build)
    t0="$(e2e_now)"
    build_operator
    build_worker_env
    prune_stale
    log "done in $(e2e_since "${t0}"): ${OPERATOR_IMAGE}, ${WORKER_TEST_IMAGE} + ${SRC_DIR}/worker-env"
    ;;
  operator) build_operator ;;
  worker-test) build_worker_env ;;
  worker) build_worker ;;
  rollout-vllm-test) build_rollout_vllm_test ;;
  check) is_built ;;
  prune) prune_stale ;;
  env) print_env ;;
  import) import_all "${2:-}" "${3:-}" ;;
  smoke)
    shift
    (($# >= 2)) || die "usage: $0 smoke [--read-only] [--mount HOST:PATH]... ARCHIVE CMD..."
    smoke "$@"
    ;;
  deps) # apt-get only when a tool is missing (a fresh machine's package lists may be empty: update first)
    if ! command -v buildah >/dev/null 2>&1 || ! command -v mmdebstrap >/dev/null 2>&1; then
      apt-get update -qq
      DEBIAN_FRONTEND=noninteractive apt-get install -y -qq --no-install-recommends buildah mmdebstrap >/dev/null
    fi
    ;;
  *)
    sed -n '2,/^set -euo/p' "$0" | sed '$d' | sed 's/^# \{0,1\}//' >&2
    exit 2
    ;;
esac
