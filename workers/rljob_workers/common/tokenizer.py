"""Loading a checkpoint's tokenizer the way every engine needs it."""

from __future__ import annotations

from typing import Any

from transformers import AutoTokenizer, GenerationConfig


def load_tokenizer(model_path: str) -> tuple[Any, list[int]]:
    """A checkpoint's tokenizer and every token that ends its sequences (its generation config may list several)."""
    tokenizer = AutoTokenizer.from_pretrained(model_path, local_files_only=True)
    try:
        configured = GenerationConfig.from_pretrained(model_path, local_files_only=True).eos_token_id
    except OSError:  # no generation_config.json: the tokenizer's EOS is all there is
        configured = None
    ids = configured if isinstance(configured, list) else [configured] if configured is not None else []
    if tokenizer.eos_token_id is not None and tokenizer.eos_token_id not in ids:
        ids.append(tokenizer.eos_token_id)
    if not ids:
        raise ValueError(f"{model_path} defines no end-of-sequence token (generation_config.json or tokenizer)")
    return tokenizer, [int(i) for i in ids]
