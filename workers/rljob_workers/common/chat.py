"""Chat prompts: whether a model has a chat template, the conversation a data row makes, and the one
rendering of it into the text and token ids the policy is prompted with.

The controller renders each prompt once, when it reads the data, and sends the token ids; so every
rollout engine (hf, vLLM in its own environment, SGLang) and the reward pool see the same prompt. A
fast tokenizer (tokenizer.json) is loaded without torch, which the driver never imports.
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

Message = dict[str, str]

# Where transformers keeps a tokenizer's chat template: its own file (transformers 5 saves one), a
# processor's JSON, or a key of tokenizer_config.json (older saves).
TEMPLATE_FILES = ("chat_template.jinja", "chat_template.json")


def has_chat_template(model_path: str | Path) -> bool:
    """Whether the model folder's tokenizer carries a chat template (read from its files, no import)."""
    folder = Path(model_path)
    if any((folder / name).is_file() for name in TEMPLATE_FILES):
        return True
    try:
        config = json.loads((folder / "tokenizer_config.json").read_text())
    except (OSError, ValueError):
        return False
    return isinstance(config, dict) and bool(config.get("chat_template"))


def conversation(text: str | None, messages: Sequence[Message] | None, system_prompt: str | None) -> list[Message]:
    """The messages a prompt is rendered from: the row's messages, or its text as one user message,
    after `system_prompt` unless they open with a system message of their own."""
    turns = [dict(m) for m in messages] if messages is not None else [{"role": "user", "content": text or ""}]
    if system_prompt is not None and not (turns and turns[0].get("role") == "system"):
        turns.insert(0, {"role": "system", "content": system_prompt})
    return turns


def render(
    tokenizer: Any, conversations: Sequence[Sequence[Message]], tools: Sequence[dict[str, Any]] = ()
) -> tuple[list[str], list[list[int]]]:
    """Each conversation as the model's chat template writes it, up to the assistant's turn, and its token
    ids. The template writes the special tokens (BOS, role markers) itself, so none are added again:
    the ids are what ``apply_chat_template(messages, add_generation_prompt=True)`` returns. `tools` (an
    environment's, in the function format) go to the template as its `tools`."""
    offered = list(tools) or None
    texts = [
        str(tokenizer.apply_chat_template(list(turns), tools=offered, add_generation_prompt=True, tokenize=False))
        for turns in conversations
    ]
    ids = tokenizer(texts, add_special_tokens=False)["input_ids"] if texts else []
    return texts, [list(row) for row in ids]


def load_template_tokenizer(model_path: str | Path) -> Any:
    """The model's tokenizer, for rendering: a fast one (tokenizer.json) without torch, else transformers'
    AutoTokenizer (which imports torch)."""
    folder = Path(model_path)
    if (folder / "tokenizer.json").is_file():
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(folder, local_files_only=True)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(folder, local_files_only=True)
