"""Counts the calls of `derive_worker_configs`, wherever it was imported: the worker configs of a job are derived
once per `rljob run` and once per operator reconcile (one source, handed down whole)."""

from __future__ import annotations

import sys
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import rljob_api.workercfg


@contextmanager
def counted_derivations() -> Iterator[list[int]]:
    """[calls so far] while the block runs: every module that holds the function (now or by a later import of
    `rljob_api`) holds the counting one instead."""
    original = rljob_api.workercfg.derive_worker_configs
    calls = [0]

    def counting(job: Any) -> Any:
        calls[0] += 1
        return original(job)

    holders = [m for m in list(sys.modules.values()) if getattr(m, "derive_worker_configs", None) is original]
    for module in holders:
        module.derive_worker_configs = counting  # type: ignore[attr-defined]
    try:
        yield calls
    finally:
        for module in holders:
            module.derive_worker_configs = original  # type: ignore[attr-defined]


def main() -> None:
    """`python tests/derivations.py ARGS...`: `rljob ARGS...`, then its derivations on stderr's last line."""
    from rljob_workers.common.grpc_env import use_grpc_process_env

    use_grpc_process_env()
    with counted_derivations() as calls:
        from rljob_workers.driver.cli import main as rljob

        rc = rljob(sys.argv[1:])
    print(f"derive_worker_configs calls: {calls[0]}", file=sys.stderr, flush=True)
    sys.exit(rc)


if __name__ == "__main__":
    main()
