"""The RLJob schema: examples validate, bad specs are refused with the field and rule named."""

from __future__ import annotations

import copy
import subprocess
import sys
from collections.abc import Callable
from typing import Any

import pytest
from pydantic import BaseModel

from rljob_api import RLJob, RLJobInvalid, derive_worker_configs, load_rljob, parse_rljob
from rljob_api.crd import openapi_schema
from rljob_api.reward import RewardFunction

from conftest import EXAMPLES, REPO

Mutation = Callable[[dict[str, Any]], None]


def _set(path: str, value: Any) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node.setdefault(key, {})
        node[last] = value

    return mutate


def _drop(path: str) -> Mutation:
    def mutate(doc: dict[str, Any]) -> None:
        *parents, last = path.split(".")
        node: Any = doc
        for key in parents:
            node = node[int(key)] if key.isdigit() else node[key]
        del node[last]

    return mutate


REMOTE_BAD_ENDPOINT = [{"name": "judge", "kind": "remote", "remote": {"endpoints": ["nohost"]}}]


def _judge(temperature: float) -> dict[str, Any]:
    """A judge-only genrm function sampling at `temperature`."""
    genrm = {"modelPath": "/m", "promptTemplate": "{completion}", "sampling": {"temperature": temperature}}
    return {"name": "judge", "kind": "genrm", "judgeOnly": True, "genrm": genrm}


GREEDY_JUDGE = _judge(0)
JUDGED_RULE = {"name": "graded", "kind": "rule", "rule": {"function": "rljob_workers.reward.judge:gated_grade"}}
DUPLICATE_FUNCTIONS = [
    {"name": "same", "kind": "rule", "rule": {"function": "m:f"}},
    {"name": "same", "kind": "rule", "rule": {"function": "m:g"}},
]

BAD_SPECS: list[tuple[str, Mutation, str]] = [
    (
        "min>max",
        _set("spec.reward.replicas", {"min": 4, "max": 2}),
        "spec.reward.replicas: min 4 is greater than max 2",
    ),
    (
        "unknown field",
        _set("spec.rolout", {}),
        "spec.rolout: unknown field (check its spelling and indentation)",
    ),
    (
        "unknown nested field",
        _set("spec.algorithm.groupsize", 4),
        "spec.algorithm.groupsize: unknown field (check its spelling and indentation)",
    ),
    (
        "bad engine",
        _set("spec.rollout.engine", "tgi"),
        "spec.rollout.engine: 'tgi' is not one of 'hf', 'vllm' or 'sglang'",
    ),
    (
        "gpus the engines leave idle",
        lambda d: d["spec"]["rollout"].update(gpusPerReplica=8, tensorParallelSize=2, engine="vllm"),
        "spec.rollout.gpusPerReplica: 8 GPUs for engines that use 2 (tensorParallelSize 2 × "
        "pipelineParallelSize 1 × dataParallelSize 1): would leave 6 idle",
    ),
    (
        "too few gpus for the engines",
        lambda d: d["spec"]["rollout"].update(
            gpusPerReplica=2, tensorParallelSize=2, dataParallelSize=2, engine="vllm"
        ),
        "spec.rollout.gpusPerReplica: 2 GPUs for engines that use 4 (tensorParallelSize 2 × "
        "pipelineParallelSize 1 × dataParallelSize 2): are too few",
    ),
    (
        "tensor parallel on the cpu",
        lambda d: d["spec"]["rollout"].update(tensorParallelSize=2, engine="vllm"),
        "spec.rollout.tensorParallelSize: parallel engines need GPUs; set gpusPerReplica, or use 1 on the CPU",
    ),
    (
        "sglang on the cpu",
        _set("spec.rollout.engine", "sglang"),
        "spec.rollout.engine: sglang has no CPU build; set gpusPerReplica ≥ 1, or use vllm or hf",
    ),
    (
        "hf sharded",
        lambda d: d["spec"]["rollout"].update(gpusPerReplica=2, dataParallelSize=2),
        "spec.rollout.dataParallelSize: the hf engine runs one unsharded model; use 1, or engine vllm/sglang",
    ),
    (
        "vllm with a nucleus cut",
        lambda d: d["spec"]["rollout"].update(engine="vllm", sampling={"topP": 0.9}),
        "spec.rollout.sampling.topP: vllm reports log-probs after the top-p/top-k cut, which the trainer cannot "
        "recompute; use engine hf",
    ),
    (
        "vllm with a top-k cut",
        lambda d: d["spec"]["rollout"].update(engine="vllm", sampling={"topK": 20}),
        "spec.rollout.sampling.topK: vllm reports log-probs after the top-p/top-k cut, which the trainer cannot "
        "recompute; use engine hf",
    ),
    (
        "hf in flight",
        _set("spec.rollout.weightUpdate", "inflight"),
        "spec.rollout.weightUpdate: the hf engine switches versions between batches; use drain",
    ),
    (
        "kind without config",
        _drop("spec.reward.functions.0.rule"),
        "spec.reward.functions[0].rule: is required when kind is rule",
    ),
    (
        "config of other kind",
        _set("spec.reward.functions.0.remote", {"endpoints": ["a:1"]}),
        "spec.reward.functions[0].remote: is set but kind is rule",
    ),
    (
        "bad function ref",
        _set("spec.reward.functions.0.rule.function", "nocolon"),
        "spec.reward.functions[0].rule.function: 'nocolon' is not of the form module.path:function",
    ),
    (
        "group of one",
        _set("spec.algorithm.groupSize", 1),
        "spec.algorithm.groupSize: Input should be greater than or equal to 2",
    ),
    (
        "mini-batches do not divide",
        _set("spec.algorithm.miniBatches", 3),
        "spec.algorithm.miniBatches: 3 does not divide promptsPerStep 16",
    ),
    (
        "sync cadence beyond staleness",
        _set("spec.weightSync.everySteps", 3),
        "spec.weightSync.everySteps: 3 lets rollout lag 2 versions, more than "
        "algorithm.maxStaleness 1; every sample would be stale",
    ),
    (
        "duplicate function names",
        _set("spec.reward.functions", DUPLICATE_FUNCTIONS),
        "spec.reward.functions[1].name: duplicate reward function name 'same'",
    ),
    ("no model", _drop("spec.model"), "spec.model: required field is missing"),
    (
        "bad name",
        _set("metadata.name", "Bad_Name"),
        "metadata.name: 'Bad_Name' does not match ^[a-z0-9]([-a-z0-9]*[a-z0-9])?$",
    ),
    ("wrong kind", _set("kind", "Job"), "kind: 'Job' is not one of 'RLJob'"),
    (
        "greedy sampling",
        _set("spec.rollout.sampling.temperature", 0),
        "spec.rollout.sampling.temperature: Input should be greater than 0",
    ),
    (
        "judgeOnly rule",
        _set("spec.reward.functions.0.judgeOnly", True),
        "spec.reward.functions[0].judgeOnly: is only for disrm and genrm functions, not rule",
    ),
    (
        "nothing but judges",
        _set("spec.reward.functions", [GREEDY_JUDGE]),
        "spec.reward.functions: every function is judgeOnly; at least one must score the samples",
    ),
    (
        "negative judge temperature",
        _set("spec.reward.functions", [JUDGED_RULE, _judge(-0.5)]),
        "spec.reward.functions[1].genrm.sampling.temperature: Input should be greater than or equal to 0",
    ),
    (
        "endpoint without port",
        _set("spec.reward.functions", REMOTE_BAD_ENDPOINT),
        "spec.reward.functions[0].remote.endpoints[0]: 'nohost' is not host:port",
    ),
    (
        "quantity of wrong type",
        _set("spec.rollout.resources", {"requests": {"cpu": [1]}}),
        "spec.rollout.resources.requests.cpu: none of the allowed forms fits: "
        "Input should be a valid string; Input should be a valid integer",
    ),
    (
        "unknown error policy",
        _set("spec.reward.onError", "ignore"),
        "spec.reward.onError: 'ignore' is not one of 'fail', 'exclude' or 'wait'",
    ),
    (
        "wait timeout without wait",
        _set("spec.reward.waitTimeoutSeconds", 30),
        "spec.reward.waitTimeoutSeconds: applies only with onError: wait, not fail",
    ),
    (
        "read-only checkpoint volume",
        _set("spec.checkpoint.volume", {"claimName": "runs", "mountPath": "/runs", "readOnly": True}),
        "spec.checkpoint.volume.readOnly: checkpoints are written to this volume; set false (the default)",
    ),
    (
        "nccl without gpus",
        _set("spec.weightSync.backend", "nccl"),
        "spec.weightSync.backend: nccl needs GPUs in the rollout and trainer pools",
    ),
    (
        "regex parser without pattern",
        _set(
            "spec.reward.functions",
            [
                {
                    "name": "judge",
                    "kind": "genrm",
                    "genrm": {
                        "modelPath": "/m",
                        "promptTemplate": "{completion}",
                        "scoreParser": "regex",
                    },
                }
            ],
        ),
        "spec.reward.functions[0].genrm.scorePattern: is required when scoreParser is regex",
    ),
]


@pytest.mark.parametrize("example", EXAMPLES, ids=lambda p: p.name)
def test_every_example_validates(example):
    job = load_rljob(example)
    assert job.kind == "RLJob"


@pytest.mark.parametrize(("case", "mutate", "expected"), BAD_SPECS, ids=[c[0] for c in BAD_SPECS])
def test_bad_spec_is_refused_naming_field_and_rule(example_doc, case, mutate, expected):
    doc = copy.deepcopy(example_doc)
    mutate(doc)
    with pytest.raises(RLJobInvalid) as info:
        parse_rljob(doc)
    assert [str(e) for e in info.value.errors] == [expected]


def test_a_genrm_judge_may_decode_greedily_but_rollout_may_not(example_doc):
    doc = copy.deepcopy(example_doc)
    doc["spec"]["reward"]["functions"] = [JUDGED_RULE, GREEDY_JUDGE]
    judge = parse_rljob(doc).spec.reward.functions[1].genrm
    assert judge is not None and judge.sampling.temperature == 0
    doc["spec"]["rollout"]["sampling"] = {"temperature": 0}
    with pytest.raises(RLJobInvalid) as info:
        parse_rljob(doc)
    assert [str(e) for e in info.value.errors] == ["spec.rollout.sampling.temperature: Input should be greater than 0"]


def test_a_genrm_judge_decodes_greedily_unless_told_otherwise(example_doc):
    doc = copy.deepcopy(example_doc)
    unset = {**GREEDY_JUDGE, "genrm": {k: v for k, v in GREEDY_JUDGE["genrm"].items() if k != "sampling"}}
    doc["spec"]["reward"]["functions"] = [JUDGED_RULE, unset, {**_judge(0.7), "name": "warm"}]
    judges = [f.genrm for f in parse_rljob(doc).spec.reward.functions[1:]]
    assert [j.sampling.temperature for j in judges if j] == [0.0, 0.7]


def test_crd_lets_only_a_judge_decode_greedily():
    spec = openapi_schema()["properties"]["spec"]["properties"]
    rollout = spec["rollout"]["properties"]["sampling"]["properties"]["temperature"]
    assert (rollout["minimum"], rollout.get("exclusiveMinimum")) == (0, True), "rollout must sample"
    function = spec["reward"]["properties"]["functions"]["items"]
    judge = function["properties"]["genrm"]["properties"]["sampling"]["properties"]["temperature"]
    assert (judge["minimum"], judge.get("exclusiveMinimum")) == (0, None), "a judge may decode greedily"
    assert (judge["default"], rollout["default"]) == (0.0, 1.0), "a judge decodes greedily by default"


def test_judge_only_defaults_to_false_and_is_parsed(example_doc):
    doc = copy.deepcopy(example_doc)
    assert not parse_rljob(doc).spec.reward.functions[0].judge_only
    doc["spec"]["reward"]["functions"] = [JUDGED_RULE, GREEDY_JUDGE]
    assert [f.judge_only for f in parse_rljob(doc).spec.reward.functions] == [False, True]


def test_crd_states_the_judge_only_rules():
    reward = openapi_schema()["properties"]["spec"]["properties"]["reward"]
    function = reward["properties"]["functions"]["items"]
    assert function["properties"]["judgeOnly"] == {
        "default": False,
        "description": RewardFunction.model_fields["judge_only"].description,
        "type": "boolean",
    }
    assert {"rule": "!self.judgeOnly || self.kind in ['disrm', 'genrm']"}.items() <= (
        function["x-kubernetes-validations"][-1].items()
    )
    assert {
        "rule": "size(self.functions) == 0 || self.functions.exists(f, !f.judgeOnly)",
        "message": "every function is judgeOnly; at least one must score the samples",
    } in reward["x-kubernetes-validations"]


def test_several_errors_are_all_reported(example_doc):
    doc = copy.deepcopy(example_doc)
    doc["spec"]["algorithm"]["groupSize"] = 1
    doc["spec"]["typo"] = True
    with pytest.raises(RLJobInvalid) as info:
        parse_rljob(doc)
    assert {e.field for e in info.value.errors} == {"spec.algorithm.groupSize", "spec.typo"}


def test_validate_cli_exit_codes_and_message(tmp_path, example_doc):
    bad = copy.deepcopy(example_doc)
    bad["spec"]["reward"]["replicas"] = {"min": 4, "max": 2}
    path = tmp_path / "bad.yaml"
    import yaml

    path.write_text(yaml.safe_dump(bad))
    cli = [sys.executable, "-m", "rljob_workers.driver.cli", "validate"]
    good = subprocess.run([*cli, str(REPO / "examples" / "arithmetic.yaml")], capture_output=True, text=True)
    assert good.returncode == 0, good.stderr
    refused = subprocess.run([*cli, str(path)], capture_output=True, text=True)
    assert refused.returncode == 1
    assert "spec.reward.replicas: min 4 is greater than max 2" in refused.stderr


def _all_models(model: type[BaseModel], seen: set[type[BaseModel]]) -> None:
    if model in seen:
        return
    seen.add(model)
    for info in model.model_fields.values():
        stack = [info.annotation]
        while stack:
            annotation = stack.pop()
            if isinstance(annotation, type) and issubclass(annotation, BaseModel):
                _all_models(annotation, seen)
            stack.extend(getattr(annotation, "__args__", ()))


def test_every_field_is_documented():
    models: set[type[BaseModel]] = set()
    _all_models(RLJob, models)
    undocumented = [
        f"{m.__name__}.{name}" for m in models for name, info in m.model_fields.items() if not info.description
    ]
    assert not undocumented


def test_defaults_live_in_the_schema(example_doc):
    job = parse_rljob(example_doc)
    assert job.spec.reward.retries == 2
    assert job.spec.rollout.sampling.top_p == 1.0
    # Round trip through the wire form loses nothing.
    assert parse_rljob(job.to_wire()) == job


def test_worker_configs_follow_the_spec(example_doc):
    job = parse_rljob(example_doc)
    configs = derive_worker_configs(job)
    assert configs.rollout.model_path == job.spec.model.path == configs.trainer.model_path
    assert configs.trainer.algorithm == configs.controller.algorithm
    assert configs.trainer.algorithm.model_dump(include=set(job.spec.algorithm.model_fields_set)) == (
        job.spec.algorithm.model_dump(exclude_unset=True)
    )
    # the same functions; a rule's batchSize, unset, is one group (TRL functions are called with groups)
    assert [f.model_copy(update={"rule": None}) for f in configs.reward.functions] == [
        f.model_copy(update={"rule": None}) for f in job.spec.reward.functions
    ]
    assert [f.rule.batch_size for f in configs.reward.functions if f.rule] == [job.spec.algorithm.group_size]
    assert configs.controller.sampling == job.spec.rollout.sampling
    assert configs.trainer.world_size == 1


def test_vllm_runs_on_the_cpu_and_its_gpus_add_up(example_doc):
    """vLLM's CPU build runs where no GPU is (the schema refused it); on GPUs a replica's are its engines'
    tensor × pipeline × data parallel degrees, every one used (examples/gpu-cluster.yaml: 2 × 1 × 4 = 8)."""
    example_doc["spec"]["rollout"].update(engine="vllm", weightUpdate="inflight")
    rollout = parse_rljob(example_doc).spec.rollout
    assert (rollout.engine, rollout.gpus_per_replica, rollout.weight_update) == ("vllm", 0, "inflight")
    example_doc["spec"]["rollout"].update(gpusPerReplica=8, tensorParallelSize=2, dataParallelSize=4)
    rollout = parse_rljob(example_doc).spec.rollout
    assert rollout.engine_gpus == 8
    configs = derive_worker_configs(parse_rljob(example_doc))
    assert (configs.rollout.tensor_parallel_size, configs.rollout.data_parallel_size) == (2, 4)
    assert configs.rollout.weight_update == "inflight"
