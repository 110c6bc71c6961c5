"""The model reward kinds on real tiny torch models: disrm, genrm, the judge rule functions call, and the
metrics of a replica serving them."""

from __future__ import annotations

import asyncio
import time
import urllib.request
from pathlib import Path
from typing import Any

import pytest
from reward_helpers import FUNCTION, INVALID, fn, function_set, run, sample
from transformers import LlamaConfig, LlamaForSequenceClassification

from rljob_api.reward import RewardFunction
from rljob_api.workercfg import RewardWorkerConfig
from rljob_workers.reward import RewardConfigError, RewardFunctionSet, serve_reward
from rljob_workers.reward.disrm import DisRMScorer
from rljob_workers.reward.genrm import GenRMScorer, fill_template, parse_score

from tiny_models import JUDGE_CHARS, save_char_tokenizer, scripted_judge, tiny_rm

# -- disrm ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def rm_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return tiny_rm(tmp_path_factory.mktemp("rm"))


def test_disrm_batches_concurrent_requests_and_matches_unbatched_scores(rm_dir: Path) -> None:
    async def go() -> None:
        rm = fn("rm", "disrm", modelPath=str(rm_dir), batchSize=4, maxWaitMs=200)
        async with function_set(rm) as fs:
            scorer = fs.scorers[0]
            assert isinstance(scorer, DisRMScorer)
            samples = [sample(f"p/{i}", completion="x" * (i + 1) + str(i)) for i in range(10)]
            scores = await asyncio.gather(*(fs.score(s) for s in samples))
            assert sorted(scorer.batch_sizes) == [2, 4, 4], "10 concurrent requests, batches of at most 4"
            alone = [scorer.forward([(s.prompt, s.completion)])[0] for s in samples]
            assert [s.components["rm"] for s in scores] == pytest.approx(alone, abs=1e-5)
            assert len({round(a, 4) for a in alone}) == 10, "the model tells the samples apart"
            start = time.perf_counter()
            await fs.score(sample("q/0"))  # alone: waits maxWaitMs for company, no longer
            assert 0.2 <= time.perf_counter() - start < 1.0 and scorer.batch_sizes[-1] == 1

    run(go())


def test_disrm_config_errors(tmp_path: Path) -> None:
    with pytest.raises(RewardConfigError, match=r"reward function 'rm': cannot load the disrm model at '/nonexistent'"):
        RewardFunctionSet.from_spec([fn("rm", "disrm", modelPath="/nonexistent")], 1.0)
    vocab = save_char_tokenizer(tmp_path, JUDGE_CHARS)
    config = LlamaConfig(vocab_size=len(vocab), hidden_size=16, intermediate_size=16, num_hidden_layers=1,
                         num_attention_heads=2, pad_token_id=0)  # fmt: skip
    config.num_labels = 3
    LlamaForSequenceClassification(config).save_pretrained(tmp_path)
    with pytest.raises(RewardConfigError, match=r"'rm': the disrm model at .* has 3 labels"):
        RewardFunctionSet.from_spec([fn("rm", "disrm", modelPath=str(tmp_path))], 1.0)


# -- genrm ---------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def judges(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("judges")
    return {
        "seven": scripted_judge(root / "seven", {":": "7", "7": "</s>"}),  # answers "7"
        "yes": scripted_judge(root / "yes", {":": "y", "y": "e", "e": "s"}),  # answers "yes"
        "rambles": scripted_judge(root / "rambles", {":": "a", "a": "b", "b": "c"}),  # answers "abc"
    }


def genrm(name: str, path: Path, parser: str = "number", **extra: Any) -> RewardFunction:
    template = "q {prompt} a {completion} ref {answer} score:"
    return fn(name, "genrm", modelPath=str(path), promptTemplate=template, scoreParser=parser, **extra)


@pytest.mark.parametrize(
    ("parser", "text", "pattern", "expected"),
    [
        ("number", "The score is 7/10.", None, 7.0),
        ("number", " -0.5 points", None, -0.5),
        ("number", "score: 1e-3", None, 0.001),
        ("number", "no digits here", None, None),
        ("yes-no", "Yes, it is.", None, 1.0),
        ("yes-no", "NO", None, 0.0),
        ("yes-no", "yesterday maybe", None, None),
        ("regex", "reasoning... SCORE=0.75 done", r"SCORE=(\S+)", 0.75),
        ("regex", "SCORE=high", r"SCORE=(\S+)", None),
        ("regex", "nothing", r"SCORE=(\S+)", None),
    ],
)
def test_score_parsers(parser: Any, text: str, pattern: str | None, expected: float | None) -> None:
    import re

    assert parse_score(parser, text, re.compile(pattern) if pattern else None) == expected


def test_template_fills_prompt_completion_fields_and_escapes() -> None:
    filled = fill_template("{{json}} {prompt}|{completion}|{answer}", {"prompt": "p", "completion": "c", "answer": "a"})
    assert filled == "{json} p|c|a"
    with pytest.raises(KeyError, match="answer"):
        fill_template("{answer}", {"prompt": "p"})


def test_genrm_scores_with_an_hf_judge_and_parse_failures_are_errors(judges: dict[str, Path]) -> None:
    async def go() -> None:
        functions = [
            genrm("seven", judges["seven"]),
            genrm("verdict", judges["yes"], "yes-no"),
            genrm("ratio", judges["yes"], "regex", scorePattern=r"(\d+)"),
        ]
        async with function_set(*functions[:2]) as fs:
            scores = await asyncio.gather(*(fs.score(sample(f"p/{i}", answer="42")) for i in range(4)))
            assert [dict(s.components) for s in scores] == [{"seven": 7.0, "verdict": 1.0}] * 4
            missing = await fs.score(sample("p/9"))  # the template wants {answer}
            assert missing.error.error_class == INVALID
            assert "needs {answer}, which sample 'p/9' does not have" in missing.error.message
        async with function_set(functions[2]) as fs:
            bad = await fs.score(sample("p/0", answer="42"))
            assert bad.error.error_class == FUNCTION and bad.error.function == "ratio" and not bad.score
            assert "no regex score in the judge's answer for sample 'p/0': 'yes'" in bad.error.message
        async with function_set(genrm("judge", judges["rambles"])) as fs:
            bad = await fs.score(sample("p/1", answer="42"))
            assert bad.error.error_class == FUNCTION and "'p/1'" in bad.error.message and "'abc'" in bad.error.message

    run(go())


def test_genrm_bad_pattern_names_the_function(judges: dict[str, Path]) -> None:
    with pytest.raises(RewardConfigError, match=r"reward function 'g': scorePattern '\(': missing \)"):
        RewardFunctionSet.from_spec([genrm("g", judges["yes"], "regex", scorePattern="(")], 1.0)


# -- the judge in rule functions -----------------------------------------------------------------


def test_rule_with_judge_calls_the_replicas_models(judges: dict[str, Path], rm_dir: Path) -> None:
    async def go() -> None:
        functions = [
            fn("answer", "rule", function="rljob_workers.reward.judge:exact_or_judged"),
            fn("rm-penalised", "rule", function="rljob_workers.reward.judge:length_penalised_rm"),
            genrm("judge", judges["yes"], "yes-no", weight=0.0),
            fn("rm", "disrm", 0.0, modelPath=str(rm_dir), maxWaitMs=1),
        ]
        async with function_set(*functions) as fs:
            exact, judged = await asyncio.gather(
                fs.score(sample("p/0", "42", answer="42")), fs.score(sample("p/1", "41", answer="42"))
            )
            assert (exact.components["answer"], judged.components["answer"]) == (1.0, 0.5)
            assert exact.components["rm-penalised"] == pytest.approx(exact.components["rm"], abs=1e-6)
            assert judged.score == pytest.approx(0.5 + judged.components["rm"], abs=1e-6)

    run(go())


def test_judge_grade_uses_the_genrm_template_and_parse_failures_name_the_rule(judges: dict[str, Path]) -> None:
    async def go() -> None:
        gated = fn("gated", "rule", function="rljob_workers.reward.judge:gated_grade")
        async with function_set(gated, genrm("seven", judges["seven"], weight=0.0)) as fs:
            graded, empty = await asyncio.gather(
                fs.score(sample("p/0", "41", answer="42")), fs.score(sample("p/1", " "))
            )
            assert (graded.components["gated"], empty.components["gated"]) == (7.0, 0.0)
        async with function_set(gated, genrm("rambles", judges["rambles"], weight=0.0)) as fs:
            bad = await fs.score(sample("p/2", "41", answer="42"))
            assert (bad.error.error_class, bad.error.function) == (FUNCTION, "gated")  # the first failure in job order
            assert bad.error.message.startswith("rule 'gated' on sample 'p/2': reward function 'rambles': no number")
            assert "this judge.grade call: 'abc'" in bad.error.message

    run(go())


def sync_judged(prompt: str, completion: str, judge: Any, **_: str) -> float:
    return 1.0


@pytest.mark.parametrize(
    ("ref", "says"),
    [
        ("test_reward_models:sync_judged", "takes a judge, so it must be async"),
        ("rljob_workers.reward.judge:exact_or_judged", "takes a judge, but the job has no disrm or genrm function"),
    ],
)
def test_judge_config_errors(ref: str, says: str) -> None:
    with pytest.raises(RewardConfigError, match=f"reward function 'r': {ref} {says}"):
        RewardFunctionSet.from_spec([fn("r", "rule", function=ref)], 1.0)


def test_judge_only_model_serves_the_judge_and_scores_no_sample(rm_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    closed: list[str] = []

    async def go() -> None:
        functions = [
            fn("rm-penalised", "rule", function="rljob_workers.reward.judge:length_penalised_rm"),
            fn("rm", "disrm", 5.0, modelPath=str(rm_dir), maxWaitMs=1, judge_only=True),  # its weight is ignored
        ]
        async with function_set(*functions) as fs:
            assert fs.names == ["rm-penalised"]
            [scorer] = fs.scorers
            assert isinstance(scorer, DisRMScorer) and fs.judge_only == [scorer]
            samples = [sample(f"p/{i}", "x" * (i + 1)) for i in range(6)]
            scores = [await fs.score(s) for s in samples]
            assert [dict(s.components) for s in scores] == [{"rm-penalised": s.score} for s in scores]
            expected = [scorer.forward([(s.prompt, s.completion)])[0] for s in samples]
            assert [s.score for s in scores] == pytest.approx(expected, abs=1e-5), "the judge called the model"
            assert sum(scorer.batch_sizes) == len(samples), "once per sample, by the judge only"
            close = scorer.close

            async def spy() -> None:
                closed.append(scorer.name)
                await close()

            monkeypatch.setattr(scorer, "close", spy)

    run(go())
    assert closed == ["rm"], "closing the function set closes its judge-only models"


@pytest.mark.parametrize(
    ("functions", "says"),
    [
        (
            [("exact", "rule", {"function": "reward_fns:exact"}), ("rm", "disrm", {"modelPath": "/nonexistent"})],
            "reward function 'rm' is judgeOnly, but no rule function takes a judge to call it",
        ),
        ([("rm", "disrm", {"modelPath": "/nonexistent"})], "every reward function is judgeOnly (['rm'])"),
    ],
    ids=["no rule takes a judge", "nothing scores the samples"],
)
def test_judge_only_config_errors_name_the_function(functions: list[tuple[str, str, Any]], says: str) -> None:
    """Refused before any model is loaded: the model path does not even exist."""
    specs = [fn(name, kind, judge_only=kind == "disrm", **config) for name, kind, config in functions]
    with pytest.raises(RewardConfigError) as info:
        RewardFunctionSet.from_spec(specs, 1.0)
    assert says in str(info.value)


def test_genrm_decodes_greedily_by_default(tmp_path: Path) -> None:
    unsure = scripted_judge(tmp_path / "unsure", {":": "7"}, unsure_after=":")  # "7" is likeliest, yet rarely drawn

    async def go() -> None:
        async with function_set(genrm("g", unsure, sampling={"maxNewTokens": 2})) as fs:  # temperature: default
            one_by_one = [await fs.score(sample(f"p/{i}", answer="42")) for i in range(4)]
            batched = await asyncio.gather(*(fs.score(sample(f"q/{i}", answer="42")) for i in range(4)))
            assert [dict(s.components) for s in [*one_by_one, *batched]] == [{"g": 7.0}] * 8
        async with function_set(genrm("g", unsure, sampling={"temperature": 1, "maxNewTokens": 2})) as fs:
            [scorer] = fs.scorers
            assert isinstance(scorer, GenRMScorer)
            answers = [await scorer.generate("score:", request_id=f"r{i}") for i in range(8)]
            assert len(set(answers)) > 1, f"sampled, this judge's answers vary ({answers}): 7s above are no luck"

    run(go())


# -- the server's metrics ------------------------------------------------------------------------


def test_reward_server_metrics_backlog_latency_errors(rm_dir: Path) -> None:
    async def go() -> None:
        config = RewardWorkerConfig(
            functions=[
                fn("rm", "disrm", modelPath=str(rm_dir), maxWaitMs=1),
                fn("flaky", "rule", 0.0, function="reward_fns:fails_on_odd_length"),
            ],
            timeout_seconds=5,
            max_in_flight=16,
            gpus=0,
        )
        running, servicer = await serve_reward(config, metrics_port=0)
        try:
            from rljob_workers.driver.pools.reward.router import RewardRouter

            router = RewardRouter()
            await router.add_replica("r0", f"127.0.0.1:{running.port}")
            results = await asyncio.gather(*(router.score(sample(f"p/{i}", "x" * i)) for i in range(8)))
            await router.close()
            assert sum(not r.HasField("error") for r in results) == 4
            get = servicer.metrics.registry.get_sample_value
            assert get("rljob_reward_scored_total") == 4 and get("rljob_reward_backlog") == 0
            assert (
                get("rljob_reward_errors_total", {"kind": "rule", "function": "flaky", "error_class": "function"}) == 4
            )
            count = {"kind": "disrm", "function": "rm"}
            assert get("rljob_reward_function_latency_seconds_count", count) == 8
            quantiles = servicer.metrics.latency_quantiles()
            assert set(quantiles) == {"disrm", "rule"} and 0 < quantiles["disrm"]["p50"] <= quantiles["disrm"]["p99"]
            assert servicer.metrics_port is not None
            url = f"http://127.0.0.1:{servicer.metrics_port}/metrics"
            text = (await asyncio.to_thread(lambda: urllib.request.urlopen(url, timeout=5).read())).decode()
            assert 'rljob_reward_latency_recent_seconds{kind="disrm",quantile="0.99"}' in text
            assert "rljob_reward_backlog 0.0" in text
        finally:
            await running.stop(None)
            await servicer.functions.aclose()

    run(go())
