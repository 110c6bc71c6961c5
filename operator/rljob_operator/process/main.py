"""The operator's entry point (`python -m rljob_operator`, __main__.py): `main([flags])` runs the operator,
`main(["render", FILE])` prints the children an RLJob file renders to.

Neither imports kopf before it is needed: the render command needs no cluster and no kopf handlers.
"""

from __future__ import annotations

import logging
import os
import socket
import sys
from collections.abc import Sequence


def render_command(argv: Sequence[str]) -> int:
    """Print the children an RLJob file renders to (no cluster needed)."""
    import argparse

    from rljob_api import RLJobInvalid, derive_worker_configs, load_rljob
    from rljob_operator.options import RenderOptions
    from rljob_operator.render.dump import dump_all
    from rljob_operator.render.manifests import render

    parser = argparse.ArgumentParser(prog="python -m rljob_operator render")
    parser.add_argument("file", help="RLJob YAML file")
    args = parser.parse_args(list(argv))
    try:
        job = load_rljob(args.file)
    except RLJobInvalid as exc:
        print(exc, file=sys.stderr)
        return 2
    sys.stdout.write(dump_all(render(job, derive_worker_configs(job), RenderOptions())))
    return 0


def main(argv: Sequence[str] | None = None) -> int:
    # gRPC core logs at INFO by default (a line per controller channel closed under a poll); read when
    # grpc is first imported, which nothing above does. GRPC_VERBOSITY=INFO still turns it on.
    os.environ.setdefault("GRPC_VERBOSITY", "ERROR")
    args = list(sys.argv[1:] if argv is None else argv)
    if args[:1] == ["render"]:
        return render_command(args[1:])
    import kopf

    from rljob_operator.process import handlers  # noqa: F401  (registers the handlers)
    from rljob_operator.process.flags import parse_config

    config = parse_config(args, os.environ)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    # Every watch event of an RLJob or a child runs `remember` or an index function (kube/children.py); their
    # "succeeded" lines would drown the log.
    quiet = ("Handler 'remember' succeeded", "Handler 'index_", "Handler 'child_deleted' succeeded")
    logging.getLogger("kopf.objects").addFilter(lambda record: not str(record.msg).startswith(quiet))
    kopf.run(
        standalone=True,  # one replica (the chart's Deployment uses strategy Recreate): no peering needed
        # kopf's default identity asks the passwd database for the user, which fails for a uid the image has
        # no entry for (the chart's 65532, or any uid a cluster assigns): the pod's host name is enough.
        identity=socket.gethostname(),  # type: ignore[arg-type]  # kopf's Identity: a NewType of str it does not export
        clusterwide=config.clusterwide,
        namespaces=list(config.namespaces),
        liveness_endpoint=config.liveness,
        memo=kopf.Memo(config=config),
    )
    return 0
