"""The API server's checks of RLJobs: the CRD's schema, defaults and validation rules, against a real
kube-apiserver (no operator runs here).

The module starts its own control plane with e2e/cluster.sh (in a temporary state folder) and stops
it at the end; it is skipped, with the reason, when the e2e binaries are not built (`e2e/build.sh`).
The fixtures are e2e_fixtures.py's; RLJOB_TEST_CRD=path installs another CRD file than
crds/rljob.io_rljobs.yaml (to try a regenerated one before committing it).
"""

from __future__ import annotations

import json
from typing import Any

import pytest
import yaml
from e2e_cluster import REPO, Cluster, skip_without_binaries
from e2e_jobs import ARITHMETIC, rljob

pytestmark = [skip_without_binaries(), pytest.mark.cluster]
pytest_plugins = ["e2e_fixtures"]

EXACT_MATCH = ARITHMETIC["spec"]["reward"]["functions"][0]
JUDGE: dict[str, Any] = {
    "name": "judge",
    "kind": "genrm",
    "genrm": {"modelPath": "/models/judge", "promptTemplate": "Is {completion} right for {prompt}? Answer 0-1:"},
}


def test_crd_installs(cluster: Cluster, crd: str) -> None:
    got = cluster.get("crd", "rljobs.rljob.io", "default")
    assert got is not None
    assert any(c["type"] == "Established" and c["status"] == "True" for c in got["status"]["conditions"])
    columns = [c["name"] for c in got["spec"]["versions"][0]["additionalPrinterColumns"]]
    assert columns[:4] == ["Phase", "Step", "Version", "Reward"], columns


@pytest.mark.parametrize("example", sorted(p.name for p in (REPO / "examples").glob("*.yaml")))
def test_examples_are_accepted(cluster: Cluster, crd: str, ns: str, example: str) -> None:
    doc = yaml.safe_load((REPO / "examples" / example).read_text())
    doc["metadata"]["namespace"] = ns
    out = cluster.apply(doc, "--dry-run=server", check=False)
    assert out.returncode == 0, out.stderr


@pytest.mark.parametrize(
    ("change", "field", "words"),
    [
        ({"reward": {**ARITHMETIC["spec"]["reward"], "replicas": {"min": 4, "max": 2}}}, "spec.reward.replicas", "min"),
        ({"rollout": {**ARITHMETIC["spec"]["rollout"], "replicaz": 2}}, "spec.rollout.replicaz", "not declared"),
        (
            {"rollout": {**ARITHMETIC["spec"]["rollout"], "engine": "vllm", "gpusPerReplica": 8}},
            "spec.rollout",
            "gpusPerReplica",
        ),
        ({"rollout": {**ARITHMETIC["spec"]["rollout"], "engine": "sglang"}}, "spec.rollout", "sglang"),
        ({"algorithm": {**ARITHMETIC["spec"]["algorithm"], "miniBatches": 3}}, "spec.algorithm", "miniBatches"),
        ({"reward": {**ARITHMETIC["spec"]["reward"], "dispatch": "later"}}, "spec.reward.dispatch", "later"),
        (
            {"reward": {**ARITHMETIC["spec"]["reward"], "functions": [{**EXACT_MATCH, "judgeOnly": True}]}},
            "spec.reward.functions[0]",
            "judgeOnly is only for disrm and genrm",
        ),
        (
            {"reward": {**ARITHMETIC["spec"]["reward"], "functions": [{**JUDGE, "judgeOnly": True}]}},
            "spec.reward",
            "at least one must score the samples",
        ),
        (
            {"rollout": {**ARITHMETIC["spec"]["rollout"], "sampling": {"temperature": 0}}},
            "spec.rollout.sampling.temperature",
            "greater than 0",
        ),
        (
            {"reward": {**ARITHMETIC["spec"]["reward"], "onError": "fail", "waitTimeoutSeconds": 30}},
            "spec.reward",
            "waitTimeoutSeconds applies only with onError: wait",
        ),
        (
            {"algorithm": {**ARITHMETIC["spec"]["algorithm"], "name": "rloo", "scaleRewardsByStd": True}},
            "spec.algorithm",
            "scaleRewardsByStd applies to advantageEstimator group-relative only",
        ),
        (
            {"algorithm": {**ARITHMETIC["spec"]["algorithm"], "name": "grpo", "klIn": "reward"}},
            "spec.algorithm",
            "klIn reward needs advantageEstimator batch-normalized",
        ),
        (
            {"algorithm": {**ARITHMETIC["spec"]["algorithm"], "name": "dapo", "lossNormTokens": 5}},
            "spec.algorithm",
            "lossNormTokens applies to lossAggregation token-sum-norm only",
        ),
        (
            {"algorithm": {**ARITHMETIC["spec"]["algorithm"], "dynamicSampling": {"maxExtraGroups": 4}}},
            "spec.algorithm",
            "maxExtraGroups applies only with dynamicSampling.enabled",
        ),
        (
            {"algorithm": {**ARITHMETIC["spec"]["algorithm"], "name": "dapo", "overlong": {"bufferTokens": 9}}},
            "spec",
            "bufferTokens must not exceed rollout.sampling.maxNewTokens",
        ),
        (
            {"rollout": {**ARITHMETIC["spec"]["rollout"], "engine": "vllm", "sampling": {"topP": 0.9}}},
            "spec.rollout",
            "vllm needs sampling.topP 1 and topK 0",
        ),
        (
            {"rollout": {**ARITHMETIC["spec"]["rollout"], "weightUpdate": "inflight"}},
            "spec.rollout",
            "the hf engine takes weights by drain only",
        ),
        (
            {"checkpoint": {**ARITHMETIC["spec"]["checkpoint"], "volume": {"claimName": "runs", "readOnly": True}}},
            "spec.checkpoint.volume",
            "readOnly must be false: checkpoints are written here",
        ),
        ({"trainer": {**ARITHMETIC["spec"]["trainer"], "shmSize": "2GB"}}, "spec.trainer.shmSize", "should match"),
        ({"imagePullSecrets": ["registry"]}, "spec.imagePullSecrets[0]", "expected map"),
        ({"colocate": True}, "spec", "colocate pairs one rollout replica (gpusPerReplica 1) with each GPU"),
        (
            {
                "colocate": True,
                "rollout": {**ARITHMETIC["spec"]["rollout"], "gpusPerReplica": 1},
                "trainer": {**ARITHMETIC["spec"]["trainer"], "gpusPerNode": 1},
                "weightSync": {**ARITHMETIC["spec"]["weightSync"], "backend": "nccl"},
            },
            "spec",
            "colocate moves weights by gloo, not nccl",
        ),
        (
            {"reward": {**ARITHMETIC["spec"]["reward"], "functions": []}},
            "spec",
            "at least one reward function, unless spec.environment gives the reward",
        ),
        (
            {"environment": {"kind": "remote", "class": "calculator:Calculator"}},
            "spec.environment",
            "remote must be set exactly when kind is remote",
        ),
        (
            {"environment": {"kind": "remote", "remote": {"endpoints": ["env.tools:50051"], "tokenFile": "/t"}}},
            "spec.environment.remote",
            "a bearer token (tokenSecret or tokenFile) goes only over TLS",
        ),
    ],
    ids=[
        "reward-min-gt-max",
        "unknown-field",
        "gpus-the-engines-leave-idle",
        "sglang-on-cpu",
        "mini-batches",
        "unknown-dispatch",
        "judge-only-rule",
        "only-judges",
        "greedy-rollout",
        "wait-timeout-without-wait",
        "std-scaling-outside-group-relative",
        "kl-in-reward-without-batch-normalized",
        "norm-tokens-without-token-sum-norm",
        "extra-groups-without-dynamic-sampling",
        "overlong-buffer-past-max-new-tokens",
        "vllm-with-top-p",
        "hf-in-flight",
        "read-only-checkpoint-volume",
        "shm-size-not-a-quantity",
        "pull-secret-as-a-bare-name",
        "colocate-without-gpus",
        "colocate-over-nccl",
        "no-reward-and-no-environment",
        "remote-environment-with-a-class",
        "token-without-tls",
    ],
)
def test_bad_specs_are_refused_naming_the_field(
    cluster: Cluster, crd: str, ns: str, change: dict[str, Any], field: str, words: str
) -> None:
    out = cluster.apply(rljob("bad", ns, **change), check=False)
    assert out.returncode != 0, "the API server accepted a spec it must refuse"
    assert field in out.stderr and words in out.stderr, out.stderr


def test_a_token_in_clear_text_is_accepted_when_the_spec_says_insecure(cluster: Cluster, crd: str, ns: str) -> None:
    remote = {"endpoints": ["env.tools:50051"], "tokenSecret": {"name": "t", "key": "k"}, "insecure": True}
    cluster.apply(rljob("clear-text", ns, environment={"kind": "remote", "remote": remote}))


def test_a_greedy_judge_only_genrm_is_accepted(cluster: Cluster, crd: str, ns: str) -> None:
    judge = {**JUDGE, "judgeOnly": True, "genrm": {**JUDGE["genrm"], "sampling": {"temperature": 0}}}
    functions = [{**EXACT_MATCH, "rule": {"function": "my_rewards:judged"}}, judge]
    doc = rljob("greedy", ns, reward={**ARITHMETIC["spec"]["reward"], "functions": functions})
    out = cluster.apply(doc, "--dry-run=server", "-o", "json", check=False)
    assert out.returncode == 0, out.stderr
    stored = json.loads(out.stdout)["spec"]["reward"]["functions"]
    assert [f.get("judgeOnly") for f in stored] == [False, True], "the API server fills in judgeOnly's default"
    assert stored[1]["genrm"]["sampling"]["temperature"] == 0


def test_a_wait_timeout_with_on_error_wait_is_accepted(cluster: Cluster, crd: str, ns: str) -> None:
    reward = {**ARITHMETIC["spec"]["reward"], "onError": "wait", "waitTimeoutSeconds": 600}
    out = cluster.apply(rljob("patient", ns, reward=reward), "--dry-run=server", "-o", "json", check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["spec"]["reward"]["waitTimeoutSeconds"] == 600


def test_a_checkpoint_volume_left_at_its_defaults_is_writable(cluster: Cluster, crd: str, ns: str) -> None:
    checkpoint = {**ARITHMETIC["spec"]["checkpoint"], "volume": {"claimName": "runs"}}
    out = cluster.apply(rljob("runs", ns, checkpoint=checkpoint), "--dry-run=server", "-o", "json", check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["spec"]["checkpoint"]["volume"]["readOnly"] is False


def test_an_environment_job_without_reward_functions_is_accepted_and_updated(
    cluster: Cluster, crd: str, ns: str
) -> None:
    # spec.reward left out: its default, functions [] included, must pass the rules that read functions
    environment = {"kind": "remote", "remote": {"endpoints": ["env.tools:50051"]}}
    doc = rljob("episodes", ns, suspend=True, environment=environment)
    del doc["spec"]["reward"]
    out = cluster.apply(doc, "-o", "json", check=False)
    assert out.returncode == 0, out.stderr
    assert json.loads(out.stdout)["spec"]["reward"]["functions"] == []
    doc["spec"]["suspend"] = False  # an update runs the immutability rules, which compare reward.functions
    out = cluster.apply(doc, check=False)
    assert out.returncode == 0, out.stderr


def test_immutable_fields_are_refused_on_update(cluster: Cluster, crd: str, ns: str) -> None:
    cluster.apply(rljob("frozen", ns, suspend=True))
    algorithm = {**ARITHMETIC["spec"]["algorithm"], "learningRate": 0.5}
    out = cluster.apply(rljob("frozen", ns, suspend=True, algorithm=algorithm), check=False)
    assert out.returncode != 0 and "spec.algorithm" in out.stderr and "immutable" in out.stderr, out.stderr
    # Safe changes apply to an existing job: reward bounds and suspend.
    reward = {**ARITHMETIC["spec"]["reward"], "replicas": {"min": 1, "max": 3}}
    cluster.apply(rljob("frozen", ns, suspend=False, reward=reward))
