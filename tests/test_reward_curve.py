"""reward-curve.png's series: the training reward always, the held-out eval's rounds and the turns per episode
when the run has them; the PNG drawn from the run's files as they are written."""

from __future__ import annotations

import json
from pathlib import Path

from rljob_workers.driver.telemetry.curve import curve_series, plot_rewards


def _step(step: int, reward: float, turns: float | None = None) -> dict[str, object]:
    row: dict[str, object] = {"step": step, "reward_mean": reward, "reward_std": 0.1, "reward_min": 0.0}
    row["reward_max"] = 1.0
    if turns is not None:
        row["episodes"] = {"turns_mean": turns}
    return row


def test_a_plain_run_draws_its_training_reward_only() -> None:
    series = curve_series([_step(1, 0.2), _step(2, 0.4)], [])
    assert series == {"mean reward": ([1, 2], [0.2, 0.4])}


def test_eval_rounds_and_turns_per_episode_are_drawn_beside_the_training_reward(tmp_path: Path) -> None:
    rows = [_step(1, 0.2, 1.1), _step(2, 0.5, 1.6), _step(3, 0.9, 2.0)]
    evals = [{"step": 0, "reward_mean": 0.0}, {"step": 3, "reward_mean": 0.95}]
    series = curve_series(rows, evals)
    assert series["eval reward"] == ([0, 3], [0.0, 0.95])
    assert series["turns per episode"] == ([1, 2, 3], [1.1, 1.6, 2.0])
    (tmp_path / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in rows))
    (tmp_path / "eval.jsonl").write_text("".join(json.dumps(e) + "\n" for e in evals))
    png = plot_rewards(tmp_path / "metrics.jsonl", tmp_path / "reward-curve.png", "demo")
    assert png.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
