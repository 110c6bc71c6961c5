"""The reward plane: weighted reward functions of four kinds and an elastic replica pool."""

from __future__ import annotations

import re
from typing import Literal

from pydantic import Field, field_validator, model_validator

from .base import FieldRuleError, Model, cel, cel_rules
from .placement import Placement
from .pools import Engine, JudgeSamplingSpec

RewardKind = Literal["rule", "remote", "disrm", "genrm"]
MODEL_KINDS = ("disrm", "genrm")  # the kinds a rule's `judge` can call
RewardDispatch = Literal["sample", "group", "batch"]
OnError = Literal["fail", "exclude", "wait"]
FUNCTION_REF = re.compile(r"^[A-Za-z_][\w.]*:[A-Za-z_]\w*$")
NAME = r"^[a-z0-9]([-a-z0-9]*[a-z0-9])?$"


RuleSignature = Literal["auto", "rljob", "trl", "verl"]


class RuleReward(Model):
    """A Python function addressed by module path, e.g. ``my_rewards.math:exact_match``.

    It is called as ``fn(prompt=..., completion=..., **fields)`` and returns a number; it
    may be async. An async function that declares a ``judge`` parameter also gets ``judge``,
    a client of the replica's disrm/genrm functions: ``await judge.generate(text)``,
    ``await judge.grade(prompt, completion, **fields)``, ``await judge.score(prompt, completion)``;
    ``model=<function name>`` picks one when there are several. A model function that exists only
    for such calls is marked ``judgeOnly``: it is not scored on every sample. One that declares a
    ``sample`` parameter also gets the whole RewardSample (sample id, token ids, policy version).
    """

    function: str = Field(description="`module.path:function` of the reward function.", max_length=512)
    signature: RuleSignature = Field(
        "auto",
        description=(
            "How it is called. rljob: `fn(prompt, completion, **fields) -> number`. trl: TRL's "
            "`fn(prompts, completions, **columns) -> list[float | None]`, a batch of samples (batchSize), every "
            "field a list; None: the function does not apply, and the sample's reward is the sum of those that do. "
            "verl: `compute_score(data_source, solution_str, ground_truth, extra_info)` from the fields of those "
            "names, a number or a dict whose `score` is the reward and whose other numbers are logged beside it. "
            "auto: trl when it declares `completions`, verl when it declares `solution_str`, else rljob."
        ),
    )
    batch_size: int | None = Field(
        None,
        description=(
            "trl, a plain (sync) function: the most samples one call scores, those that arrive together (a group's "
            "samples come as one); unset: algorithm.groupSize. An async one is called a sample at a time."
        ),
        ge=1,
        le=4096,
    )

    @field_validator("function")
    @classmethod
    def _check_ref(cls, value: str) -> str:
        if not FUNCTION_REF.match(value):
            raise ValueError(f"{value!r} is not of the form module.path:function")
        return value


class SecretKeyRef(Model):
    """A key of a Kubernetes Secret in the job's namespace."""

    name: str = Field(description="Secret name.", min_length=1, max_length=253)
    key: str = Field(description="Key inside the Secret.", min_length=1, max_length=253)


class RemoteReward(Model):
    """External RewardService endpoints (any language), called over gRPC."""

    endpoints: list[str] = Field(description="host:port of each endpoint.", min_length=1, max_length=64)
    tls: bool = Field(False, description="Use TLS.")
    insecure: bool = Field(
        False,
        description="Send the bearer token without TLS, in clear text (only on a network you trust); "
        "without it a token needs `tls: true`, unless every endpoint is on loopback.",
    )
    ca_file: str | None = Field(None, description="CA bundle to verify the endpoint with (TLS only).", max_length=4096)
    token_secret: SecretKeyRef | None = Field(None, description="Secret holding a bearer token, mounted into the pods.")
    token_file: str | None = Field(
        None,
        description="File holding a bearer token (locally, or a mounted path).",
        max_length=4096,
    )
    failure_threshold: int = Field(5, description="Consecutive failures that open an endpoint's circuit breaker.", ge=1)
    reset_seconds: float = Field(30.0, description="Seconds an open breaker waits before a trial call.", gt=0)

    @field_validator("endpoints")
    @classmethod
    def _check_endpoints(cls, value: list[str]) -> list[str]:
        for i, endpoint in enumerate(value):
            host, _, port = endpoint.rpartition(":")
            if not host or not port.isdigit() or not 0 < int(port) < 65536:
                raise FieldRuleError(f"[{i}]", f"{endpoint!r} is not host:port")
        return value

    @model_validator(mode="after")
    def _one_token_source(self) -> RemoteReward:
        if self.token_secret and self.token_file:
            raise FieldRuleError("tokenFile", "set tokenSecret or tokenFile, not both")
        if self.has_token and not self.tls and not self.insecure and not all(map(on_loopback, self.endpoints)):
            raise FieldRuleError(
                "tls",
                "a bearer token (tokenSecret or tokenFile) goes only over TLS: set tls: true "
                "(or insecure: true to send it in clear text)",
            )
        return self

    @property
    def has_token(self) -> bool:
        return self.token_secret is not None or self.token_file is not None

    @property
    def sends_token_in_clear(self) -> bool:
        """What validation warns of: a token without TLS to an endpoint off this machine (insecure: true)."""
        return self.has_token and not self.tls and not all(map(on_loopback, self.endpoints))

    model_config = {
        "json_schema_extra": cel_rules(
            cel(
                "!(has(self.tokenSecret) || has(self.tokenFile)) || self.tls || self.insecure || "
                "self.endpoints.all(e, e.startsWith('127.') || e.startsWith('localhost:') || e.startsWith('[::1]:'))",
                "a bearer token (tokenSecret or tokenFile) goes only over TLS: set tls: true "
                "(or insecure: true to send it in clear text)",
            ),
        )
    }


def on_loopback(endpoint: str) -> bool:
    """host:port on this machine's loopback, where a token never crosses a network."""
    host = endpoint.rpartition(":")[0]
    return host.startswith("127.") or host in ("localhost", "[::1]")


class DisRMReward(Model):
    """A sequence-classification reward model served with dynamic batching."""

    model_path: str = Field(description="Directory of a transformers sequence-classification model.", max_length=4096)
    batch_size: int = Field(32, description="Most samples per forward pass.", ge=1, le=4096)
    max_wait_ms: float = Field(20.0, description="Longest a request waits for its batch to fill.", ge=0)
    max_length: int = Field(2048, description="Tokens kept of prompt plus completion.", ge=1)


class GenRMReward(Model):
    """A generative judge: an LLM asked to grade, its answer parsed into a score."""

    model_path: str = Field(description="Directory of the judge model.", max_length=4096)
    engine: Engine = Field("hf", description="Engine serving the judge.")
    prompt_template: str = Field(
        description="Judge prompt; {prompt}, {completion} and data fields in braces are filled in.",
        max_length=65536,
    )
    score_parser: Literal["number", "yes-no", "regex"] = Field(
        "number", description="How the judge's answer becomes a score."
    )
    score_pattern: str | None = Field(
        None, description="With scoreParser regex: its first group is the score.", max_length=1024
    )
    sampling: JudgeSamplingSpec = Field(
        default_factory=JudgeSamplingSpec, description="Judge sampling; greedy (temperature 0) by default."
    )

    @model_validator(mode="after")
    def _pattern_for_regex(self) -> GenRMReward:
        if self.score_parser == "regex" and not self.score_pattern:
            raise FieldRuleError("scorePattern", "is required when scoreParser is regex")
        return self


class RewardFunction(Model):
    """One weighted reward; the sample's reward is the weighted sum over functions."""

    name: str = Field(
        description="Name, unique in the job (metrics and errors use it).",
        pattern=NAME,
        max_length=63,
    )
    kind: RewardKind = Field(description="rule, remote, disrm or genrm; the field of that name configures it.")
    weight: float = Field(1.0, description="Weight of this function in the sum (ignored when judgeOnly).")
    judge_only: bool = Field(
        False,
        description=(
            "disrm/genrm only: serve `judge` calls of rule functions but do not score every sample "
            "(no component, no part of the sum, so its weight is ignored)."
        ),
    )
    rule: RuleReward | None = Field(None, description="Configuration when kind is rule.")
    remote: RemoteReward | None = Field(None, description="Configuration when kind is remote.")
    disrm: DisRMReward | None = Field(None, description="Configuration when kind is disrm.")
    genrm: GenRMReward | None = Field(None, description="Configuration when kind is genrm.")

    @model_validator(mode="after")
    def _config_matches_kind(self) -> RewardFunction:
        for kind in ("rule", "remote", "disrm", "genrm"):
            if kind == self.kind and getattr(self, kind) is None:
                raise FieldRuleError(kind, f"is required when kind is {kind}")
            if kind != self.kind and getattr(self, kind) is not None:
                raise FieldRuleError(kind, f"is set but kind is {self.kind}")
        if self.judge_only and self.kind not in MODEL_KINDS:
            raise FieldRuleError("judgeOnly", f"is only for disrm and genrm functions, not {self.kind}")
        return self

    model_config = {
        "json_schema_extra": cel_rules(
            *(
                cel(
                    f"has(self.{k}) == (self.kind == '{k}')",
                    f"{k} must be set exactly when kind is {k}",
                )
                for k in ("rule", "remote", "disrm", "genrm")
            ),
            cel(
                f"!self.judgeOnly || self.kind in {list(MODEL_KINDS)}",
                "judgeOnly is only for disrm and genrm functions",
            ),
        )
    }


class ReplicaRange(Model):
    """Bounds of the elastic reward pool."""

    min: int = Field(1, description="Fewest reward replicas.", ge=0, le=4096)
    max: int = Field(1, description="Most reward replicas.", ge=1, le=4096)

    @model_validator(mode="after")
    def _min_le_max(self) -> ReplicaRange:
        if self.min > self.max:
            raise ValueError(f"min {self.min} is greater than max {self.max}")
        return self

    model_config = {
        "json_schema_extra": cel_rules(
            # A messageExpression naming the values costs more than the API server's CEL budget allows.
            cel("self.min <= self.max", "min must not be greater than max")
        )
    }


class ScalingSpec(Model):
    """Targets of the elastic reward policy."""

    target_backlog_per_replica: float = Field(
        16.0,
        description="Samples in service at once per replica the policy aims for: the load is the arrival rate × "
        "the service latency, or the backlog × the latency ÷ intervalSeconds (cleared within an interval).",
        gt=0,
    )
    cooldown_seconds: float = Field(30.0, description="Least time between two scaling decisions.", ge=0)
    max_step_up: int = Field(4, description="Most replicas added in one decision.", ge=1)
    max_step_down: int = Field(1, description="Most replicas removed in one decision.", ge=1)
    interval_seconds: float = Field(5.0, description="How often the policy runs.", gt=0)
    scale_down_window_seconds: float = Field(
        30.0,
        description="Scale down only to the most replicas the load asked for over this many seconds, so a "
        "dip shorter than the window (the pipeline between two steps) keeps the replicas the next step needs.",
        ge=0,
    )


class RewardSpec(Placement):
    """The reward pool and the functions it computes."""

    functions: list[RewardFunction] = Field(
        default_factory=list,
        description=(
            "Reward functions, summed with their weights; at least one unless spec.environment gives the reward."
        ),
        max_length=16,
        # Spelled out in the CRD: the API server checks a default object's CEL rules without defaulting
        # inside it, and a rule cannot read a key that is not there.
        json_schema_extra={"default": []},
    )
    replicas: ReplicaRange = Field(default_factory=ReplicaRange, description="Elastic bounds of the reward pool.")
    scaling: ScalingSpec = Field(default_factory=ScalingSpec, description="Elastic scaling targets.")
    gpus_per_replica: int = Field(0, description="GPUs per reward replica (for disrm/genrm).", ge=0, le=64)
    timeout_seconds: float = Field(60.0, description="Deadline for scoring one sample.", gt=0)
    retries: int = Field(
        2,
        description="Retries of a sample whose scoring failed, before onError applies.",
        ge=0,
        le=100,
    )
    on_error: OnError = Field(
        "fail",
        description=(
            "After retries: fail the job naming the sample; exclude the sample from training and count it; "
            "or wait: keep retrying a transient failure (a dead endpoint, an open circuit breaker, a timeout) "
            "with backoff until it scores, and fail the job on any other. While samples wait, the RLJob's "
            "Degraded condition is True with reason WaitingForReward, naming the newest reward error."
        ),
    )
    wait_timeout_seconds: float | None = Field(
        None,
        description=(
            "With onError: wait, the longest one sample may wait for reward; past it the job fails naming "
            "the sample and the error. Unset: wait as long as it takes."
        ),
        gt=0,
    )
    max_in_flight_per_replica: int = Field(64, description="Samples in flight on one reward replica.", ge=1, le=65536)
    dispatch: RewardDispatch = Field(
        "sample",
        description=(
            "When samples go to the reward pool: `sample` streams each one as its generation ends; "
            "`group` waits for its prompt group to be generated; `batch` waits until the batch being "
            "generated is complete (the synchronous generate-then-score baseline)."
        ),
    )

    @field_validator("functions")
    @classmethod
    def _unique_names(cls, value: list[RewardFunction]) -> list[RewardFunction]:
        seen: set[str] = set()
        for i, function in enumerate(value):
            if function.name in seen:
                raise FieldRuleError(f"[{i}].name", f"duplicate reward function name {function.name!r}")
            seen.add(function.name)
        if value and all(function.judge_only for function in value):
            raise FieldRuleError("", "every function is judgeOnly; at least one must score the samples")
        return value

    @model_validator(mode="after")
    def _wait_timeout_needs_wait(self) -> RewardSpec:
        if self.wait_timeout_seconds is not None and self.on_error != "wait":
            raise FieldRuleError("waitTimeoutSeconds", f"applies only with onError: wait, not {self.on_error}")
        return self

    model_config = {
        "json_schema_extra": cel_rules(
            cel(
                "size(self.functions) == 0 || self.functions.exists(f, !f.judgeOnly)",
                "every function is judgeOnly; at least one must score the samples",
            ),
            cel(
                "!has(self.waitTimeoutSeconds) || self.onError == 'wait'",
                "waitTimeoutSeconds applies only with onError: wait",
            ),
        )
    }
