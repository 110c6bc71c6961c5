"""The policy trainer of one rank: model, optimizer, the GRPO step, weights for publishing.

One process on a CPU, or one rank of DDP/FSDP on GPUs (the default process group is set
up by the caller). Math lives in `grpo.py`; this file only batches and steps.
"""

from __future__ import annotations

import copy
from collections.abc import Iterator, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any, cast

import torch
from torch import Tensor

from rljob_api.workercfg import TrainerWorkerConfig
from rljob_workers.common.device import resolve_dtype
from rljob_workers.common.freeze import frozen_names
from rljob_workers.trainer.batch_whiten import whitened_token_advantages
from rljob_workers.trainer.correction import correction_weights, mismatch
from rljob_workers.trainer.grpo import aggregate, entropy_sum, grpo_loss, token_entropy, token_logprobs
from rljob_workers.trainer.microbatch import collate
from rljob_workers.trainer.optimizer_state import load_optimizer, save_optimizer, save_optimizer_shard
from rljob_workers.trainer.past_versions import PastVersions
from rljob_workers.trainer.samples import WHITENED_ESTIMATORS, TrainSample
from rljob_workers.trainer.schedule import Schedule


def freeze_parameters(model: torch.nn.Module, patterns: Sequence[str]) -> frozenset[str]:
    """Stop training the parameters whose names match one of `patterns` (spec.trainer.freeze); their
    names (see `frozen_names` for what is refused)."""
    frozen = frozen_names(patterns, [name for name, _ in model.named_parameters()])
    for name, param in model.named_parameters():
        if name in frozen:
            param.requires_grad_(False)
    return frozen


def largest_part_sizes(total_samples: int, world_size: int, mini_batches: int) -> list[int]:
    """Samples in each mini-batch of the largest rank's share of the batch.

    Shards are `samples[rank::world]`, so rank 0's, ceil(N/W), is the largest, and part m of a
    shard of S samples (`shard[m::mini_batches]`) has ceil((S - m) / mini_batches).
    """
    largest = -(-total_samples // world_size)
    return [max(-(-(largest - mini) // mini_batches), 0) for mini in range(mini_batches)]


class PolicyTrainer:
    """Holds the policy (possibly DDP/FSDP-wrapped), its optimizer and the reference policy."""

    def __init__(
        self, config: TrainerWorkerConfig, device: torch.device, world_size: int = 1, resume_from: str | None = None
    ) -> None:
        """Load the policy from `resume_from` (a checkpoint's model) or the spec's model; the
        reference policy is always the spec's model."""
        from transformers import AutoModelForCausalLM, AutoTokenizer

        self.config = config
        self.algo = config.algorithm
        self.device = device
        self.world_size = world_size
        # Mixed precision: fp32 master weights and optimizer state (an update of lr 1e-6 rounds away in a
        # bf16 weight), the spec's dtype for compute and for the weights the rollout engines load.
        self.compute_dtype = resolve_dtype(config.dtype, device)
        torch.manual_seed(self.algo.seed)

        def load(path: str, dtype: torch.dtype) -> Any:
            loaded: Any = AutoModelForCausalLM.from_pretrained(path, dtype=dtype, local_files_only=True)
            loaded.to(device)
            return loaded

        model = load(resume_from or config.model_path, torch.float32)
        tokenizer = AutoTokenizer.from_pretrained(config.model_path, local_files_only=True)
        self.pad_id = tokenizer.pad_token_id if tokenizer.pad_token_id is not None else tokenizer.eos_token_id
        self.tokenizer = tokenizer
        if config.gradient_checkpointing:
            model.gradient_checkpointing_enable()
        self.reference = None
        if self.algo.kl_coef > 0:  # frozen: the compute dtype is enough
            self.reference = self._frozen_copy(load(config.model_path, self.compute_dtype) if resume_from else model)
            self.reference.to(self.compute_dtype)
        self.frozen = freeze_parameters(model, config.freeze)
        self._mismatch = [0.0, 0.0, 0.0]  # this step's engine/trainer log-prob gaps: sum, max, tokens
        # the versions a stale sample may come from, to measure its mismatch at its own weights
        self._past = PastVersions(0 if self.sharded else self.algo.max_staleness, self.compute_dtype)
        self.policy = model
        self.model = self._wrap(model)
        self.optimizer: torch.optim.Optimizer = torch.optim.AdamW(
            [p for p in self.model.parameters() if p.requires_grad],
            lr=self.algo.learning_rate,
            weight_decay=self.algo.weight_decay,
        )
        updates = self.algo.total_steps * self.algo.mini_batches * self.algo.update_epochs
        self.schedule = Schedule(self.optimizer, self.algo.schedule, updates)

    @staticmethod
    def _frozen_copy(model: torch.nn.Module) -> torch.nn.Module:
        reference = copy.deepcopy(model).eval()
        for param in reference.parameters():
            param.requires_grad_(False)
        return reference

    def _wrap(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.world_size == 1:
            return model
        if self.sharded:
            from torch.distributed.device_mesh import init_device_mesh
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            # The mesh on the trainer's own device type: fully_shard's default mesh is CUDA wherever a GPU is
            # visible, which would move a CPU trainer's shards onto it
            mesh = init_device_mesh(self.device.type, (self.world_size,))
            # FSDP casts the fp32 shards to the compute dtype for forward and backward, and reduces in fp32
            precision = MixedPrecisionPolicy(param_dtype=self.compute_dtype, reduce_dtype=torch.float32)
            for layer in getattr(getattr(model, "model", model), "layers", []):
                fully_shard(layer, mesh=mesh, mp_policy=precision)
            fully_shard(model, mesh=mesh, mp_policy=precision)
            return model
        from torch.nn.parallel import DistributedDataParallel

        ids = [self.device.index] if self.device.type == "cuda" else None
        return DistributedDataParallel(model, device_ids=ids)

    @property
    def sharded(self) -> bool:
        return self.world_size > 1 and self.config.strategy == "fsdp"

    def _logits(self, model: torch.nn.Module, batch: dict[str, Tensor]) -> Tensor:
        """The next-token logits, aligned with the batch's per-position tensors."""
        # autocast runs the fp32 masters in the compute dtype (FSDP casts them itself); token_logprobs works in fp32
        autocast = self.compute_dtype != torch.float32 and not self.sharded
        with torch.autocast(self.device.type, dtype=self.compute_dtype, enabled=autocast):
            return model(input_ids=batch["input_ids"], attention_mask=batch["attention_mask"]).logits[:, :-1]

    def _logprobs(self, model: torch.nn.Module, batch: dict[str, Tensor]) -> Tensor:
        return token_logprobs(self._logits(model, batch), batch["input_ids"][:, 1:], self.config.temperature)

    def train_step(self, samples: Sequence[TrainSample], total_samples: int, total_tokens: int) -> dict[str, float]:
        """One train step: `miniBatches` optimizer steps over this rank's share of the batch.

        `total_samples`/`total_tokens` count the whole batch over all ranks, so each
        micro-batch's loss is weighted exactly as if the batch were one (DDP then averages
        gradients over ranks, hence the world-size factor). Every backward is a collective, so
        every rank runs as many micro-batches as the largest share; one short of samples makes
        up the count with zero-weight padding micro-batches.
        """
        if len(samples) > -(-total_samples // self.world_size):
            raise ValueError(f"{len(samples)} samples on one rank of {self.world_size} for a batch of {total_samples}")
        sums: dict[str, float] = {}
        if self.algo.advantage_estimator in WHITENED_ESTIMATORS:
            samples = self._batch_normalized(samples, total_tokens, sums)
        minis, epochs, micro_size = self.algo.mini_batches, self.algo.update_epochs, self.config.micro_batch_size
        if (minis > 1 or epochs > 1) and self.algo.rollout_correction.mode != "none":
            samples = self._with_proximal(samples)  # later mini-batches come after updates
        self._mismatch = [0.0, 0.0, 0.0]  # sum, max, tokens: of the first mini-batch, before any update
        self._measure_stale_mismatch(samples)
        self._past.remember(self.policy)  # this step's version: stale samples of later steps come from it
        self.model.train()
        scale_samples = total_samples / minis
        scale_tokens = max(total_tokens / minis, 1.0)
        for epoch in range(epochs):  # each pass over the whole batch, its ratio against the sampler's log-probs
            for mini, largest in enumerate(largest_part_sizes(total_samples, self.world_size, minis)):
                part = list(samples[mini::minis])
                first = epoch == 0 and mini == 0
                self.optimizer.zero_grad(set_to_none=True)
                for start in range(0, largest, micro_size):
                    micro = part[start : start + micro_size]
                    if micro:
                        self._accumulate(micro, scale_samples, scale_tokens, sums, before_updates=first)
                    else:
                        self._accumulate_padding()
                sums["grad_norm"] = sums.get("grad_norm", 0.0) + self._clip_and_step()
        total, largest_gap, tokens = self._mismatch
        return {
            **{k: v / (minis * epochs) for k, v in sums.items()},
            "learning_rate": float(self.optimizer.param_groups[0]["lr"]),  # the step's last update's
            "logprob_mismatch_sum": total,
            "logprob_mismatch_max": largest_gap,
            "logprob_mismatch_tokens": tokens,
        }

    @torch.no_grad()
    def _with_proximal(self, samples: Sequence[TrainSample]) -> list[TrainSample]:
        """Each sample with the trainer's log-probs of its tokens now, at the step's start (the rollout
        correction's proximal policy), for the mini-batches that come after an update."""
        self.model.eval()
        out = []
        for start in range(0, len(samples), self.config.micro_batch_size):
            part = list(samples[start : start + self.config.micro_batch_size])
            batch = collate(part, self.pad_id, self.device)
            logprobs = self._logprobs(self.model, batch)
            for row, sample in enumerate(part):
                first = len(sample.prompt_token_ids) - 1
                values = logprobs[row, first : first + len(sample.token_ids)].tolist()
                out.append(replace(sample, proximal_logprobs=values))
        return out

    def _batch_normalized(self, samples: Sequence[TrainSample], total_tokens: int, sums: dict) -> list[TrainSample]:
        """REINFORCE++ (and its group-mean baseline): per-token advantages whitened over the whole batch."""
        kl_coef = self.algo.kl_coef if self.algo.kl_in == "reward" and self.reference is not None else 0.0
        reference = self.reference

        def reference_logprobs(batch: dict[str, Tensor]) -> Tensor:
            assert reference is not None
            return self._logprobs(reference, batch)

        whitened, kl_sum = whitened_token_advantages(
            samples,
            collate=lambda part: collate(part, self.pad_id, self.device),
            micro_size=self.config.micro_batch_size,
            kl_coef=kl_coef,
            kl_estimator=self.algo.kl_estimator,
            reference_logprobs=reference_logprobs,
            world_size=self.world_size,
        )
        if kl_coef > 0:
            sums["kl_reward"] = kl_sum / max(total_tokens, 1)  # the ranks' figures add up to the batch's mean
        return whitened

    def _accumulate_padding(self) -> None:
        """A forward/backward of weight 0, so that this rank joins the other ranks' collectives.

        One pad token as the completion, advantage 0: its loss is finite (a NaN times 0 would
        still poison the all-reduce) and cheap; its metrics are dropped.
        """
        padding = TrainSample([self.pad_id], [self.pad_id], [0.0], 0.0)
        self._accumulate([padding], 1.0, 1.0, {}, weight_scale=0.0)

    def _accumulate(
        self,
        micro: list[TrainSample],
        per_samples: float,
        per_tokens: float,
        sums: dict,
        weight_scale: float = 1.0,
        before_updates: bool = False,
    ) -> None:
        batch = collate(micro, self.pad_id, self.device)
        logits = self._logits(self.model, batch)
        logprobs = token_logprobs(logits, batch["input_ids"][:, 1:], self.config.temperature)
        # The sampler's entropy per response token; micro-batches' and ranks' shares add up to the batch's mean.
        entropy = entropy_sum(logits, batch["mask"], self.config.temperature) * weight_scale / per_tokens
        sums["entropy"] = sums.get("entropy", 0.0) + entropy
        bonus = None
        if self.algo.entropy_coef > 0:  # with its gradient, aggregated as the policy loss is
            per_token = token_entropy(logits, self.config.temperature)
            bonus = aggregate(per_token, batch["mask"], self.algo.loss_aggregation, self.algo.loss_norm_tokens)
        del logits  # not kept through the backward
        ref = None
        if self.reference is not None and self.algo.kl_in == "loss":
            with torch.no_grad():
                ref = self._logprobs(self.reference, batch)
        if before_updates and weight_scale:
            self._measure_mismatch(logprobs, batch)
        loss, metrics = self._loss(logprobs, batch, ref, before_updates)
        if bonus is not None:
            loss = loss - self.algo.entropy_coef * bonus
        # Token-mean weighs a micro-batch by its tokens; the others average over completions first
        if self.algo.loss_aggregation == "token-mean":
            weight = float(batch["mask"].sum()) / per_tokens
        else:
            weight = len(micro) / per_samples
        weight *= weight_scale
        (loss * weight * self.world_size).backward()
        for name, value in metrics.items():
            sums[name] = sums.get(name, 0.0) + float(value) * weight

    def _loss(
        self, logprobs: Tensor, batch: dict[str, Tensor], ref: Tensor | None, before_updates: bool
    ) -> tuple[Tensor, dict[str, Tensor]]:
        """The GRPO-family loss of a micro-batch, its ratio against the sampler's log-probs, or with a rollout
        correction against the trainer's own at the step's start (proximal)."""
        # Before the step's first update this forward is the trainer's own view of the samples' version.
        proximal = batch.get("proximal", logprobs.detach() if before_updates else None)
        old, weights = batch["behaviour"], None
        correction = self.algo.rollout_correction
        if correction.mode != "none" and proximal is not None:
            weights = correction_weights(
                proximal, batch["behaviour"], batch["mask"], correction.mode, correction.low, correction.high
            )
            old = proximal  # the ratio, clipped, against the trainer's own log-probs
        return grpo_loss(
            logprobs,
            old,
            batch["advantages"],
            batch["mask"],
            ref_logprobs=ref,
            kl_coef=self.algo.kl_coef if self.algo.kl_in == "loss" else 0.0,
            kl_kind=self.algo.kl_estimator,
            clip_low=self.algo.clip_low,
            clip_high=self.algo.clip_high,
            aggregation=self.algo.loss_aggregation,
            norm_tokens=self.algo.loss_norm_tokens,
            ratio_level=self.algo.ratio_level,
            token_weights=weights,
            clip_ratio_c=self.algo.clip_ratio_c,
        )

    def _measure_mismatch(self, logprobs: Tensor, batch: dict[str, Tensor], lag: int = 0) -> None:
        """|engine log-prob - trainer log-prob| over the tokens of the batch's samples generated `lag` versions
        before this step's, `logprobs` the trainer's at those weights."""
        total, largest, tokens = mismatch(logprobs, batch["behaviour"], batch["mask"], batch["lag"] == lag)
        self._mismatch = [self._mismatch[0] + total, max(self._mismatch[1], largest), self._mismatch[2] + tokens]

    def _measure_stale_mismatch(self, samples: Sequence[TrainSample]) -> None:
        """The mismatch of the stale samples, each at the weights of the version that generated it."""
        for lag in sorted({s.lag for s in samples if s.lag and self._past.has(s.lag)}):
            stale = [s for s in samples if s.lag == lag]
            for start in range(0, len(stale), self.config.micro_batch_size):
                batch = collate(stale[start : start + self.config.micro_batch_size], self.pad_id, self.device)
                logprobs = self._past.logprobs(self.policy, lag, self._logprobs, batch)
                if logprobs is not None:
                    self._measure_mismatch(logprobs, batch, lag)

    def _clip_and_step(self) -> float:
        norm = 0.0
        if self.algo.max_grad_norm > 0:
            norm = float(torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.algo.max_grad_norm))
        self.schedule.before_step()
        self.optimizer.step()
        return norm

    def named_weights(self) -> Iterator[tuple[str, Tensor]]:
        """The policy parameters training changes, by name, in the compute dtype the rollout engines load
        (what a weight sync sends). Frozen ones are left out: every engine loaded them from the model
        folder, and they never change."""
        for name, weight in self.master_weights(trained_only=True):
            if name not in self.frozen:
                yield name, weight.to(self.compute_dtype)

    def master_weights(self, trained_only: bool = False) -> Iterator[tuple[str, Tensor]]:
        """The full fp32 master parameters by name (what a checkpoint keeps); every rank takes part (FSDP).
        `trained_only`: a sharded policy's frozen parameters are not even gathered."""
        if self.sharded:
            from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict

            options = StateDictOptions(full_state_dict=True, cpu_offload=True, ignore_frozen_params=trained_only)
            full = get_model_state_dict(self.policy, options=options)
            names = {n for n, _ in self.policy.named_parameters()}
            yield from ((n, cast(Tensor, t)) for n, t in full.items() if n in names)
            return
        for name, param in self.policy.named_parameters():
            yield name, param.detach()

    def save(self, directory: Path, weights: dict[str, Tensor]) -> None:
        """Rank 0: write the policy (a loadable transformers model directory) and, unsharded, the optimizer
        state (every rank holds the same). A sharded optimizer is saved by every rank: `save_optimizer_shard`.

        `weights` is `dict(master_weights())`, gathered by every rank beforehand."""
        policy: Any = self.policy
        policy.save_pretrained(directory / "model", state_dict=weights)
        self.tokenizer.save_pretrained(directory / "model")
        if not self.sharded:
            save_optimizer(self.optimizer, directory)

    def save_optimizer_shard(self, directory: Path) -> None:
        """Every rank of a sharded policy: its own shard of the optimizer state (see optimizer_state.py)."""
        save_optimizer_shard(self.policy, self.optimizer, directory)

    def load_optimizer(self, directory: Path) -> None:
        load_optimizer(self.policy, self.optimizer, directory, sharded=self.sharded, device=self.device)
