"""The weights of the versions before the one a step trains from, kept so that the engine/trainer log-prob
mismatch is measured on stale samples too: a sample generated `lag` versions ago is compared with the
trainer's log-probs at those very weights, not at weights that have moved since.

Up to `keep` versions (the job's maxStaleness), in the compute dtype, each a copy of the policy's
parameters; one scratch copy of the model runs them. Not kept for a sharded (FSDP) policy, whose ranks hold
only shards: there the mismatch is measured on the samples of the step's own version only.
"""

from __future__ import annotations

import copy
from collections import deque
from collections.abc import Callable

import torch
from torch import Tensor


class PastVersions:
    """The last `keep` versions' parameters, newest last."""

    def __init__(self, keep: int, dtype: torch.dtype) -> None:
        self.keep, self.dtype = keep, dtype
        self._states: deque[dict[str, Tensor]] = deque(maxlen=max(keep, 1))
        self._scratch: torch.nn.Module | None = None

    def remember(self, model: torch.nn.Module) -> None:
        """Keep `model`'s parameters as they are now (a step's starting version, before its update)."""
        if self.keep == 0:
            return
        self._states.append({name: p.detach().to(self.dtype, copy=True) for name, p in model.named_parameters()})

    def has(self, lag: int) -> bool:
        return 1 <= lag <= len(self._states)

    @torch.no_grad()
    def logprobs(
        self,
        model: torch.nn.Module,
        lag: int,
        forward: Callable[[torch.nn.Module, dict[str, Tensor]], Tensor],
        batch: dict[str, Tensor],
    ) -> Tensor | None:
        """`forward(model, batch)` run by the weights of `lag` versions ago (None if not kept); `model` is the
        policy, whose shape the scratch copy takes once."""
        if not self.has(lag):
            return None
        if self._scratch is None:
            self._scratch = copy.deepcopy(model).eval().to(self.dtype)
        scratch = self._scratch
        state = self._states[-lag]
        for name, param in scratch.named_parameters():
            param.copy_(state[name])
        return forward(scratch, batch)
