"""Prompts from a JSON-lines file, with a position that checkpoints exactly.

Prompts are handed out in a seeded order, epoch after epoch. A prompt handed out is
"pending" until the trainer has trained on its group; a checkpoint stores the cursor and
the pending prompts, so a resumed run re-issues exactly the prompts that were not yet
trained and skips every prompt that was.

A row holds plain text (spec.data.promptField) or a conversation (messagesField). Where the model's
chat template applies, every row is rendered once, as the data is read (`common.chat`), and its
prompt goes to the rollout pool as token ids.
"""

from __future__ import annotations

import json
import random
from collections import deque
from collections.abc import Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rljob_workers.common.chat import Message, conversation, has_chat_template, load_template_tokenizer, render


class DataError(ValueError):
    """A data file that cannot be used; the message names the file, line and field."""


@dataclass(frozen=True)
class Row:
    """One line of the data: the prompt's text (as rendered, where the chat template applies), the fields
    passed to reward functions, the conversation of messages data, and the rendered prompt's token ids
    (empty: the rollout replica tokenises the text)."""

    text: str
    fields: dict[str, str]
    messages: tuple[Message, ...] | None = None
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Prompt:
    """One prompt of the data set, with its stable id ("e<epoch>-<row>")."""

    prompt_id: str
    text: str
    fields: dict[str, str]
    messages: tuple[Message, ...] | None = None
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ChatPrompts:
    """Render the rows with the chat template of the model at `model_path`, after `system_prompt`, offering
    `tools` (an environment's, in the function format)."""

    model_path: str
    system_prompt: str | None = None
    tools: tuple[dict[str, Any], ...] = ()


def read_rows(path: Path, prompt_field: str, fields: list[str], messages_field: str | None = None) -> list[Row]:
    """Every row of a JSON-lines file, its prompt in `messages_field` if set, else in `prompt_field`; a bad
    row is an error, never skipped."""
    rows = []
    with path.open() as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            where = f"{path}:{number}"
            if messages_field is not None:
                rows.append(_messages_row(row, messages_field, fields, where))
            else:
                rows.append(_row(row, prompt_field, fields, where))
    if not rows:
        raise DataError(f"{path}: no prompts")
    return rows


def _row(row: object, prompt_field: str, fields: list[str], where: str) -> Row:
    """One row's prompt text and fields; a missing, null or non-text value is an error naming it."""
    values = _fields(row, [prompt_field, *fields], where)
    if not isinstance(values[prompt_field], str):
        raise DataError(f"{where}: field {prompt_field} is {_kind(values[prompt_field])}, not text")
    return Row(values[prompt_field], _reward_fields(values, fields, where))


def _messages_row(row: object, messages_field: str, fields: list[str], where: str) -> Row:
    """One row's conversation and fields; anything but a non-empty list of {role, content} texts is an error."""
    values = _fields(row, [messages_field, *fields], where)
    messages = values[messages_field]
    if not isinstance(messages, list):
        raise DataError(f"{where}: field {messages_field} is {_kind(messages)}, not a list of {{role, content}}")
    if not messages:
        raise DataError(f"{where}: field {messages_field} holds no messages")
    for index, message in enumerate(messages):
        if not isinstance(message, dict) or not all(isinstance(message.get(k), str) for k in ("role", "content")):
            raise DataError(f"{where}: {messages_field}[{index}] is not a {{role, content}} message of texts")
    turns = tuple({"role": m["role"], "content": m["content"]} for m in messages)
    return Row("", _reward_fields(values, fields, where), messages=turns)


def _fields(row: object, names: list[str], where: str) -> dict[str, Any]:
    if not isinstance(row, dict):
        raise DataError(f"{where}: a {type(row).__name__}, not a JSON object")
    missing = [f for f in names if f not in row]
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}")
    return row


def _reward_fields(row: dict[str, Any], fields: list[str], where: str) -> dict[str, str]:
    bad = [f for f in fields if row[f] is None or isinstance(row[f], (dict, list))]
    if bad:
        raise DataError(f"{where}: field {bad[0]} is {_kind(row[bad[0]])}, not a value")
    return {f: str(row[f]) for f in fields}


def chat_rows(rows: Sequence[Row], chat: ChatPrompts) -> list[Row]:
    """The rows with their prompts rendered by the model's chat template: text and token ids."""
    tokenizer = load_template_tokenizer(chat.model_path)
    conversations = [conversation(r.text, r.messages, chat.system_prompt) for r in rows]
    texts, ids = render(tokenizer, conversations, chat.tools)
    return [replace(r, text=t, token_ids=tuple(i)) for r, t, i in zip(rows, texts, ids, strict=True)]


def chat_prompts(
    model_path: str,
    chat_template: str,
    messages_field: str | None,
    system_prompt: str | None,
    tools: tuple[dict[str, Any], ...] = (),
) -> ChatPrompts | None:
    """How the data's prompts are rendered: with the model's template (spec.data.chatTemplate auto and the
    model has one), or not at all (None). Messages data without a template is an error."""
    if chat_template == "auto" and has_chat_template(model_path):
        return ChatPrompts(model_path, system_prompt, tools)
    if tools:
        raise DataError(
            f"spec.environment: its tools need a chat template to render them; the model {model_path} has none"
        )
    if messages_field is not None:
        raise DataError(f"spec.data.messagesField: the model {model_path} has no chat template to render messages")
    return None


def _kind(value: object) -> str:
    return "null" if value is None else f"a {type(value).__name__}"


@dataclass
class PromptSource:
    """Hands out prompts in seeded epoch order and remembers which are not yet trained."""

    rows: list[Row]
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
        return _as_prompt(f"e{self.epoch}-{row}", self.rows[row])

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

    def failed(self, prompt_id: str) -> None:
        """This prompt was set aside (failed.jsonl): done, never handed out again."""
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
            prompt = _as_prompt(prompt_id, self.rows[int(prompt_id.rsplit("-", 1)[1])])
            self.pending[prompt_id] = prompt
            self._retry.append(prompt)


def _as_prompt(prompt_id: str, row: Row) -> Prompt:
    return Prompt(prompt_id, row.text, row.fields, row.messages, row.token_ids)


def load_prompts(
    path: str | Path,
    prompt_field: str,
    fields: list[str],
    seed: int,
    shuffle: bool,
    *,
    messages_field: str | None = None,
    chat: ChatPrompts | None = None,
) -> PromptSource:
    """A PromptSource over a JSON-lines file, its prompts rendered by `chat` (None: as they are)."""
    path = Path(path)
    if not path.is_file():
        raise DataError(f"spec.data.path: {path} does not exist")
    rows = read_rows(path, prompt_field, fields, messages_field)
    return PromptSource(chat_rows(rows, chat) if chat else rows, seed=seed, shuffle=shuffle)
