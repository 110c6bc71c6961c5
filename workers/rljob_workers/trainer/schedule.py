"""spec.algorithm.schedule: the learning rate of each optimizer step, by transformers' schedulers.

The schedule is placed by the optimizer's own step count (AdamW keeps it in its state, which checkpoints
save): a resumed run continues the schedule where it was without a state of its own to save.
"""

from __future__ import annotations

import torch

from rljob_api.algorithm import LearningRateSchedule

# spec.algorithm.schedule.kind -> transformers' scheduler
SCHEDULERS = {"constant": "constant_with_warmup", "linear": "linear", "cosine": "cosine_with_min_lr"}


class Schedule:
    """Sets the learning rate of `optimizer`'s next step (`before_step`) from the steps it has made."""

    def __init__(self, optimizer: torch.optim.Optimizer, spec: LearningRateSchedule, total_steps: int) -> None:
        from transformers import get_scheduler

        kwargs = {"min_lr_rate": spec.min_ratio} if spec.kind == "cosine" else None
        self.optimizer = optimizer
        self.scheduler = get_scheduler(
            SCHEDULERS[spec.kind],
            optimizer,
            num_warmup_steps=spec.warmup_steps,
            num_training_steps=total_steps,
            scheduler_specific_kwargs=kwargs,
        )

    def factor(self, steps_done: int) -> float:
        """The learning rate of optimizer step `steps_done` + 1, as a fraction of learningRate."""
        return float(self.scheduler.lr_lambdas[0](steps_done))

    def before_step(self) -> float:
        """Set every parameter group's learning rate for the optimizer's next step; the rate set."""
        done = steps_done(self.optimizer)
        for group, base in zip(self.optimizer.param_groups, self.scheduler.base_lrs, strict=True):
            group["lr"] = base * self.factor(done)
        return float(self.optimizer.param_groups[0]["lr"])


def steps_done(optimizer: torch.optim.Optimizer) -> int:
    """Optimizer steps made (a loaded state's included): AdamW's `step` of a parameter it has updated."""
    for state in optimizer.state.values():
        step = state.get("step")
        if step is not None:
            return int(step.item() if isinstance(step, torch.Tensor) else step)
    return 0
