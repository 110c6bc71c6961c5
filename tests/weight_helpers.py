"""Helpers of the checkpoint-engine tests: a small model's state dict, exact comparison."""

from __future__ import annotations

from typing import TypeVar

import torch

BUCKET_BYTES = 4096
T = TypeVar("T")


def small_model(seed: int) -> dict[str, torch.Tensor]:
    """Interleaved dtypes, a non-contiguous tensor, a scalar, an empty one and one larger than a bucket."""
    g = torch.Generator().manual_seed(seed)
    return {
        "embed.weight": torch.randn(40, 16, generator=g).to(torch.bfloat16),
        "layer0.norm": torch.randn(16, generator=g),
        "layer0.proj": torch.randn(16, 48, generator=g).to(torch.bfloat16).t(),
        "layer0.scale": torch.randn((), generator=g),
        "big.weight": torch.randn(64, 32, generator=g),  # 8 KiB > BUCKET_BYTES
        "layer1.norm": torch.randn(16, generator=g),
        "positions": torch.arange(seed, seed + 10, dtype=torch.int64),
        "mask": torch.rand(7, generator=g) > 0.5,
        "empty": torch.zeros(0, 3),
    }


def assert_same(got: dict[str, torch.Tensor], want: dict[str, torch.Tensor]) -> None:
    assert sorted(got) == sorted(want)
    for name, tensor in want.items():
        assert got[name].dtype == tensor.dtype and got[name].shape == tensor.shape, name
        assert torch.equal(got[name], tensor), name


# --- buckets -------------------------------------------------------------------------------
