"""What the controller needs of the pools it drives: the trainer pool (Ray actors behind `RayTrainer`) and the
reward pool (the router). The controller is written against these, so that tests drive it with plain
objects and the pools' adapters stay outside it."""

from __future__ import annotations

from typing import Any, Protocol

from rljob.v1 import sample_pb2
from rljob_workers.trainer.samples import TrainSample


class Trainer(Protocol):
    """What the controller needs of the trainer pool (Ray actors behind it)."""

    async def train_step(self, samples: list[TrainSample]) -> dict[str, float]: ...
    async def save_checkpoint(self, step: int, version: int, controller_state: dict[str, Any]) -> str: ...


class Scorer(Protocol):
    """What the controller needs of the reward pool (the router)."""

    async def score(self, sample: sample_pb2.RewardSample) -> sample_pb2.SampleScore: ...
    async def score_many(self, samples: list[sample_pb2.RewardSample]) -> list[sample_pb2.SampleScore]: ...
