"""Knocking on a locked server's doors (#66), for the Python helpers' servers and the TypeScript examples alike:
each call as a caller without the job's token, with a wrong one, with the job's, and in plain text to its TLS
port, and the gRPC status each gets."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable, Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import grpc
from grpc_health.v1 import health_pb2, health_pb2_grpc
from tls_certs import TlsFiles, tls_files

from rljob.v1 import environment_service_pb2 as env_pb
from rljob.v1 import environment_service_pb2_grpc as env_grpc
from rljob.v1 import reward_service_pb2, reward_service_pb2_grpc, sample_pb2

TOKEN = "the-jobs-t0ken"
UNAUTHENTICATED = grpc.StatusCode.UNAUTHENTICATED
# A call to make on a channel, with the metadata given.
Call = Callable[[grpc.aio.Channel, Any], Awaitable[None]]


@dataclass(frozen=True)
class Lock:
    """The files of a lock: the job's token and the server's TLS certificate, key and CA."""

    token: Path
    tls: TlsFiles

    def env(self) -> dict[str, str]:
        return {
            "RLJOB_TOKEN_FILE": str(self.token),
            "RLJOB_TLS_CERT": str(self.tls.cert),
            "RLJOB_TLS_KEY": str(self.tls.key),
        }


def make_lock(folder: Path) -> Lock:
    """The job's token (TOKEN) and a server certificate for 127.0.0.1 with its CA, written under `folder`."""
    (folder / "token").write_text(TOKEN + "\n")
    return Lock(folder / "token", tls_files(folder / "tls"))


async def outcome(call: Call, address: str, ca: Path | None, token: str | None) -> grpc.StatusCode:
    """The status of `call` on a channel to `address`: over TLS trusting `ca` (plain text without), with `token`."""
    metadata = (("authorization", f"Bearer {token}"),) if token else ()
    if ca is None:
        channel = grpc.aio.insecure_channel(address)
    else:
        channel = grpc.aio.secure_channel(address, grpc.ssl_channel_credentials(ca.read_bytes()))
    async with channel:
        try:
            await asyncio.wait_for(call(channel, metadata), 10)
        except grpc.aio.AioRpcError as exc:
            return exc.code()
    return grpc.StatusCode.OK


async def health(channel: grpc.aio.Channel, metadata: Any) -> None:
    answer = await health_pb2_grpc.HealthStub(channel).Check(health_pb2.HealthCheckRequest(), metadata=metadata)
    assert answer.status == health_pb2.HealthCheckResponse.SERVING


async def reward_info(channel: grpc.aio.Channel, metadata: Any) -> None:
    await reward_service_pb2_grpc.RewardServiceStub(channel).Info(reward_service_pb2.InfoRequest(), metadata=metadata)


async def reward_score(channel: grpc.aio.Channel, metadata: Any) -> None:
    sample = sample_pb2.RewardSample(sample_id="p/0", prompt="2+3=", completion="5", fields={"answer": "5"})
    call = reward_service_pb2_grpc.RewardServiceStub(channel).Score(metadata=metadata)
    await call.write(reward_service_pb2.ScoreRequest(sample=sample))
    await call.done_writing()
    answers = [response.score async for response in call]
    assert [(a.sample_id, a.score) for a in answers] == [("p/0", 1.0)], answers


async def environment_info(channel: grpc.aio.Channel, metadata: Any) -> None:
    stub = env_grpc.EnvironmentServiceStub(channel)
    await stub.Info(env_pb.EnvironmentServiceInfoRequest(), metadata=metadata)


async def environment_episode(channel: grpc.aio.Channel, metadata: Any) -> None:
    start = env_pb.EpisodeStart(episode_id="e0-1/0", seed=7, prompt="123+456")
    start.task.update({"answer": "579"})
    call = env_grpc.EnvironmentServiceStub(channel).Episode(metadata=metadata)
    await call.write(env_pb.EpisodeRequest(start=start))
    await call.write(env_pb.EpisodeRequest(action=env_pb.Action(text="579", turn=1)))
    await call.done_writing()
    answers = [answer async for answer in call]
    assert answers[-1].done and answers[-1].final_reward == 1.0, answers


def doors(address: str, lock: Lock, calls: Sequence[Call]) -> dict[str, grpc.StatusCode]:
    """Each call of `calls` as a caller without the token, with a wrong one, with the job's, and in plain text."""

    async def go() -> dict[str, grpc.StatusCode]:
        found = {"health, no token": await outcome(health, address, lock.tls.ca, None)}
        for call in calls:
            name = call.__name__
            found[f"{name}, no token"] = await outcome(call, address, lock.tls.ca, None)
            found[f"{name}, wrong token"] = await outcome(call, address, lock.tls.ca, "guess")
            found[f"{name}, the job's token"] = await outcome(call, address, lock.tls.ca, TOKEN)
            found[f"{name}, plain text"] = await outcome(call, address, None, TOKEN)
        return found

    return asyncio.run(go())


def expected(calls: Sequence[Call]) -> dict[str, grpc.StatusCode]:
    found = {"health, no token": grpc.StatusCode.OK}
    for call in calls:
        found[f"{call.__name__}, no token"] = UNAUTHENTICATED
        found[f"{call.__name__}, wrong token"] = UNAUTHENTICATED
        found[f"{call.__name__}, the job's token"] = grpc.StatusCode.OK
        found[f"{call.__name__}, plain text"] = grpc.StatusCode.UNAVAILABLE  # a TLS port answers no plain text
    return found
