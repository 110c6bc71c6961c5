"""Addition of three-digit numbers with a calculator tool: a task where the tool is the way to the reward.

The tiny model cannot add three-digit numbers (its warm-up never taught it: an answer without the tool is a
guess), but it can call ``calc(a+b)`` and copy what the tool answers. Its warm-up calls the tool on a few
prompts only, so RL has to learn to call it: the reward starts near that share and rises as the policy calls
the tool every time. `NoCalculator` is the same task without the tool, its baseline.

A row is ``{"prompt": "123+456", "answer": "579"}``. An episode's first model turn is a tool call or an answer;
a tool call gets the sum as a ``tool`` message; an answer ends the episode with reward 1.0 when it is the sum.
"""

from __future__ import annotations

import random
import re
import time
from typing import Any

from rljob_workers.tasks.arithmetic import strip_completion

# Three-digit operands whose sums have four digits: every episode has one layout, so what the model copies
# (the operands into its call, the tool's answer into its own) sits at one distance from where it goes.
MIN_OPERAND, MAX_OPERAND = 500, 999
CALL = re.compile(r"^\s*calc\((\d+)\+(\d+)\)\s*$")
TOOL = {
    "type": "function",
    "function": {
        "name": "calc",
        "description": "Add two numbers: calc(a+b).",
        "parameters": {"type": "object", "properties": {"expression": {"type": "string"}}, "required": ["expression"]},
    },
}


def make_problems(n: int, seed: int) -> list[dict[str, str]]:
    """`n` problems with operands drawn from MIN_OPERAND..MAX_OPERAND (the same for the same seed)."""
    rng = random.Random(seed)
    rows = []
    for _ in range(n):
        a, b = rng.randint(MIN_OPERAND, MAX_OPERAND), rng.randint(MIN_OPERAND, MAX_OPERAND)
        rows.append({"prompt": f"{a}+{b}", "answer": str(a + b)})
    return rows


class Calculator:
    """The task's environment: `calc(a+b)` answers the sum; anything else is the final answer."""

    name = "calculator"
    version = "1"
    tools = [TOOL]
    stop = [")"]  # a tool call's end ends the model's turn
    max_turns = 4

    def __init__(self, step_latency_seconds: float = 0.0) -> None:
        # spec.environment.args: a tool that takes time (a sandbox's start, a search), so that the environment
        # pool's elastic scaling shows; the sleep holds one of the replica's threads, as real work would.
        self.step_latency_seconds = float(step_latency_seconds)

    def reset(self, task: dict[str, Any]) -> str:
        # A row's own `step_seconds` (listed in spec.data.fields) wins: a stretch of slow rows, then fast ones.
        self.step_latency_seconds = float(task.get("step_seconds", self.step_latency_seconds))
        self.answer = str(task["answer"]).strip()
        return ""  # the prompt alone starts the episode

    def step(self, action: str) -> tuple[Any, float, bool, dict[str, Any]]:
        if self.step_latency_seconds:
            time.sleep(self.step_latency_seconds)
        call = CALL.match(action)
        if call and self.tools:
            total = int(call.group(1)) + int(call.group(2))
            return [{"role": "tool", "content": str(total)}], 0.0, False, {"tool": "calc"}
        correct = strip_completion(action) == self.answer
        return None, 0.0, True, {"final_reward": 1.0 if correct else 0.0}


class NoCalculator(Calculator):
    """The same task without the tool (the baseline): a tool call is a wrong answer."""

    name = "no-calculator"
    tools: list[dict[str, Any]] = []
    stop: list[str] = []
