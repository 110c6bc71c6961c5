"""Example rule functions that call the job's reward-model pool through `judge` (see `modelpool.Judge`).

Use one in an RLJob next to the model it calls, e.g.::

    functions:
      - name: answer
        kind: rule
        rule: {function: rljob_workers.reward.judge:exact_or_judged}
      - name: judge-model          # used through the judge only: not scored on every sample
        kind: genrm
        judgeOnly: true
        genrm:
          modelPath: /models/judge
          promptTemplate: "..."
          scoreParser: yes-no
          sampling: {maxNewTokens: 4}   # greedy (temperature 0) by default: the same answer every time
"""

from __future__ import annotations

from typing import Protocol

JUDGE_QUESTION = (
    "Question: {prompt}\nReference answer: {answer}\nStudent answer: {completion}\n"
    "Is the student answer correct? Answer yes or no.\nAnswer:"
)
PARTIAL_CREDIT = 0.5


class JudgeClient(Protocol):
    async def generate(self, text: str, *, model: str | None = None, max_new_tokens: int | None = None) -> str: ...

    async def grade(self, prompt: str, completion: str, *, model: str | None = None, **fields: str) -> float: ...

    async def score(self, prompt: str, completion: str, *, model: str | None = None) -> float: ...


async def exact_or_judged(prompt: str, completion: str, judge: JudgeClient, answer: str = "", **_: str) -> float:
    """1 for an exact answer; otherwise the generative judge decides between partial credit and 0.

    The rule settles the easy cases without a model call; only the rest pay for the judge.
    """
    if completion.strip() == answer.strip():
        return 1.0
    question = JUDGE_QUESTION.format(prompt=prompt, answer=answer, completion=completion.strip())
    verdict = await judge.generate(question, max_new_tokens=4)
    return PARTIAL_CREDIT if verdict.strip().lower().startswith("yes") else 0.0


async def length_penalised_rm(prompt: str, completion: str, judge: JudgeClient, **_: str) -> float:
    """A hybrid: the disrm reward model's score, minus a rule's penalty for completions over 512 characters."""
    score = await judge.score(prompt, completion)
    return score - 0.001 * max(0, len(completion) - 512)


async def gated_grade(prompt: str, completion: str, judge: JudgeClient, **fields: str) -> float:
    """A format rule gates the judge: an empty completion scores 0 with no model call; the others get the
    genrm judge's grade (its own template and parser; an answer that does not parse fails the sample)."""
    if not completion.strip():
        return 0.0
    return await judge.grade(prompt, completion, **fields)
