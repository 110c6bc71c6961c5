"""Helpers of the reward tests: samples, reward functions and servers, and an event loop that stops the
servers a test started."""

from __future__ import annotations

import asyncio
import contextlib
import socket
from collections.abc import AsyncIterator, Awaitable
from typing import Any, TypeVar

from rljob.v1 import sample_pb2
from rljob_api.reward import RewardFunction
from rljob_workers.common.grpc_server import RunningServer
from rljob_workers.reward import RewardFunctionSet, RewardServicer
from rljob_workers.reward.server import start_reward_server

T = TypeVar("T")

INVALID = sample_pb2.ERROR_CLASS_INVALID
FUNCTION = sample_pb2.ERROR_CLASS_FUNCTION
TRANSIENT = sample_pb2.ERROR_CLASS_TRANSIENT

# Servers started in the current `run` (helpers append them); stopped when it ends, even when a test
# fails half-way (a server left running keeps asyncio.run from returning, so the test would hang).
started: list[RunningServer] = []


def run(coro: Awaitable[T], timeout: float = 60) -> T:
    async def guarded() -> T:
        try:
            return await asyncio.wait_for(coro, timeout)
        finally:
            servers, started[:] = list(started), []
            await asyncio.gather(*(s.stop(None) for s in servers), return_exceptions=True)

    return asyncio.run(guarded())


def sample(sid: str, completion: str = "42", prompt: str = "6*7=", **fields: str) -> sample_pb2.RewardSample:
    return sample_pb2.RewardSample(
        sample_id=sid, prompt_id=sid.split("/")[0], prompt=prompt, completion=completion, fields=fields
    )


def fn(name: str, kind: str, weight: float = 1.0, *, judge_only: bool = False, **config: Any) -> RewardFunction:
    spec = {"name": name, "kind": kind, "weight": weight, "judgeOnly": judge_only, kind: config}
    return RewardFunction.model_validate(spec)


def free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


@contextlib.asynccontextmanager
async def function_set(*functions: RewardFunction, timeout: float = 5.0) -> AsyncIterator[RewardFunctionSet]:
    fs = await asyncio.to_thread(RewardFunctionSet.from_spec, list(functions), timeout)
    try:
        yield fs
    finally:
        await fs.aclose()


async def rule_server(ref: str = "reward_fns:exact", port: int = 0) -> tuple[RunningServer, RewardServicer]:
    functions = RewardFunctionSet.from_spec([fn("exact", "rule", function=ref)], 10.0)
    running, servicer = await start_reward_server(functions, name="exact", max_in_flight=64, port=port)
    started.append(running)
    return running, servicer


def scored_total(servicer: RewardServicer) -> float:
    return servicer.metrics.registry.get_sample_value("rljob_reward_scored_total") or 0.0
