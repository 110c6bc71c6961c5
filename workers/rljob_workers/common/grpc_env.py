"""gRPC core's settings for an rljob process. grpc reads them once, when it is first imported: the
process's entry point applies them before anything imports grpc."""

from __future__ import annotations

import os
from collections.abc import MutableMapping

GRPC_PROCESS_ENV = {
    # grpcio 1.85 logs at INFO by default: every run would end with a "Got goaway" line when Ray stops the
    # pools' servers. GRPC_VERBOSITY=INFO or DEBUG in the environment still turns it on.
    "GRPC_VERBOSITY": "ERROR",
    # grpcio turns gRPC core's fork support on: every fork runs its handlers, which restart gRPC's
    # threads in the child. Ray forks its daemons with a preexec_fn (a plain fork, not a spawn); in a
    # child that then closes its descriptors, those threads can abort it before it execs (grpc/grpc#13998,
    # #37259), above all while this process is busy with gRPC: a raylet or GCS that never runs.
    # rljob never forks without exec, the one case the support is for.
    "GRPC_ENABLE_FORK_SUPPORT": "0",
}


def use_grpc_process_env(environ: MutableMapping[str, str] = os.environ) -> None:
    """GRPC_PROCESS_ENV into `environ`, where it does not set them already."""
    for name, value in GRPC_PROCESS_ENV.items():
        environ.setdefault(name, value)
