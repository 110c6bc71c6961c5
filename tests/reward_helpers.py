"""Helpers of the reward tests: samples, and an event loop that stops the servers a test started."""

from __future__ import annotations

import asyncio
from collections.abc import Awaitable
from typing import TypeVar

from rljob.v1 import sample_pb2
from rljob_workers.common.grpc_server import RunningServer

T = TypeVar("T")

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
