"""Multi-turn episodes under `rljob run` (spec.environment), at the process boundary: the shipped tool example
learns to call its calculator and copy the answer while the same job without the tool does not, both runs
side by side; each spec an environment cannot run with is refused in one line naming its field, within 2 s,
before Ray starts."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_workers.driver.telemetry.curve import curve_series, reward_band
from rljob_workers.driver.telemetry.eval_log import read_evals

from conftest import REPO

RLJOB = str(Path(sys.executable).parent / "rljob")
REFUSED_WITHIN_SECONDS = 2.0  # the bar: an environment's checks are an import or one Info call
LAST_STEPS = 5


def _job(example: str, work: Path, assets: dict[str, Path], edit: Any = None) -> Path:
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    spec = doc["spec"]
    spec["model"]["path"], spec["data"]["path"] = str(assets["model"]), str(assets["data"])
    spec["data"]["eval"]["path"] = str(assets["eval"])
    spec["checkpoint"]["dir"] = str(work / "checkpoints")
    if edit is not None:
        edit(spec)
    work.mkdir(parents=True, exist_ok=True)
    path = work / "job.yaml"
    path.write_text(yaml.safe_dump(doc))
    return path


def _run(job: Path, out: Path) -> list[dict[str, Any]]:
    done = subprocess.run(
        [RLJOB, "run", str(job), "--no-display", "--output", str(out)], capture_output=True, text=True, timeout=600
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]


def test_the_tool_example_learns_to_call_and_copy_and_its_baseline_does_not(calculator, tmp_path: Path) -> None:
    tool = _run(_job("calculator.yaml", tmp_path / "tool", calculator), tmp_path / "tool" / "out")
    bare = _run(_job("calculator-no-tool.yaml", tmp_path / "bare", calculator), tmp_path / "bare" / "out")
    print("\nstep  reward with the tool  turns/episode  reward without it")
    for with_tool, without in zip(tool, bare, strict=True):
        turns = with_tool["episodes"]["turns_mean"]
        print(
            f"{with_tool['step']:4d}  {with_tool['reward_mean']:20.3f}  {turns:13.2f}  {without['reward_mean']:17.3f}"
        )
    last, last_bare = tool[-LAST_STEPS:], bare[-LAST_STEPS:]
    mean = sum(m["reward_mean"] for m in last) / LAST_STEPS
    bare_mean = sum(m["reward_mean"] for m in last_bare) / LAST_STEPS
    print(f"last {LAST_STEPS} steps: {mean:.3f} with the tool, {bare_mean:.3f} without")
    assert tool[0]["reward_mean"] <= 0.2  # the warm-up calls the tool on about a tenth of the prompts
    assert mean >= 0.8
    # most episodes of the last steps call the tool, then answer: two model turns
    assert all(m["episodes"]["turns_mean"] >= 1.5 for m in last)
    assert all(m["episodes"].get("tool_calls_calc", 0) > 0 for m in last)
    assert bare_mean < 0.5 and len(bare) == len(tool)
    assert all(m["episodes"]["turns_mean"] == 1.0 for m in bare)  # without a tool every episode is one answer
    # reward-curve.png's band: mean ± std spills past a 0/1 reward's range (0.9 ± 0.3); the band drawn does not
    assert max(m["reward_mean"] + m["reward_std"] for m in tool) > 1.0
    below, above = reward_band(tool)
    assert min(below) >= 0.0 and max(above) <= 1.0 and (out := tool[-1])["reward_max"] == 1.0, out
    # The held-out eval plays its episodes too (greedy, sums no training prompt holds), and the curve shows them
    # beside the training reward, with the turns per episode.
    out_dir = tmp_path / "tool" / "out"
    evals = read_evals(out_dir / "eval.jsonl")
    print("eval rounds:", [(e["step"], round(e["reward_mean"], 3), e["rewards"]) for e in evals])
    assert [e["step"] for e in evals] == [0, 10, 20, 30, 40] and all(e["samples"] == 64 for e in evals)
    assert evals[-1]["reward_mean"] >= 0.8 > evals[0]["reward_mean"] and "environment" in evals[-1]["rewards"]
    series = curve_series(tool, evals)
    assert series["eval reward"][0] == [0, 10, 20, 30, 40] and series["turns per episode"][1][-1] >= 1.5
    assert (out_dir / "reward-curve.png").stat().st_size > 10_000


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _remote(spec: dict[str, Any]) -> None:
    spec["environment"] = {"kind": "remote", "remote": {"endpoints": [f"127.0.0.1:{_free_port()}"]}, "maxTurns": 3}


CASES = {
    "maxTurns 0": (lambda s: s["environment"].update(maxTurns=0), "spec.environment.maxTurns"),
    "unknown class": (
        lambda s: s["environment"].update({"class": "rljob_workers.tasks.calculator:Abacus"}),
        "spec.environment.class: ",
    ),
    "unreachable endpoint": (_remote, "spec.environment.remote.endpoints[0]: 127.0.0.1:"),
}


def _refused(job: Path, cwd: Path, env: dict[str, str] | None = None) -> tuple[str, float]:
    started = time.monotonic()
    args = [RLJOB, "run", str(job), "--no-display", "--output", str(cwd / "out")]
    done = subprocess.run(args, capture_output=True, text=True, timeout=120, cwd=cwd, env=env)
    took = time.monotonic() - started
    print(f"refused in {took:.2f}s: {done.stderr.strip()}")
    lines = done.stderr.strip().splitlines()
    if lines and lines[0].endswith(": invalid RLJob"):  # the schema's refusal: the file, then one field a line
        lines = [line.strip() for line in lines[1:]]
    assert done.returncode == 2 and len(lines) == 1 and "Traceback" not in done.stderr, done.stderr[-2000:]
    assert not (cwd / "out").exists(), "nothing of a run may start"
    return lines[0], took


@pytest.mark.parametrize("case", list(CASES))
def test_an_environment_spec_that_cannot_run_is_refused_in_one_line(calculator, tmp_path: Path, case: str) -> None:
    edit, expected = CASES[case]
    line, took = _refused(_job("calculator.yaml", tmp_path, calculator, edit), tmp_path)
    assert line.startswith(expected) or expected in line, line
    assert took < REFUSED_WITHIN_SECONDS


def test_tools_the_model_cannot_see_are_refused_and_a_game_without_tools_is_not(
    calculator, example_model: Path, tmp_path: Path
) -> None:
    # The arithmetic model has no chat template: the calculator's tool would never reach its prompts.
    plain = {**calculator, "model": example_model}
    line, took = _refused(_job("calculator.yaml", tmp_path / "tools", plain), tmp_path / "tools")
    assert line.startswith("spec.environment: 'calculator' offers tools (calc) that the chat template of "), line
    assert took < REFUSED_WITHIN_SECONDS
    # A game (no tools) needs no template: `validate --deep` imports it, reads what it declares, and passes.
    game = _job(
        "calculator.yaml",
        tmp_path / "game",
        plain,
        lambda s: s["environment"].update({"class": "env_classes:Countdown"}),
    )
    env = {**os.environ, "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")])}
    done = subprocess.run(
        [RLJOB, "validate", "--deep", str(game)], capture_output=True, text=True, env=env, timeout=120
    )
    assert done.returncode == 0, done.stderr[-2000:]


def _scrape_until_exit(run: subprocess.Popen[str], port: int) -> dict[tuple[str, tuple[tuple[str, str], ...]], float]:
    """The run's /metrics, scraped every 0.2 s while it runs (its last answer); {} if it never answered."""
    from prometheus_client.parser import text_string_to_metric_families

    last: dict[tuple[str, tuple[tuple[str, str], ...]], float] = {}
    while run.poll() is None:
        try:
            text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=2).read().decode()
        except OSError:
            time.sleep(0.2)
            continue
        last = {
            (sample.name, tuple(sorted((k, v) for k, v in sample.labels.items() if k != "job_name"))): sample.value
            for family in text_string_to_metric_families(text)
            for sample in family.samples
        }
        time.sleep(0.2)
    return last


def test_a_killed_environment_replica_restarts_its_episodes_and_nothing_is_trained_twice(
    calculator, tmp_path: Path
) -> None:
    marker = tmp_path / "died"

    def dying(spec: dict[str, Any]) -> None:
        spec["environment"]["class"] = "env_classes:CalculatorDiesAtACall"
        spec["algorithm"]["totalSteps"] = 6

    job = _job("calculator.yaml", tmp_path, calculator, dying)
    env = {
        **os.environ,
        "RLJOB_TEST_DIE_MARKER": str(marker),
        "PYTHONPATH": os.pathsep.join([str(REPO / "tests"), os.environ.get("PYTHONPATH", "")]),
    }
    out = tmp_path / "out"
    port = _free_port()
    command = [RLJOB, "run", str(job), "--no-display", "--output", str(out), "--metrics-port", str(port)]
    with subprocess.Popen(command, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, env=env) as run:
        scraped = _scrape_until_exit(run, port)
        stdout, stderr = run.communicate(timeout=600)
    done = subprocess.CompletedProcess(command, run.returncode, stdout, stderr)
    told = [line for line in done.stderr.splitlines() if "restarting the episode" not in line]
    assert done.returncode == 0, "\n".join(told[-20:]) + done.stdout[-2000:]
    assert marker.exists(), "the replica never died: the test proves nothing"
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    trained = [prompt for step in steps for prompt in step["prompt_ids"]]
    assert len(steps) == 6 and len(trained) == len(set(trained)) == 6 * 8  # every group once, whole
    assert all(step["samples"] == 64 for step in steps)  # groupSize 8 episodes each: none partial or dropped
    counts = steps[-1]["counts"]
    print(counts, done.stdout[-1500:])
    assert counts["episode_restarts"] >= 1 and counts["environment_errors"] >= 1
    assert sum(step["episodes"].get("environment_errors_lost", 0) for step in steps) >= 1
    assert "environment" in done.stdout and "restart" in done.stdout  # the status names the replacement
    # /metrics, as Prometheus scraped it last before the run ended
    assert scraped[("rljob_episodes_total", (("outcome", "restarted"),))] >= 1
    assert scraped[("rljob_environment_errors_total", (("kind", "lost"),))] >= 1
    assert scraped[("rljob_episodes_total", (("outcome", "played"),))] >= 8 * 5
    assert (
        scraped[("rljob_episode_turns_played_total", ())] >= scraped[("rljob_episodes_total", (("outcome", "played"),))]
    )
    assert 1 <= scraped[("rljob_episode_turns", (("stat", "mean"),))] <= 3
    assert scraped[("rljob_tool_calls_total", (("tool", "calc"),))] >= 1
    assert scraped[("rljob_environment_step_seconds", (("quantile", "0.99"),))] > 0
