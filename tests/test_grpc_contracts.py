"""The wire contracts: buf STANDARD naming, documented RPCs, and health + reflection on every server."""

from __future__ import annotations

import asyncio
import re

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from grpc_reflection.v1alpha import reflection_pb2, reflection_pb2_grpc

from rljob.v1 import (
    control_service_pb2,
    control_service_pb2_grpc,
    environment_service_pb2,
    reward_service_pb2,
    rollout_service_pb2,
    sample_pb2,
    weight_service_pb2,
)
from rljob_workers.common.grpc_server import Service, channel, start_server

from conftest import REPO

MODULES = [
    control_service_pb2,
    environment_service_pb2,
    reward_service_pb2,
    rollout_service_pb2,
    sample_pb2,
    weight_service_pb2,
]
PROTO_DIR = REPO / "proto" / "rljob" / "v1"


def test_buf_standard_naming():
    for module in MODULES:
        file = module.DESCRIPTOR
        assert file.package == "rljob.v1"
        assert file.name.startswith("rljob/v1/")
        assert len(file.services_by_name) <= 1, f"{file.name}: one service per file"
        for service in file.services_by_name.values():
            assert service.name.endswith("Service")
            for method in service.methods:
                # buf's RPC_REQUEST_STANDARD_NAME: <Method>Request, or <Service><Method>Request where the
                # short name is another service's in the package
                names = (method.name, service.name + method.name)
                assert method.input_type.name in {f"{n}Request" for n in names}, method.full_name
                assert method.output_type.name in {f"{n}Response" for n in names}, method.full_name
        enums = list(file.enum_types_by_name.values())
        for enum in enums:
            prefix = re.sub(r"(?<!^)(?=[A-Z])", "_", enum.name).upper()
            assert enum.values[0].number == 0 and enum.values[0].name == f"{prefix}_UNSPECIFIED"
            assert all(v.name.startswith(prefix + "_") for v in enum.values)


def test_every_rpc_and_message_is_documented():
    for path in PROTO_DIR.glob("*.proto"):
        lines = path.read_text().splitlines()
        for i, line in enumerate(lines):
            if re.match(r"\s*(rpc|service|message|enum) ", line):
                assert lines[i - 1].strip().startswith("//"), f"{path.name}:{i + 1} undocumented: {line.strip()}"


class _Control(control_service_pb2_grpc.ControlServiceServicer):
    async def GetJobStatus(self, request, context):
        status = control_service_pb2.JobStatus(step=7, phase=control_service_pb2.RUN_PHASE_RUNNING)
        return control_service_pb2.GetJobStatusResponse(status=status)


async def _exercise_server() -> tuple[int, int, list[str]]:
    name = control_service_pb2.DESCRIPTOR.services_by_name["ControlService"].full_name
    server = await start_server(
        [Service(control_service_pb2_grpc.add_ControlServiceServicer_to_server, _Control(), name)]
    )
    try:
        async with channel(f"127.0.0.1:{server.port}") as ch:
            health = health_pb2_grpc.HealthStub(ch)
            checked = await health.Check(health_pb2.HealthCheckRequest(service=name))
            reply = await control_service_pb2_grpc.ControlServiceStub(ch).GetJobStatus(
                control_service_pb2.GetJobStatusRequest()
            )
            stub = reflection_pb2_grpc.ServerReflectionStub(ch)
            call = stub.ServerReflectionInfo(iter([reflection_pb2.ServerReflectionRequest(list_services="")]))
            listed = [s.name async for r in call for s in r.list_services_response.service]
            await server.set_serving(False)
            drained = await health.Check(health_pb2.HealthCheckRequest(service=""))
            assert drained.status == health_pb2.HealthCheckResponse.NOT_SERVING
        return checked.status, reply.status.step, listed
    finally:
        await server.stop(None)


def test_server_has_health_and_reflection():
    status, step, listed = asyncio.run(_exercise_server())
    assert status == health_pb2.HealthCheckResponse.SERVING
    assert step == 7
    assert {
        "rljob.v1.ControlService",
        "grpc.health.v1.Health",
        "grpc.reflection.v1alpha.ServerReflection",
    } <= set(listed)


def test_unimplemented_rpc_is_a_clear_status():
    async def call() -> grpc.StatusCode:
        name = "rljob.v1.ControlService"
        server = await start_server(
            [Service(control_service_pb2_grpc.add_ControlServiceServicer_to_server, _Control(), name)]
        )
        try:
            async with channel(f"127.0.0.1:{server.port}") as ch:
                try:
                    await control_service_pb2_grpc.ControlServiceStub(ch).Stop(control_service_pb2.StopRequest())
                except grpc.aio.AioRpcError as exc:
                    return exc.code()
                return grpc.StatusCode.OK
        finally:
            await server.stop(None)

    assert asyncio.run(call()) == grpc.StatusCode.UNIMPLEMENTED
