"""Each algorithm preset learns the shipped example, and DAPO's dynamic sampling works end to end: `rljob run`
of examples/arithmetic.yaml in a subprocess, read back from the metrics.jsonl it writes.

The tiny model is conftest's `example_model`, made once for all the tests that train it (about 50 s of CPU).
A run stops itself as soon as its last five steps' mean reward reaches 0.8 (SIGINT: a graceful stop, as
`benchmarks/algorithms` does); each preset's step budget is the most steps it may take, set about 1.5 times
the slowest of 3 seeds in that benchmark. The module takes 3 to 4 minutes on 2 cores, the model's build
included. The grpo run is also the shipped example's learning test: it starts weak, learns, and leaves a
checkpoint.
"""

from __future__ import annotations

import signal
import statistics
import sys
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_workers.driver.telemetry.ledger import read_ledger
from rljob_workers.driver.telemetry.metrics import first_reaching, read_metrics
from rljob_workers.tasks.arithmetic import make_problems, write_jsonl

from conftest import REPO, run_until_learned

pytestmark = pytest.mark.ray

TARGET, WINDOW = 0.8, 5
# Most steps each preset may take to reach TARGET (benchmarks/algorithms, 3 seeds: benchmarks/README.md), and the
# settings beside the preset where the example's do not suit it.
BUDGETS: dict[str, tuple[int, dict[str, Any]]] = {
    "grpo": (70, {}),
    "dr_grpo": (70, {}),
    "dapo": (90, {}),
    # GSPO's sequence clip range (3e-4, 4e-4) is for a policy barely moved from the sampler's: one step
    # off-policy at the example's learning rate, most sequences' ratios leave it (their gradient is cut).
    "gspo": (70, {"maxStaleness": 0}),
    "rloo": (70, {}),
    "reinforce_pp": (70, {}),
}


@pytest.fixture(scope="module")
def example(tmp_path_factory: pytest.TempPathFactory, example_model: Path) -> dict[str, Path]:
    """The example's model and prompts, as `make model` makes them."""
    root = tmp_path_factory.mktemp("example")
    return {
        "model": example_model,
        "data": write_jsonl(root / "train.jsonl", make_problems(2048, seed=10_000)),
    }


def run_example(
    work: Path, example: dict[str, Path], algorithm: dict[str, Any], **spec: Any
) -> tuple[int, str, list, int | None]:
    """`rljob run` of the shipped example with `algorithm`'s settings (and any of `spec`'s), stopped once it
    reaches TARGET; (exit code, its output, metrics.jsonl's records, steps recorded when it was signalled)."""
    doc = yaml.safe_load((REPO / "examples" / "arithmetic.yaml").read_text())
    doc["spec"]["model"]["path"], doc["spec"]["data"]["path"] = str(example["model"]), str(example["data"])
    doc["spec"]["algorithm"].update(algorithm)
    doc["spec"]["checkpoint"]["dir"] = str(work / "checkpoints")
    doc["spec"].update(spec)
    job = work / "job.yaml"
    job.write_text(yaml.safe_dump(doc))
    metrics, log = work / "out" / "metrics.jsonl", work / "run.log"
    command = [
        str(Path(sys.executable).parent / "rljob"),
        "run",
        str(job),
        "--no-display",
        "--output",
        str(work / "out"),
    ]
    run = run_until_learned(command, log, metrics, TARGET, WINDOW)
    return run.returncode, log.read_text(), records_of(metrics), run.steps_when_signalled


def records_of(metrics: Path) -> list[dict[str, Any]]:
    return read_metrics(metrics)


def reached(records: list[dict[str, Any]]) -> dict[str, Any] | None:
    return first_reaching(records, TARGET, WINDOW)


@pytest.mark.parametrize("preset", list(BUDGETS))
def test_each_preset_learns_the_example(preset: str, example: dict[str, Path], tmp_path: Path) -> None:
    budget, settings = BUDGETS[preset]
    rc, out, records, signalled = run_example(tmp_path, example, {"name": preset, "totalSteps": budget, **settings})
    rewards = [r["reward_mean"] for r in records]
    print(f"{preset}: {len(rewards)} steps, rewards {[round(r, 2) for r in rewards]}")
    assert rc in (0, 128 + signal.SIGINT), out[-3000:]
    # The weak base model (its reward about 0.13): one step's 128 samples of 16 prompts scatter about 0.03 from
    # run to run, so step 1, the only one all sampled from the base model, is held to 0.25, four of those above.
    # (Step 2's samples may come from the policy after one update: GSPO's reached 0.27 there, in CI.)
    assert rewards[0] <= 0.25, rewards[:2]
    hit = reached(records)
    assert hit is not None, f"{preset}: last {WINDOW} steps' mean {statistics.fmean(rewards[-WINDOW:]):.2f}"
    assert hit["step"] <= budget
    # Stopped at once: the step in progress and at most one more (one step stale) after the SIGINT. Counted
    # from the signal, not the hit: the test's poll of metrics.jsonl may see the hit a few fast steps late.
    assert signalled is not None and len(records) <= signalled + 2, (hit["step"], signalled, len(records))
    # Stopped by SIGINT once it learned: the stop left a complete checkpoint, which `latest` names.
    checkpoints = tmp_path / "checkpoints"
    assert (checkpoints / (checkpoints / "latest").read_text().strip() / "state.json").is_file()


def test_dynamic_sampling_drops_the_groups_with_nothing_to_learn(example: dict[str, Path], tmp_path: Path) -> None:
    # Three prompts in four are easy (any answer earns 1): their groups are all-correct from the start. A hard
    # prompt's group is all wrong about one time in three at first (the base model's 0.13 reward, 8 samples).
    problems = make_problems(1024, seed=20_000)
    rows = [dict(p, easy=str(int(i % 4 != 0))) for i, p in enumerate(problems)]
    data = write_jsonl(tmp_path / "mostly-easy.jsonl", rows)
    steps, per_step = 8, 4
    reward = {
        "functions": [{"name": "exact-or-easy", "kind": "rule", "rule": {"function": "reward_fns:exact_or_easy"}}],
        "replicas": {"min": 1, "max": 1},
        "onError": "fail",
    }
    doc_data = {"path": str(data), "promptField": "prompt", "fields": ["answer", "easy"]}
    # The prompts come in the seeded order of the example: a step's groups to learn from may sit behind a run of
    # 20 easy prompts, each hard one behind it all wrong or all right at times, so that one step in a run drops
    # more than the preset's 40 groups about one run in 50 (simulated). That limit's failure is test_dynamic_sampling's.
    algorithm = {
        "name": "dapo",
        "promptsPerStep": per_step,
        "totalSteps": steps,
        "overlong": {"penalty": 0.0},
        "dynamicSampling": {"maxExtraGroups": 256},
    }
    rc, out, records, _ = run_example(tmp_path, example, algorithm, reward=reward, data=doc_data)
    assert rc == 0, out[-3000:]
    assert len(records) == steps
    filtered = [p for r in records for p in r["filtered_prompt_ids"]]
    trained = [p for r in records for p in r["prompt_ids"]]
    # Every trained step held promptsPerStep groups with something to learn: rewards neither all 0 nor all 1.
    for record in records:
        assert len(record["prompt_ids"]) == per_step
        assert all(0 < mean < 1 for mean in record["group_reward_means"]), record["group_reward_means"]
        assert all(mean in (0.0, 1.0) for mean in record["filtered_reward_means"])
    # Most groups were dropped, the easy ones among them; an easy prompt is never trained.
    assert len(filtered) > len(trained)
    assert all(rows[int(p.rsplit("-", 1)[1])]["easy"] == "0" for p in trained)
    last = records[-1]["counts"]
    assert last["filtered_groups"] == len(filtered) and last["filtered"] == 8 * len(filtered)
    # The ledger of benchmarks/faults: every prompt trained once or filtered once, every sample scored once.
    books = read_ledger(tmp_path / "out" / "metrics.jsonl", steps, per_step)
    assert books.clean, books
    assert books.filtered == len(filtered)
    # ... and the run's final status says so.
    assert f"{len(filtered)} groups ({8 * len(filtered)} samples) with all-equal rewards" in out
