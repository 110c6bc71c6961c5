"""The benchmark's environment: a game whose length and step times are fixed by the episode's seed.

An episode lasts 1 to 2 × `RLJOB_BENCH_TURNS` − 1 model turns (uniform, so `RLJOB_BENCH_TURNS` on average),
whatever the model says; each step takes a log-normal time (σ 0.5) whose mean is `RLJOB_BENCH_STEP_MS`, as
tool calls and sandboxes have a long tail. Both are drawn from the episode's seed alone, so that both loops
of the benchmark play exactly the same episodes and wait exactly as long for each step.
"""

from __future__ import annotations

import asyncio
import math
import os
import random
import zlib
from typing import Any

SIGMA = 0.5  # of the step time's log: the slowest of 64 steps is ~3× the mean


def _rng(seed: int, what: str) -> random.Random:
    return random.Random(zlib.crc32(f"{seed}/{what}".encode()))


def episode_turns(seed: int, mean_turns: int) -> int:
    """Model turns of the episode seeded `seed`: uniform in 1 .. 2 × mean_turns − 1."""
    return _rng(seed, "turns").randint(1, 2 * mean_turns - 1)


def step_seconds(seed: int, turn: int, mean_ms: float) -> float:
    """Time of step `turn` of the episode seeded `seed`: log-normal with mean `mean_ms`."""
    mu = math.log(mean_ms / 1000.0) - SIGMA**2 / 2
    return _rng(seed, f"step{turn}").lognormvariate(mu, SIGMA)


class PacedGame:
    """`reset` answers at once; each `step` takes its time and says how many turns are left."""

    name = "paced-game"

    def __init__(self) -> None:
        self.mean_ms = float(os.environ.get("RLJOB_BENCH_STEP_MS", "100"))
        self.mean_turns = int(os.environ.get("RLJOB_BENCH_TURNS", "3"))
        self.seed, self.turn, self.turns = 0, 0, 1

    def reset(self, task: dict[str, Any], seed: int = 0) -> str:
        self.seed, self.turn, self.turns = seed, 0, episode_turns(seed, self.mean_turns)
        return ""

    async def step(self, action: str) -> tuple[str, float, bool]:
        self.turn += 1
        await asyncio.sleep(step_seconds(self.seed, self.turn, self.mean_ms))
        left = self.turns - self.turn
        return (f" {left} left. ", 0.0, False) if left > 0 else ("", 1.0, True)
