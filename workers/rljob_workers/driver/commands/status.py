"""`rljob status`: a running controller's status, read from its ControlService with the job's token."""

from __future__ import annotations

import asyncio
import contextlib
import sys
from pathlib import Path

from rljob.v1 import control_service_pb2 as control_pb
from rljob.v1 import control_service_pb2_grpc as control_grpc
from rljob_workers.common.auth import TokenError


async def fetch_status(address: str, token: str | None) -> control_pb.JobStatus:
    from rljob_workers.common.grpc_server import channel

    async with channel(address, token) as ch:
        reply = await control_grpc.ControlServiceStub(ch).GetJobStatus(control_pb.GetJobStatusRequest(), timeout=10)
        return reply.status


def secret_token(name: str, namespace: str) -> str:
    """The token in a job's Secret, read with the kubeconfig (the kubernetes client, rljob[operator])."""
    import base64

    try:
        from kubernetes import client, config
    except ImportError:
        raise TokenError(
            "--secret needs the kubernetes client (pip install 'rljob[operator]'); or use --token-file"
        ) from None
    from kubernetes.client.exceptions import ApiException

    config.load_kube_config()
    try:
        secret = client.CoreV1Api().read_namespaced_secret(name, namespace)
    except ApiException as exc:
        raise TokenError(f"Secret {namespace}/{name}: {exc.status} {exc.reason}") from None
    data = (secret.data or {}).get("token")
    if not data:
        raise TokenError(f"Secret {namespace}/{name} has no key 'token'")
    return base64.b64decode(data).decode().strip()


def print_status(address: str, token_file: Path | None = None, secret: str | None = None, namespace: str = "") -> int:
    import grpc

    from rljob_workers.common.auth import read_token
    from rljob_workers.driver.telemetry.display import Progress

    try:
        token = read_token(token_file) if token_file else secret_token(secret, namespace) if secret else None
        status = asyncio.run(fetch_status(address, token))
    except TokenError as exc:
        print(exc, file=sys.stderr)
        return 2
    except grpc.aio.AioRpcError as exc:
        hint = ""
        if exc.code() == grpc.StatusCode.UNAUTHENTICATED:
            hint = " (pass --token-file: rljob run writes <output>/token; on a cluster --secret <job>-token)"
        print(f"{address}: {exc.code().name}: {exc.details()}{hint}", file=sys.stderr)
        return 1
    with contextlib.suppress(Exception):
        Progress("status", live=False).final(status)
    return 0
