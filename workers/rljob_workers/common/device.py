"""Device and dtype choice shared by the engines, the trainer and the reward models."""

from __future__ import annotations

import torch

DTYPES = {"float32": torch.float32, "bfloat16": torch.bfloat16, "float16": torch.float16}


def resolve_dtype(dtype: str, device: str | torch.device) -> torch.dtype:
    """auto is bfloat16 on a GPU and float32 on a CPU (CPU bf16 matmuls are slow and imprecise)."""
    if dtype == "auto":
        return torch.bfloat16 if str(device).startswith("cuda") else torch.float32
    if dtype not in DTYPES:
        raise ValueError(f"unknown dtype {dtype!r}; use auto, {', '.join(DTYPES)}")
    return DTYPES[dtype]
