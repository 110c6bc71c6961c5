"""spec.environment's set-up check, before Ray starts: the class imports (kind python) or the endpoint answers
its Info (kind remote), and the tools it offers are ones the model's chat template writes into the prompt.
What the Info said goes into the run plan: the prompts are rendered with its tools, turns stop at its stops."""

from __future__ import annotations

from pathlib import Path

import grpc

from rljob.v1 import environment_service_pb2 as pb
from rljob.v1 import environment_service_pb2_grpc as pb_grpc
from rljob_api import RLJob
from rljob_api.environment import EnvironmentSpec
from rljob_workers.driver.controller.observations import ObservationEncoder
from rljob_workers.driver.errors import SetupError
from rljob_workers.driver.pools.environment import EnvironmentInfo
from rljob_workers.environment.episode import EnvironmentConfigError, check_args, describe, load_class
from rljob_workers.reward.remote import token_path

# An endpoint that has not answered its Info by then is refused: the whole check stays within seconds.
INFO_TIMEOUT_SECONDS = 1.5


def check_environment(job: RLJob, *, cluster: bool = False) -> EnvironmentInfo | None:
    """spec.environment's Info (None without one, or for a `kind: image` one on a cluster: its first replica
    tells it); SetupError naming the field for what cannot run."""
    spec = job.spec.environment
    if spec is None:
        return None
    if spec.kind == "image":
        if cluster:
            return None
        raise SetupError(
            "spec.environment.kind: image runs the environment's own container in the pods of a cluster; on one "
            "machine serve it yourself and name its address with kind remote, or use kind python"
        )
    info = _python_info(spec) if spec.class_ref is not None else _remote_info(spec)
    if info.max_turns < 0:
        raise SetupError(f"spec.environment: {info.name!r}'s Info declares max_turns {info.max_turns}")
    if info.tools:
        encoder = ObservationEncoder(job.spec.model.path)
        if not encoder.renders_tools(info.tools):
            names = ", ".join(info.tool_names)
            raise SetupError(
                f"spec.environment: {info.name!r} offers tools ({names}) that the chat template of "
                f"{job.spec.model.path} cannot render (its prompts read the same with and without them)"
            )
    return info


def _python_info(spec: EnvironmentSpec) -> EnvironmentInfo:
    assert spec.class_ref is not None
    try:
        cls = load_class(spec.class_ref)
        info = EnvironmentInfo.from_info(describe(cls, spec.class_ref))
    except EnvironmentConfigError as exc:
        raise SetupError(f"spec.environment.class: {exc}") from None
    try:
        check_args(cls, spec.class_ref, spec.args)
    except EnvironmentConfigError as exc:
        raise SetupError(str(exc)) from None
    return info


def _remote_info(spec: EnvironmentSpec) -> EnvironmentInfo:
    remote = spec.remote
    assert remote is not None
    address = remote.endpoints[0]
    path = token_path("environment", remote)
    metadata = (("authorization", f"Bearer {path.read_text().strip()}"),) if path is not None else None
    if remote.tls:
        roots = Path(remote.ca_file).read_bytes() if remote.ca_file else None
        channel = grpc.secure_channel(address, grpc.ssl_channel_credentials(root_certificates=roots))
    else:
        channel = grpc.insecure_channel(address)
    try:
        stub = pb_grpc.EnvironmentServiceStub(channel)
        info = stub.Info(pb.EnvironmentServiceInfoRequest(), timeout=INFO_TIMEOUT_SECONDS, metadata=metadata)
    except grpc.RpcError as exc:
        detail = (exc.details() if isinstance(exc, grpc.Call) else str(exc)) or type(exc).__name__
        raise SetupError(
            f"spec.environment.remote.endpoints[0]: {address} did not answer its Info: {detail.splitlines()[0]}"
        ) from None
    finally:
        channel.close()
    return EnvironmentInfo.from_info(info)
