"""Prompts from a JSON-lines file, with a position that checkpoints exactly.

Prompts are handed out in a seeded order, epoch after epoch. A prompt handed out is
"pending" until the trainer has trained on its group; a checkpoint stores the cursor and
the pending prompts, so a resumed run re-issues exactly the prompts that were not yet
trained and skips every prompt that was.
"""

from __future__ import annotations

import json
import random
from collections import deque
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any


class DataError(ValueError):
    """A data file that cannot be used; the message names the file, line and field."""


@dataclass(frozen=True)
class Prompt:
    """One prompt of the data set, with its stable id ("e<epoch>-<row>")."""

    prompt_id: str
    text: str
    fields: dict[str, str]


def read_rows(path: Path, prompt_field: str, fields: list[str]) -> list[tuple[str, dict[str, str]]]:
    """Every (prompt, fields) row of a JSON-lines file; a bad row is an error, never skipped."""
    rows = []
    with path.open() as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            rows.append(_row(row, prompt_field, fields, f"{path}:{number}"))
    if not rows:
        raise DataError(f"{path}: no prompts")
    return rows


def _row(row: object, prompt_field: str, fields: list[str], where: str) -> tuple[str, dict[str, str]]:
    """One row's prompt text and fields; a missing, null or non-text value is an error naming it."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: a {type(row).__name__}, not a JSON object")
    missing = [f for f in [prompt_field, *fields] if f not in row]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}")
    if not isinstance(row[prompt_field], str):
        raise DataError(f"{where}: field {prompt_field} is {_kind(row[prompt_field])}, not text")
    bad = [f for f in fields if row[f] is None or isinstance(row[f], (dict, list))]
    if bad:
        raise DataError(f"{where}: field {bad[0]} is {_kind(row[bad[0]])}, not a value")
    return row[prompt_field], {f: str(row[f]) for f in fields}


def _kind(value: object) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


@dataclass
class PromptSource:
    """Hands out prompts in seeded epoch order and remembers which are not yet trained."""

    rows: list[tuple[str, dict[str, str]]]
    seed: int
    shuffle: bool = True
    epoch: int = 0
    cursor: int = 0
    pending: dict[str, Prompt] = field(default_factory=dict)
    _retry: deque[Prompt] = field(default_factory=deque)
    _order: list[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._order = self._epoch_order(self.epoch)

    def _epoch_order(self, epoch: int) -> list[int]:
        order = list(range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def _prompt(self, row: int) -> Prompt:
        text, fields = self.rows[row]
        return Prompt(f"e{self.epoch}-{row}", text, fields)

    def next(self) -> Prompt:
        """The next prompt: one handed back first, else the next of the epoch order."""
        if self._retry:
            return self._retry.popleft()
        if self.cursor == len(self._order):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._epoch_order(self.epoch)
        prompt = self._prompt(self._order[self.cursor])
        self.cursor += 1
        self.pending[prompt.prompt_id] = prompt
        return prompt

    def retry(self, prompt: Prompt) -> None:
        """Hand a pending prompt out again (its group was lost or too stale); it stays pending."""
        if prompt.prompt_id not in self.pending:
            raise KeyError(f"prompt {prompt.prompt_id} is not pending")
        self._retry.append(prompt)

    def trained(self, prompt_id: str) -> None:
        """The trainer has used this prompt's group; it is never handed out again."""
        del self.pending[prompt_id]

    def filtered(self, prompt_id: str) -> None:
        """This prompt's group had nothing to learn (dynamic sampling dropped it): done, as if trained."""
        del self.pending[prompt_id]

    def state(self) -> dict[str, Any]:
        """JSON-able position for a checkpoint."""
        return {"epoch": self.epoch, "cursor": self.cursor, "pending": sorted(self.pending)}

    def restore(self, state: dict[str, Any]) -> None:
        """Continue from a checkpoint: untrained prompts first, then the cursor."""
        self.epoch, self.cursor = int(state["epoch"]), int(state["cursor"])
        self._order = self._epoch_order(self.epoch)
        self.pending.clear()
        self._retry.clear()
        for prompt_id in state["pending"]:
            text, fields = self.rows[int(prompt_id.rsplit("-", 1)[1])]
            prompt = Prompt(prompt_id, text, fields)
            self.pending[prompt_id] = prompt
            self._retry.append(prompt)


def load_prompts(path: str | Path, prompt_field: str, fields: list[str], seed: int, shuffle: bool) -> PromptSource:
    """A PromptSource over a JSON-lines file."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"spec.data.path: {path} does not exist")
    return PromptSource(read_rows(path, prompt_field, fields), seed=seed, shuffle=shuffle)
