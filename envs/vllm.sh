#!/usr/bin/env bash
# The command users type for vLLM's runtime (`bash envs/vllm.sh [path|check|lock]`): runtimes/vllm.sh's.
exec bash "$(dirname "${BASH_SOURCE[0]}")/../runtimes/vllm.sh" "$@"
