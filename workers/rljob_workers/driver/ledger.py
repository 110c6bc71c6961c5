"""The run's own ledger, read back from its metrics.jsonl: every prompt trained once, every sample
scored once, whatever died on the way (the fault benchmark and the real-node fault test read it)."""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any


@dataclass
class Ledger:
    """What the run's own metrics.jsonl says it did with its prompts and samples."""

    records: list[dict[str, Any]]
    prompts_lost: int  # never trained
    trained_twice: int  # prompts
    scored_twice: int  # samples: scores counted beyond the samples generated (re-sent samples counted again)

    @property
    def clean(self) -> bool:
        return self.prompts_lost == self.trained_twice == self.scored_twice == 0


def read_ledger(metrics: Path, steps: int, per_step: int) -> Ledger:
    """Read the ledger. Every generated sample is scored (or excluded) at most once, and trained or set
    aside only once scored: at every step, scored + excluded <= generated and trained + stale <= scored;
    any excess is a sample counted twice."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    trained = [p for r in records for p in r["prompt_ids"]]
    excess = 0
    for r in records:
        c = r["counts"]
        excess = max(excess, c["scored"] + c["excluded_reward_error"] - c["generated"])
        excess = max(excess, c["trained"] + c["discarded_stale"] - c["scored"])
    return Ledger(records, steps * per_step - len(set(trained)), len(trained) - len(set(trained)), excess)
