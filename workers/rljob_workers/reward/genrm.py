"""`genrm`: a generative judge. The prompt template is filled with the sample, the judge model answers
through a rollout Engine (hf, vllm or sglang, via `make_engine`), and a parser turns its answer into a score.

Template: ``{prompt}``, ``{completion}`` and ``{field}`` for each data field of the sample are
filled in; ``{{`` and ``}}`` are literal braces. The text goes to the engine as it is (write the
judge's chat format into the template). Parsers:

- ``number``: the first number in the answer (``7``, ``-0.5``, ``1e-3``);
- ``yes-no``: the first word ``yes`` (1.0) or ``no`` (0.0), any case;
- ``regex``: ``scorePattern``'s first group (the whole match if it has none) read as a number.

Sampling is the function's ``sampling``. Temperature 0, the default for a judge, decodes
greedily on every engine (the hf engine turns sampling off, vllm and sglang read temperature 0 as
greedy), so the judgement does not depend on a random draw; rollout alone must sample.

An answer that does not parse is a FUNCTION error naming the sample and quoting the judge's
answer, never a score of 0. Batching is the engine's: the hf engine batches concurrent requests
with equal sampling parameters, vllm and sglang batch continuously.
"""

from __future__ import annotations

import dataclasses
import math
import re
from collections.abc import Mapping
from typing import Literal

from rljob.v1 import sample_pb2
from rljob_api.reward import GenRMReward
from rljob_api.workercfg import RolloutWorkerConfig
from rljob_workers.engines import make_engine
from rljob_workers.engines.base import Engine, PromptInput, SamplingConfig
from rljob_workers.reward.base import FUNCTION, INVALID, RewardConfigError, ScoreFailure

Parser = Literal["number", "yes-no", "regex"]
PLACEHOLDER = re.compile(r"\{\{|\}\}|\{([A-Za-z_][\w-]*)\}")
NUMBER = re.compile(r"[-+]?(?:\d+\.?\d*|\.\d+)(?:[eE][-+]?\d+)?")
YES_NO = re.compile(r"\b(yes|no)\b", re.IGNORECASE)
# Most concurrent judge prompts in one engine batch.
JUDGE_BATCH = 64


def fill_template(template: str, values: Mapping[str, str]) -> str:
    """`template` with each ``{name}`` replaced by ``values[name]``; KeyError names a missing placeholder."""

    def replace(match: re.Match[str]) -> str:
        if match.group(0) in ("{{", "}}"):
            return match.group(0)[0]
        return values[match.group(1)]

    return PLACEHOLDER.sub(replace, template)


def parse_score(parser: Parser, text: str, pattern: re.Pattern[str] | None = None) -> float | None:
    """The score in a judge's answer, or None when there is none."""
    if parser == "yes-no":
        found = YES_NO.search(text)
        return None if found is None else float(found.group(1).lower() == "yes")
    if parser == "regex":
        if pattern is None:
            raise ValueError("the regex parser needs a pattern")
        found = pattern.search(text)
        if found is None:
            return None
        text = found.group(1) if pattern.groups else found.group(0)
        found = NUMBER.fullmatch(text.strip())
    else:
        found = NUMBER.search(text)
    if found is None:
        return None
    value = float(found.group(0))
    return value if math.isfinite(value) else None


def sampling_config(config: GenRMReward) -> SamplingConfig:
    """The engine's sampling parameters of a judge; temperature 0 is greedy (`SamplingConfig.greedy`)."""
    s = config.sampling
    return SamplingConfig(
        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens, stop=tuple(s.stop)
    )


def _compile(name: str, config: GenRMReward) -> re.Pattern[str] | None:
    if config.score_parser != "regex" or config.score_pattern is None:
        return None
    try:
        return re.compile(config.score_pattern)
    except re.error as exc:
        raise RewardConfigError(f"reward function {name!r}: scorePattern {config.score_pattern!r}: {exc}") from exc


class GenRMScorer:
    """A judge model behind the rollout Engine protocol, with a template and a score parser."""

    kind = "genrm"
    manages_deadline = False

    def __init__(self, name: str, config: GenRMReward, engine: Engine) -> None:
        self.name = name
        self.config = config
        self.engine = engine
        self.pattern = _compile(name, config)
        self.sampling = sampling_config(config)

    @classmethod
    def load(cls, name: str, config: GenRMReward, *, gpus: int = 0) -> GenRMScorer:
        """Start the judge's engine (blocking: loads the model)."""
        _compile(name, config)  # a bad pattern fails before a model is loaded
        engine_config = RolloutWorkerConfig(
            model_path=config.model_path,
            dtype="auto",
            engine=config.engine,
            gpus=gpus,
            tensor_parallel_size=max(1, gpus),
            max_concurrent_prompts=JUDGE_BATCH,
            gpu_memory_utilization=0.85,
            seed=0,
        )
        try:
            engine = make_engine(engine_config)
        except (OSError, ValueError, RuntimeError) as exc:
            where = f"the {config.engine} genrm judge at {config.model_path!r}"
            raise RewardConfigError(f"reward function {name!r}: cannot start {where}: {exc}") from exc
        return cls(name, config, engine)

    async def generate(self, text: str, *, request_id: str = "judge", max_new_tokens: int | None = None) -> str:
        """The judge's answer to a raw prompt text."""
        sampling = self.sampling
        if max_new_tokens is not None:
            sampling = dataclasses.replace(sampling, max_new_tokens=max_new_tokens)
        prompt = PromptInput(prompt_id=request_id, token_ids=tuple(self.engine.tokenize(text)))
        async for finished in self.engine.generate([prompt], sampling):
            return finished.text
        raise RuntimeError(f"the {self.engine.name} engine returned no answer for {request_id!r}")

    def judge_prompt(self, prompt: str, completion: str, fields: Mapping[str, str], subject: str) -> str:
        values = {**fields, "prompt": prompt, "completion": completion}
        try:
            return fill_template(self.config.prompt_template, values)
        except KeyError as exc:
            raise ScoreFailure(
                INVALID,
                f"reward function {self.name!r}: the prompt template needs {{{exc.args[0]}}}, "
                f"which {subject} does not have (fields: {sorted(fields)})",
            ) from exc

    async def grade(
        self, prompt: str, completion: str, fields: Mapping[str, str], *, request_id: str, subject: str
    ) -> float:
        """Fill the template, ask the judge, parse its answer; ScoreFailure(FUNCTION) when it does not parse.

        `subject` names what is graded in errors (``sample 'p/0'``).
        """
        answer = await self.generate(self.judge_prompt(prompt, completion, fields, subject), request_id=request_id)
        score = parse_score(self.config.score_parser, answer, self.pattern)
        if score is None:
            raise ScoreFailure(
                FUNCTION,
                f"reward function {self.name!r}: no {self.config.score_parser} score in the judge's answer "
                f"for {subject}: {answer[:300]!r}",
            )
        return score

    async def score_sample(self, sample: sample_pb2.RewardSample) -> float:
        sid = sample.sample_id
        return await self.grade(
            sample.prompt, sample.completion, dict(sample.fields), request_id=sid, subject=f"sample {sid!r}"
        )

    async def close(self) -> None:
        await self.engine.close()
