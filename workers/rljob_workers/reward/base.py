"""What every reward kind shares: the error classes, the failure a kind raises, the protocol of a non-rule kind."""

from __future__ import annotations

from typing import Protocol, runtime_checkable

from rljob.v1 import sample_pb2

INVALID = sample_pb2.ERROR_CLASS_INVALID
FUNCTION = sample_pb2.ERROR_CLASS_FUNCTION
TRANSIENT = sample_pb2.ERROR_CLASS_TRANSIENT

ERROR_CLASS_NAMES: dict[int, str] = {INVALID: "invalid", FUNCTION: "function", TRANSIENT: "transient"}


class RewardConfigError(ValueError):
    """A reward function that cannot be loaded or built; the message names the function."""


class ScoreFailure(Exception):
    """A kind could not score a sample: becomes that sample's error, with this class and message as they are."""

    def __init__(self, error_class: int, message: str) -> None:
        super().__init__(message)
        self.error_class = error_class
        self.message = message


@runtime_checkable
class SampleScorer(Protocol):
    """A reward kind other than `rule`: scores one whole sample (remote, disrm, genrm).

    `score_sample` returns the unweighted score or raises ScoreFailure; any other exception is a
    FUNCTION error. A scorer with `manages_deadline` enforces the job's timeout itself (with its
    own, more precise message); the others are cut off by the function set at the timeout.
    """

    kind: str
    manages_deadline: bool

    async def score_sample(self, sample: sample_pb2.RewardSample) -> float: ...

    async def close(self) -> None: ...
