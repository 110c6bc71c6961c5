"""Prompts from the data (any format data_files.py reads), with a position that checkpoints exactly.

Prompts are handed out in a seeded order, epoch after epoch. A prompt handed out is
"pending" until the trainer has trained on its group; a checkpoint stores the cursor and
the pending prompts, so a resumed run re-issues exactly the prompts that were not yet
trained and skips every prompt that was.

A row holds plain text (spec.data.promptField) or a conversation (messagesField). Where the model's
chat template applies, a row is rendered when it is drawn (`common.chat`), and its prompt goes to the
rollout pool as token ids. A row's fields keep their JSON types (numbers, lists, objects); a dotted name
(`reward_model.ground_truth`) reads a key inside an object column.
"""

from __future__ import annotations

import json
import random
import tempfile
from array import array
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any

from rljob_workers.common.chat import Message, conversation, has_chat_template, load_template_tokenizer, render
from rljob_workers.driver.controller.data_files import DataError, DatasetRows, check_columns, open_dataset

__all__ = ["BadRow", "DataError", "Prompt", "PromptSource", "Row", "check_rows", "load_prompts", "open_rows"]


class BadRow(DataError):
    """A drawn row whose values do not make a prompt (a missing field, a prompt that is no text)."""

    def __init__(self, prompt_id: str, reason: str) -> None:
        super().__init__(reason)
        self.prompt_id = prompt_id


@dataclass(frozen=True)
class Row:
    """One row of the data: the prompt's text (as rendered, where the chat template applies), the fields
    passed to reward functions (JSON-typed, by the names spec.data.fields gives them), the conversation of
    messages data, and the rendered prompt's token ids (empty: the rollout replica tokenises the text)."""

    text: str
    fields: dict[str, Any]
    messages: tuple[Message, ...] | None = None
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class Prompt:
    """One prompt of the data set, with its stable id ("e<epoch>-<row>")."""

    prompt_id: str
    text: str
    fields: dict[str, Any]
    messages: tuple[Message, ...] | None = None
    token_ids: tuple[int, ...] = ()


@dataclass(frozen=True)
class ChatPrompts:
    """Render the rows with the chat template of the model at `model_path`, after `system_prompt`, offering
    `tools` (an environment's, in the function format)."""

    model_path: str
    system_prompt: str | None = None
    tools: tuple[dict[str, Any], ...] = ()


def open_rows(
    path: Path,
    prompt_field: str,
    fields: list[str],
    messages_field: str | None = None,
    *,
    split: str = "train",
    cache_dir: Path,
    chat: ChatPrompts | None = None,
) -> DatasetRows:
    """The rows of the data at `path`, each converted (and rendered by `chat`) when drawn; the columns the spec
    names are checked now, each row's values as it is drawn (a bad one an error naming file:row, never skipped)."""
    dataset = open_dataset(path, split, cache_dir)
    check_columns(dataset, [messages_field or prompt_field, *fields], path)
    make, render_row = _converter(prompt_field, fields, messages_field), _Renderer(chat) if chat else None

    def convert(row: dict[str, Any], where: str) -> Row:
        made = make(row, where)
        return render_row(made) if render_row is not None else made

    return DatasetRows(dataset, path, convert)


Converter = Callable[[dict[str, Any], str], Row]  # a row's values and where it is (file:row) -> its Row


def check_rows(
    path: Path, prompt_field: str, fields: list[str], messages_field: str | None, *, split: str, rows: int
) -> None:
    """The set-up check of the data: its columns, and its first `rows` rows converted (each as it would be when
    drawn), in well under a second for JSON lines (read as lines, without `datasets`); every other format through
    `datasets`, its Arrow copy in a folder of its own that goes afterwards."""
    convert = _converter(prompt_field, fields, messages_field)
    if path.is_file() and path.suffix.lower() == ".jsonl":
        if split != "train":
            raise DataError(f"{path}: one file holds one split, train, not {split!r} (spec.data.split)")
        _check_json_lines(path, convert, rows)
        return
    with tempfile.TemporaryDirectory(prefix="rljob-data-check-") as cache:
        found = open_rows(path, prompt_field, fields, messages_field, split=split, cache_dir=Path(cache))
        for index in range(min(rows, len(found))):
            found[index]


def _check_json_lines(path: Path, convert: Converter, rows: int) -> None:
    seen = 0
    with path.open(encoding="utf-8") as handle:
        for number, line in enumerate(handle, start=1):
            if not line.strip():
                continue
            try:
                row = json.loads(line)
            except json.JSONDecodeError as exc:
                raise DataError(f"{path}:{number}: not valid JSON ({exc.msg})") from None
            convert(row, f"{path}:{number}")
            seen += 1
            if seen >= rows:
                return
    if not seen:
        raise DataError(f"{path}: no prompts")


def _converter(prompt_field: str, fields: list[str], messages_field: str | None) -> Converter:
    if messages_field is not None:
        return lambda row, where: _messages_row(row, messages_field, fields, where)
    return lambda row, where: _row(row, prompt_field, fields, where)


def _row(row: dict[str, Any], prompt_field: str, fields: list[str], where: str) -> Row:
    """One row's prompt text and fields; a missing, null or non-text prompt is an error naming it."""
    values = _fields(row, [prompt_field, *fields], where)
    if not isinstance(values[prompt_field], str):
        raise DataError(f"{where}: field {prompt_field} is {_kind(values[prompt_field])}, not text")
    return Row(values[prompt_field], {f: values[f] for f in fields})


def _messages_row(row: dict[str, Any], messages_field: str, fields: list[str], where: str) -> Row:
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
    return Row("", {f: values[f] for f in fields}, messages=turns)


def _fields(row: object, names: list[str], where: str) -> dict[str, Any]:
    """The row's value of each name; a dotted name reads a key inside an object (`reward_model.ground_truth`)."""
    if not isinstance(row, dict):
        raise DataError(f"{where}: a {type(row).__name__}, not a JSON object")
    values, missing = {}, []
    for name in names:
        value: Any = row
        for part in name.split("."):
            if not isinstance(value, dict) or part not in value:
                missing.append(name)
                break
            value = value[part]
        else:
            values[name] = value
    if missing:
        raise DataError(f"{where}: missing field(s) {', '.join(missing)}")
    return values


class _Renderer:
    """A row's prompt rendered by the model's chat template (its tokenizer loaded once)."""

    def __init__(self, chat: ChatPrompts) -> None:
        self.chat = chat
        self.tokenizer = load_template_tokenizer(chat.model_path)

    def __call__(self, row: Row) -> Row:
        texts, ids = render(
            self.tokenizer, [conversation(row.text, row.messages, self.chat.system_prompt)], self.chat.tools
        )
        return replace(row, text=texts[0], token_ids=tuple(ids[0]))


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

    rows: Sequence[Row]
    seed: int
    shuffle: bool = True
    epoch: int = 0
    cursor: int = 0
    pending: dict[str, Prompt] = field(default_factory=dict)
    _retry: deque[Prompt] = field(default_factory=deque)
    _order: Sequence[int] = field(default_factory=list)

    def __post_init__(self) -> None:
        self._order = self._epoch_order(self.epoch)

    def _epoch_order(self, epoch: int) -> Sequence[int]:
        # 8 bytes a row, where a list of ints is about 36: a million-row set's order is 8 MB of the driver's
        # memory. random.shuffle swaps items in place whatever the sequence: the same order as a list's.
        order = array("q", range(len(self.rows)))
        if self.shuffle:
            random.Random(self.seed * 1_000_003 + epoch).shuffle(order)
        return order

    def _prompt(self, row: int) -> Prompt:
        return _as_prompt(f"e{self.epoch}-{row}", self.rows[row])

    def next(self) -> Prompt:
        """The next prompt: one handed back first, else the next of the epoch order. A row whose values do not
        make a prompt raises BadRow (it is passed over: the caller sets it aside)."""
        if self._retry:
            return self._retry.popleft()
        if self.cursor == len(self._order):
            self.epoch, self.cursor = self.epoch + 1, 0
            self._order = self._epoch_order(self.epoch)
        row = self._order[self.cursor]
        self.cursor += 1
        try:
            prompt = self._prompt(row)
        except DataError as exc:
            raise BadRow(f"e{self.epoch}-{row}", str(exc)) from None
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
    split: str = "train",
    cache_dir: Path,
) -> PromptSource:
    """A PromptSource over the data at `path`, its prompts rendered by `chat` (None: as they are)."""
    path = Path(path)
    if not path.exists():
        raise DataError(f"spec.data.path: {path} does not exist")
    rows = open_rows(path, prompt_field, fields, messages_field, split=split, cache_dir=cache_dir, chat=chat)
    return PromptSource(rows, seed=seed, shuffle=shuffle)
