"""The run's own ledger, read back from its metrics.jsonl: every prompt trained once (or, under dynamic
sampling, filtered once instead), every sample scored once, whatever died on the way (the fault
benchmark, the real-node fault test and the dynamic-sampling test read it)."""

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
    filtered: int = 0  # prompts whose groups dynamic sampling dropped (all rewards equal): done, not trained
    filtered_twice: int = 0  # prompts filtered more than once, or filtered and trained

    @property
    def clean(self) -> bool:
        return self.prompts_lost == self.trained_twice == self.scored_twice == self.filtered_twice == 0


def read_ledger(metrics: Path, steps: int, per_step: int) -> Ledger:
    """Read the ledger. Every generated sample is scored (or excluded) at most once, and trained, set aside
    as stale, filtered or left out of the loss only once scored: at every step, scored + excluded <=
    generated and trained + stale + filtered + masked <= scored; any excess is a sample counted twice."""
    records = [json.loads(line) for line in metrics.read_text().splitlines() if line.strip()]
    trained = [p for r in records for p in r["prompt_ids"]]
    filtered = [p for r in records for p in r.get("filtered_prompt_ids", [])]
    excess = 0
    for r in records:
        c = r["counts"]
        excess = max(excess, c["scored"] + c["excluded_reward_error"] - c["generated"])
        set_aside = c["discarded_stale"] + c.get("filtered", 0) + c.get("masked_truncated", 0)
        excess = max(excess, c["trained"] + set_aside - c["scored"])
    used_up = trained + filtered
    return Ledger(
        records,
        prompts_lost=steps * per_step - len(set(trained)),
        trained_twice=len(trained) - len(set(trained)),
        scored_twice=excess,
        filtered=len(set(filtered)),
        filtered_twice=len(used_up) - len(set(used_up)) - (len(trained) - len(set(trained))),
    )
