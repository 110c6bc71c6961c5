"""Poison input is a sample's problem, not the run's: a row whose values make no prompt (a missing field, checked
as each row is drawn), a prompt too long for the model (data.maxPromptTokens, checked as it is drawn, never
sent to an engine) or one whose generation the engine failed
rollout.retries times more is set aside: one line in `<output>/failed.jsonl` with its row and reason,
counted, and never handed out again. The run fails only past algorithm.maxFailedPrompts, naming them.
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from rljob_api.workercfg import ControllerConfig
from rljob_workers.driver.controller.data import BadRow, Prompt, PromptSource
from rljob_workers.driver.controller.groups import GroupTracker
from rljob_workers.driver.controller.messages import contiguous_runs
from rljob_workers.driver.controller.report import Counts

log = logging.getLogger(__name__)

FAILED_JSONL = "failed.jsonl"


def row_of(prompt_id: str) -> int:
    """The data row of a prompt id ("e<epoch>-<row>")."""
    return int(prompt_id.rsplit("-", 1)[1])


@dataclass
class SetAside:
    """The prompts the run set aside, written as they are; `limit`: algorithm.maxFailedPrompts."""

    limit: int
    path: Path | None = None  # None: not written (a unit test)
    ids: list[str] = field(default_factory=list)  # this process's, for the failure's message

    def add(self, prompt: Prompt, reason: str, step: int, total: int) -> str | None:
        """Record `prompt`; `total` counts every prompt set aside in the run so far, this one included. The
        run's failure message when `total` passes the limit, else None."""
        self.ids.append(prompt.prompt_id)
        row = row_of(prompt.prompt_id)
        record = {
            "prompt_id": prompt.prompt_id,
            "row": row,
            "line": row + 1,
            "reason": reason,
            "step": step,
            "prompt_chars": len(prompt.text),
            "prompt_start": prompt.text[:200],
        }
        log.warning("prompt %s (data line %d) set aside: %s", prompt.prompt_id, row + 1, reason)
        if self.path is not None:
            descriptor = os.open(self.path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
            try:
                os.write(descriptor, (json.dumps(record) + "\n").encode())
            finally:
                os.close(descriptor)
        if total <= self.limit:
            return None
        return (
            f"{total} prompts set aside, more than algorithm.maxFailedPrompts {self.limit} "
            f"(see {self.path or FAILED_JSONL}): {', '.join(self.ids[-8:])}; last: {reason}"
        )


@dataclass(frozen=True)
class PromptLimit:
    """data.maxPromptTokens: a rendered prompt's tokens are its token ids (the chat template's), else the
    model's tokenizer's count of its text."""

    max_tokens: int
    count: Callable[[str], int]

    def excess(self, prompt: Prompt) -> str | None:
        """Why `prompt` is too long, or None."""
        tokens = len(prompt.token_ids) or self.count(prompt.text)
        if tokens <= self.max_tokens:
            return None
        return f"prompt of {tokens} tokens is longer than data.maxPromptTokens {self.max_tokens}"


def prompt_limit(model_path: str, max_prompt_tokens: int | None, max_new_tokens: int) -> PromptLimit:
    """The limit of a job: data.maxPromptTokens, by default the model's context (max_position_embeddings)
    less maxNewTokens; counted with the model's fast tokenizer, loaded without torch."""
    folder = Path(model_path)
    if max_prompt_tokens is None:
        config: dict[str, Any] = json.loads((folder / "config.json").read_text())
        context = config.get("max_position_embeddings") or config.get("n_positions") or 1 << 30
        max_prompt_tokens = max(1, int(context) - max_new_tokens)
    if (folder / "tokenizer.json").is_file():
        from tokenizers import Tokenizer

        tokenizer = Tokenizer.from_file(str(folder / "tokenizer.json"))
        return PromptLimit(max_prompt_tokens, lambda text: len(tokenizer.encode(text).ids))
    from rljob_workers.common.chat import load_template_tokenizer

    slow = load_template_tokenizer(folder)
    return PromptLimit(max_prompt_tokens, lambda text: len(slow(text)["input_ids"]))


@dataclass
class PromptGuard:
    """The controller's gate for poison input: draws prompts within the limit, and decides what becomes of a
    prompt whose generation the engine failed. `fail` ends the run with its message."""

    config: ControllerConfig
    prompts: PromptSource
    tracker: GroupTracker
    counts: Counts
    fail: Callable[[str], None]
    set_aside: SetAside | None = None  # None: kept, not written (algorithm.maxFailedPrompts its limit)
    limit: PromptLimit | None = None
    engine_failures: dict[str, int] = field(default_factory=dict)  # by prompt id: its failures so far

    def __post_init__(self) -> None:
        if self.set_aside is None:
            self.set_aside = SetAside(self.config.algorithm.max_failed_prompts)

    def draw(self, step: int) -> Prompt | None:
        """The next prompt within data.maxPromptTokens; a longer one is set aside (promptTooLong: drop) or
        fails the run (fail; or past maxFailedPrompts: then None)."""
        assert self.set_aside is not None
        while self.counts.failed_prompts <= self.set_aside.limit:
            try:
                prompt = self.prompts.next()
            except BadRow as bad:  # a row that makes no prompt: set aside, as a prompt too long
                self._record(Prompt(bad.prompt_id, "", {}), str(bad), step)
                continue
            excess = self.limit.excess(prompt) if self.limit is not None else None
            if excess is None:
                return prompt
            if self.config.data.prompt_too_long == "fail":
                self.fail(f"data line {row_of(prompt.prompt_id) + 1} (prompt {prompt.prompt_id}): {excess}")
                return None
            self.prompts.failed(prompt.prompt_id)
            self._record(prompt, excess, step)
        return None

    def engine_failed(self, prompt: Prompt, replica: str, error: str, step: int) -> list[list[int]]:
        """The runs of sample indices to generate again on another replica (rollout.retries times); then the
        prompt is set aside ([]): dropped if nothing of it came, else its missing samples leave the group."""
        group = self.tracker.groups.get(prompt.prompt_id)
        if group is None or not group.missing():
            return []
        tries = self.engine_failures[prompt.prompt_id] = self.engine_failures.get(prompt.prompt_id, 0) + 1
        if tries <= self.config.rollout_retries:
            log.warning(
                "rollout replica %s failed prompt %s (%s); try %d elsewhere",
                replica,
                prompt.prompt_id,
                error,
                tries + 1,
            )
            return contiguous_runs(group.missing())
        del self.engine_failures[prompt.prompt_id]
        missing = group.missing()
        if group.received:  # those that came are trained
            self.counts.failed_samples += len(missing)
            for index in missing:
                self.tracker.exclude(prompt.prompt_id, index)
        else:
            self.tracker.drop(prompt.prompt_id)
            self.prompts.failed(prompt.prompt_id)
        self._record(
            prompt, f"the engine failed {len(missing)} sample(s), {tries} tries; last on {replica}: {error}", step
        )
        return []

    def _record(self, prompt: Prompt, reason: str, step: int) -> None:
        self.counts.failed_prompts += 1
        assert self.set_aside is not None
        message = self.set_aside.add(prompt, reason, step, self.counts.failed_prompts)
        if message is not None:
            self.fail(message)
