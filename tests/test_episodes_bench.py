"""benchmarks/episodes: its environment's draws, and one short real run of both loops on the same episodes."""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
from types import ModuleType

import pytest

from rljob_workers.driver.controller.episodes import episode_seed

from conftest import REPO, load_script

BENCH = REPO / "benchmarks" / "episodes"


@pytest.fixture(scope="module")
def game() -> ModuleType:
    return load_script(BENCH / "paced_game.py", "bench_paced_game")


def test_the_game_draws_each_episode_from_its_seed_alone(game: ModuleType) -> None:
    turns = [game.episode_turns(seed, 3) for seed in range(4000)]
    assert set(turns) == {1, 2, 3, 4, 5} and statistics.mean(turns) == pytest.approx(3, abs=0.1)
    steps = [game.step_seconds(seed, turn, 100.0) for seed in range(4000) for turn in (1, 2, 3)]
    assert statistics.mean(steps) == pytest.approx(0.1, rel=0.03), "the mean step time is the one asked for"
    assert max(steps) > 3 * 0.1, "a long tail"
    assert game.step_seconds(7, 2, 100.0) == game.step_seconds(7, 2, 100.0) != game.step_seconds(7, 3, 100.0)


def test_streamed_episodes_outrun_the_turn_synchronous_loop_on_the_same_episodes(game: ModuleType, tmp_path) -> None:
    out = tmp_path / "episodes.json"
    episodes, mean_turns = 96, 2
    command = [sys.executable, str(BENCH / "run.py"), "--episodes", str(episodes), "--in-flight", "16"]
    command += ["--turns", str(mean_turns), "--latencies-ms", "200", "--json", str(out)]
    run = subprocess.run(command, capture_output=True, text=True, timeout=300, cwd=REPO)
    assert run.returncode == 0, run.stderr[-3000:]
    print(run.stdout)
    results = {r["loop"]: r for r in json.loads(out.read_text())}
    # The same episodes both ways: each played to its seed's length, none lost or played twice.
    expected = sum(game.episode_turns(episode_seed(0, f"e0-{i}", 0), mean_turns) for i in range(episodes))
    assert results["streamed"]["episodes"] == results["turn-synchronous"]["episodes"] == episodes
    assert results["streamed"]["turns"] == results["turn-synchronous"]["turns"] == expected
    ratio = results["streamed"]["per_second"] / results["turn-synchronous"]["per_second"]
    assert ratio >= 1.5, f"streamed ÷ turn-synchronous is {ratio:.2f} at 200 ms a step"
    assert "streamed ÷ turn-synchronous:" in run.stdout
