"""reward-curve.png: each train step's mean reward with its band, the held-out eval's reward beside it, and
with spec.environment the model turns per episode (pure series, then one matplotlib Figure)."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

from rljob_workers.driver.telemetry.eval_log import read_evals
from rljob_workers.driver.telemetry.files import EVAL_JSONL

Series = tuple[list[float], list[float]]  # steps, values


def reward_band(rows: list[dict[str, Any]]) -> tuple[list[float], list[float]]:
    """Each step's mean ± std, kept inside the rewards the run observed: a 0/1 reward's band would otherwise
    reach below 0 and above 1, values no sample can have. Steps written before reward_min/reward_max were
    recorded are not clamped."""
    lows = [r["reward_min"] for r in rows if "reward_min" in r]
    highs = [r["reward_max"] for r in rows if "reward_max" in r]
    floor, ceiling = (min(lows), max(highs)) if lows and highs else (-math.inf, math.inf)
    below = [max(r["reward_mean"] - r["reward_std"], floor) for r in rows]
    above = [min(r["reward_mean"] + r["reward_std"], ceiling) for r in rows]
    return below, above


def curve_series(rows: list[dict[str, Any]], evals: list[dict[str, Any]]) -> dict[str, Series]:
    """What the curve draws, by label: the train steps' mean reward, the eval rounds' (if any) and the turns
    per episode of the steps that played episodes (if any)."""
    series: dict[str, Series] = {"mean reward": ([r["step"] for r in rows], [r["reward_mean"] for r in rows])}
    if evals:
        series["eval reward"] = ([e["step"] for e in evals], [e["reward_mean"] for e in evals])
    played = [r for r in rows if "turns_mean" in r.get("episodes", {})]
    if played:
        series["turns per episode"] = ([r["step"] for r in played], [r["episodes"]["turns_mean"] for r in played])
    return series


def plot_rewards(jsonl: Path, png: Path, title: str = "") -> Path:
    """The reward curve of a run (metrics.jsonl, and eval.jsonl beside it) as a PNG. Figure, not pyplot: no
    global state, so it may draw in a thread, and no pyplot import (a second here)."""
    from matplotlib.figure import Figure

    rows = [json.loads(line) for line in jsonl.read_text().splitlines() if line.strip()]
    evals = read_evals(jsonl.parent / EVAL_JSONL)
    series = curve_series(rows, evals)
    fig = Figure(figsize=(7, 4))
    ax = fig.subplots()
    ax.plot(*series["mean reward"], label="mean reward")
    ax.fill_between(series["mean reward"][0], *reward_band(rows), alpha=0.2)
    if "eval reward" in series:
        ax.plot(*series["eval reward"], "o-", label="eval reward")
    ax.set_xlabel("train step")
    ax.set_ylabel("reward")
    ax.set_title(title or png.stem)
    ax.grid(alpha=0.3)
    handles, labels = ax.get_legend_handles_labels()
    if "turns per episode" in series:
        turns = ax.twinx()
        turns.plot(*series["turns per episode"], "--", color="tab:green", label="turns per episode")
        turns.set_ylabel("model turns per episode")
        more, names = turns.get_legend_handles_labels()
        handles, labels = handles + more, labels + names
    ax.legend(handles, labels)
    fig.tight_layout()
    fig.savefig(png, dpi=100)
    return png
