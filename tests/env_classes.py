"""Environment classes the environment tests serve (imported by `module:Class`, as a job names them)."""

from __future__ import annotations

import asyncio
import os
import signal
from typing import Any

from rljob_workers.environment import InvalidAction
from rljob_workers.tasks.calculator import CALL, Calculator


class Countdown:
    """Answers each turn with the turns left; done after `task['turns']` turns, the final reward 1."""

    name = "countdown"
    max_turns = 5

    def reset(self, task: dict[str, Any], seed: int = 0) -> str:
        self.left, self.seed = int(task.get("turns", 2)), seed
        return f"seed {seed}"

    def step(self, action: str) -> tuple[Any, float, bool, dict[str, Any]]:
        self.left -= 1
        if self.left <= 0:
            return None, 0.5, True, {"final_reward": 1.0, "metrics": {"length": float(len(action))}}
        return f" {self.left} left ", 0.25, False, {}


class AsyncGym:
    """Async, gymnasium-shaped: reset -> (observation, info), step -> 5-tuple."""

    async def reset(self, task: dict[str, Any]) -> tuple[str, dict[str, Any]]:
        await asyncio.sleep(0)
        return "go", {}

    async def step(self, action: str) -> tuple[str, float, bool, bool, dict[str, Any]]:
        return "", 1.0, False, True, {}


class Broken:
    """Every kind of bad answer, chosen by the action's text."""

    def reset(self, task: dict[str, Any]) -> str:
        return ""

    def step(self, action: str) -> Any:
        if action == "invalid":
            raise InvalidAction("cannot go on from that")
        if action == "nan":
            return "x", float("nan"), False
        if action == "shape":
            return 42
        if action == "slow":
            import time

            time.sleep(5)
        raise RuntimeError("the sandbox died")


class DiesOnSecondTurn:
    """Kills its own process at an episode's second turn (a lost environment replica), once per marker file."""

    def reset(self, task: dict[str, Any]) -> str:
        self.turn = 0
        return ""

    def step(self, action: str) -> tuple[Any, float, bool]:
        self.turn += 1
        marker = os.environ.get("RLJOB_TEST_DIE_MARKER", "")
        if self.turn == 2 and marker and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return (None, 1.0, True) if self.turn >= 2 else ("more", 0.0, False)


class CalculatorDiesAtACall(Calculator):
    """The calculator, whose process dies at the first tool call it answers, once per marker file (a lost
    environment replica, mid-episode: the call made, its answer not given)."""

    def step(self, action: str) -> tuple[Any, float, bool, dict[str, Any]]:
        marker = os.environ.get("RLJOB_TEST_DIE_MARKER", "")
        if CALL.match(action) and marker and not os.path.exists(marker):
            open(marker, "w").close()
            os.kill(os.getpid(), signal.SIGKILL)
        return super().step(action)


class TokenRecorder:
    """Two turns; writes each turn's text and token ids as it got them to the JSONL file RLJOB_TEST_TOKENS.
    Its observation is text a BPE tokenizer merges (`12`, `+3`...), so encoding it in context would differ."""

    name = "token-recorder"
    observation = " 12+34=46 ok"

    def reset(self, task: dict[str, Any]) -> str:
        self.turn = 0
        return ""

    def step(self, action: str, token_ids: list[int]) -> tuple[Any, float, bool, dict[str, Any]]:
        import json

        with open(os.environ["RLJOB_TEST_TOKENS"], "a") as out:  # one short append a line: whole lines
            out.write(json.dumps({"text": action, "token_ids": token_ids}) + "\n")
        self.turn += 1
        if self.turn >= 2:
            return None, 0.0, True, {"final_reward": float(len(action) % 2)}
        return self.observation, 0.5, False, {}
