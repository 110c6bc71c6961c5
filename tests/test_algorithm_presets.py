"""spec.algorithm's presets: what each one resolves to, that a job's own settings win, that grpo is
exactly the behaviour from before presets existed, and the rules that name the field they break."""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import pytest
import yaml

from rljob_api import AlgorithmSpec, RLJobInvalid, derive_worker_configs, parse_rljob, resolve_algorithm
from rljob_api.crd import openapi_schema
from rljob_api.presets import PRESETS, SETTINGS
from rljob_api.reference import presets_markdown, reference_markdown
from rljob_workers.driver.cli import main

from conftest import REPO


def resolved(name: str, max_new_tokens: int = 100, **settings: Any) -> dict[str, Any]:
    spec = AlgorithmSpec.model_validate({"name": name, "promptsPerStep": 4, **settings})
    return resolve_algorithm(spec, max_new_tokens).to_wire()


def test_grpo_is_the_behaviour_before_presets() -> None:
    # The fields AlgorithmSpec had, at the defaults they had: token-mean, std-scaled, 0.2/0.2, no KL.
    algo = resolved("grpo")
    assert {k: algo[k] for k in ("lossAggregation", "scaleRewardsByStd", "clipLow", "clipHigh", "klCoef")} == {
        "lossAggregation": "token-mean",
        "scaleRewardsByStd": True,
        "clipLow": 0.2,
        "clipHigh": 0.2,
        "klCoef": 0.0,
    }
    assert algo["advantageEstimator"] == "group-relative" and algo["ratioLevel"] == "token"
    assert algo["klEstimator"] == "k3" and algo["klIn"] == "loss"  # grpo_loss's k3, in the loss
    assert algo["dynamicSampling"]["enabled"] is False and algo["overlong"]["penalty"] == 0.0
    assert algo["overlong"]["maskTruncated"] is False


@pytest.mark.parametrize(
    ("name", "expected"),
    [
        ("dr_grpo", {"scaleRewardsByStd": False, "lossAggregation": "token-sum-norm", "lossNormTokens": 100}),
        ("dapo", {"clipHigh": 0.28, "dynamicSampling": {"enabled": True, "maxExtraGroups": 40}}),
        ("dapo", {"overlong": {"bufferTokens": 20, "penalty": 1.0, "maskTruncated": False}}),
        ("gspo", {"ratioLevel": "sequence", "clipLow": 3e-4, "clipHigh": 4e-4, "lossAggregation": "sequence-mean"}),
        ("rloo", {"advantageEstimator": "leave-one-out", "scaleRewardsByStd": False}),
        ("reinforce_pp", {"advantageEstimator": "batch-normalized", "klIn": "reward", "klEstimator": "k1"}),
        ("reinforce_pp", {"klCoef": 0.01}),
        ("reinforce_pp_baseline", {"advantageEstimator": "group-mean-batch-normalized", "klIn": "loss"}),
    ],
)
def test_each_preset_sets_its_papers_settings(name: str, expected: dict[str, Any]) -> None:
    algo = resolved(name)
    assert {k: algo[k] for k in expected} == expected


def test_a_jobs_own_setting_wins_over_its_preset() -> None:
    algo = resolved("dapo", clipHigh=0.3, dynamicSampling={"enabled": False}, overlong={"bufferTokens": 7})
    assert algo["clipHigh"] == 0.3 and algo["dynamicSampling"]["enabled"] is False
    assert algo["overlong"] == {"bufferTokens": 7, "penalty": 1.0, "maskTruncated": False}
    assert resolved("gspo", clipLow=0.001)["clipLow"] == 0.001
    assert resolved("dr_grpo", lossNormTokens=64)["lossNormTokens"] == 64


def test_defaults_that_follow_the_job() -> None:
    # Dr. GRPO's constant is the generation budget; DAPO's buffer a fifth of it (at least 1 token);
    # maxExtraGroups 10 steps' worth of groups.
    assert resolved("dr_grpo", max_new_tokens=512)["lossNormTokens"] == 512
    assert resolved("dapo", max_new_tokens=512)["overlong"]["bufferTokens"] == 102
    assert resolved("dapo", max_new_tokens=3)["overlong"]["bufferTokens"] == 1
    assert resolved("dapo", promptsPerStep=16)["dynamicSampling"]["maxExtraGroups"] == 160


def test_the_workers_receive_the_resolved_algorithm(example_doc: dict) -> None:
    example_doc["spec"]["algorithm"]["name"] = "dapo"
    configs = derive_worker_configs(parse_rljob(example_doc))
    assert configs.trainer.algorithm == configs.controller.algorithm
    assert configs.controller.algorithm.clip_high == 0.28
    assert configs.controller.algorithm.overlong.buffer_tokens == 1  # maxNewTokens 5 // 5


def _invalid(example_doc: dict, **algorithm: Any) -> str:
    doc = copy.deepcopy(example_doc)
    doc["spec"]["algorithm"].update(algorithm)
    with pytest.raises(RLJobInvalid) as info:
        parse_rljob(doc)
    assert len(info.value.errors) == 1, info.value.errors
    return str(info.value.errors[0])


@pytest.mark.parametrize(
    ("settings", "message"),
    [
        (
            {"name": "rloo", "scaleRewardsByStd": True},
            "spec.algorithm.scaleRewardsByStd: applies to advantageEstimator group-relative only, not leave-one-out",
        ),
        (
            {"klIn": "reward"},
            "spec.algorithm.klIn: klIn reward (the KL in each token's return) needs advantageEstimator "
            "batch-normalized, not group-relative",
        ),
        (
            {"name": "reinforce_pp", "advantageEstimator": "leave-one-out"},
            "spec.algorithm.advantageEstimator: klIn reward (the KL in each token's return) needs "
            "advantageEstimator batch-normalized, not leave-one-out",
        ),
        (
            {"lossNormTokens": 64},
            "spec.algorithm.lossNormTokens: applies to lossAggregation token-sum-norm only, not token-mean",
        ),
        (
            {"dynamicSampling": {"maxExtraGroups": 5}},
            "spec.algorithm.dynamicSampling.maxExtraGroups: applies only with dynamicSampling.enabled",
        ),
        ({"name": "ppo"}, "spec.algorithm.name: 'ppo' is not one of 'grpo', 'dr_grpo', 'dapo', 'gspo', 'rloo', "),
        ({"ratioLevel": "word"}, "spec.algorithm.ratioLevel: 'word' is not one of 'token' or 'sequence'"),
        ({"klEstimator": "k4"}, "spec.algorithm.klEstimator: 'k4' is not one of 'k1', 'k2' or 'k3'"),
        ({"overlong": {"bufferTokens": 0}}, "spec.algorithm.overlong.bufferTokens: Input should be greater than"),
        ({"overlong": {"bufferTokens": 6}}, "spec.algorithm.overlong.bufferTokens: 6 is more than rollout.sampling"),
    ],
)
def test_a_setting_that_cannot_apply_is_refused_naming_it(example_doc: dict, settings: dict, message: str) -> None:
    assert _invalid(example_doc, **settings).startswith(message)


def test_each_rule_has_a_cel_twin_that_the_api_server_checks() -> None:
    spec = openapi_schema()["properties"]["spec"]
    messages = [rule["message"] for rule in spec["properties"]["algorithm"]["x-kubernetes-validations"]]
    for words in ("scaleRewardsByStd", "klIn reward", "lossNormTokens", "maxExtraGroups"):
        assert any(words in message for message in messages), words
    assert any("bufferTokens" in rule["message"] for rule in spec["x-kubernetes-validations"])
    # The CEL rules read each preset's default from the same table (an unset field is the preset's).
    rloo = next(
        r["rule"] for r in spec["properties"]["algorithm"]["x-kubernetes-validations"] if "scaleRewards" in r["rule"]
    )
    assert '"rloo": "leave-one-out"' in rloo and '"grpo": "group-relative"' in rloo


def test_the_reference_lists_every_setting_its_default_per_preset_and_its_paper() -> None:
    text = reference_markdown()
    table = text[text.index("## Algorithm presets") : text.index("## Status")]
    header = (
        "| setting | `grpo` | `dr_grpo` | `dapo` | `gspo` | `rloo` | `reinforce_pp` | `reinforce_pp_baseline` | from |"
    )
    assert header in table
    for path in SETTINGS:
        assert f"| `{path}` |" in table, path
    assert "| `clipHigh` | `0.2` | `0.2` | `0.28` | `0.0004` | `0.2` | `0.2` |" in table
    for paper in ("2402.03300", "2503.20783", "2503.14476", "2507.18071", "2402.14740", "2501.03262"):
        assert paper in table
    assert len(PRESETS) == 7


def test_rljob_validate_prints_the_algorithm_the_job_will_run(
    example_doc: dict, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    example_doc["spec"]["algorithm"].update(name="gspo", clipHigh=0.001)
    job = tmp_path / "job.yaml"
    job.write_text(yaml.safe_dump(example_doc))
    assert main(["validate", str(job)]) == 0
    line = capsys.readouterr().out.splitlines()[1]
    assert line.startswith('  algorithm gspo: advantageEstimator "group-relative", scaleRewardsByStd true, ')
    assert 'ratioLevel "sequence", clipLow 0.0003, clipHigh 0.001, ' in line  # the job's own clipHigh
    assert "lossNormTokens 5, " in line and "overlong.bufferTokens 1, " in line  # maxNewTokens 5 follows


def test_the_algorithms_guide_quotes_the_references_preset_table() -> None:
    table = "\n".join(line for line in presets_markdown() if line.startswith("|"))
    guide = (REPO / "docs" / "algorithms.md").read_text()
    assert table in guide, "docs/algorithms.md's preset table differs from docs/reference.md's"
