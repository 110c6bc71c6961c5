"""The receiving end of the checkpoint engine inside each vLLM worker process (one per tensor- and
pipeline-parallel rank): rljob's `worker_extension_cls`.

vLLM mixes this class into its Worker, so `self` is the worker (`self.rank`, `self.device`,
`self.model_runner`, `self.reload_weights`); the adapter (`engines/vllm.py`) calls its methods by name
through `collective_rpc`, and every rank runs them. Only plain data crosses that call (names, numbers,
the bucket plan as its serialized proto, a file path); the weights arrive over rljob's own weight group
(gloo on CPU, NCCL on GPU, rank 0 the trainer) or, for a replica that joined late, from a safetensors
file the rollout server wrote. Methods are prefixed `rljob_`: vLLM refuses an extension attribute that
its Worker already has.
"""

from __future__ import annotations

import os
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import torch

from rljob.v1 import rollout_service_pb2 as pb
from rljob_workers.weights.buckets import from_proto
from rljob_workers.weights.group import BackendName, WeightGroup
from rljob_workers.weights.receiver import receive_broadcast


@dataclass
class ReceiverState:
    """One worker's side: its membership of the weight group, what it received and what it loaded."""

    group: WeightGroup | None = None
    staged: dict[str, torch.Tensor] | None = None  # received, not loaded yet (drain: at the safe point)
    staged_version: int | None = None
    counters: dict[str, Any] = field(
        default_factory=lambda: {
            "pid": os.getpid(),  # the worker's process: not the rollout server's
            "rank": -1,
            "bytes_received": 0,
            "buckets_received": 0,
            "tensors_loaded": 0,
            "loads": 0,
        }
    )


class WeightReceiver:
    """Joins the weight group, receives each version's buckets into this worker and loads them."""

    def _rljob(self) -> ReceiverState:
        state = getattr(self, "_rljob_state", None)
        if state is None:  # a mix-in has no __init__ of its own
            state = self._rljob_state = ReceiverState()
        return state

    def _rljob_device(self) -> torch.device:
        return torch.device(getattr(self, "device", "cpu"))

    def rljob_join_group(
        self, group_id: str, address: str, port: int, first_rank: int, world_size: int, backend: str, timeout: float
    ) -> int:
        """Join as rank first_rank + this worker's rank; blocks until every member has joined. Returns the rank."""
        self.rljob_leave_group()
        device = self._rljob_device()
        if backend == "nccl":  # NCCL binds to the calling thread's current device
            torch.cuda.set_device(device)
        rank = first_rank + int(getattr(self, "rank", 0))
        state = self._rljob()
        state.group = WeightGroup.create(
            group_id,
            address,
            port,
            rank,
            world_size,
            _backend(backend),
            timeout,
            device=device if backend == "nccl" else "cpu",
        )
        state.counters["rank"] = rank
        return rank

    def rljob_leave_group(self) -> None:
        state = self._rljob()
        group, state.group = state.group, None
        if group is not None:
            group.close()

    def rljob_receive(self, broadcast_source: bytes, version: int, load_now: bool) -> dict[str, Any]:
        """Receive one version's buckets (the plan: a serialized BroadcastSource) from rank 0 into this worker;
        load them now, or keep them for `rljob_load_staged` (drain: at the engine's next safe point), in
        place of any version kept before and not loaded yet."""
        state = self._rljob()
        if state.group is None:
            raise RuntimeError("rljob_receive before rljob_join_group")
        plans = [from_proto(bucket) for bucket in pb.BroadcastSource.FromString(broadcast_source).buckets]
        device = "cpu" if state.group.backend == "gloo" else self._rljob_device()
        started = time.perf_counter()
        state.staged, state.staged_version = None, None  # superseded, and its buffers let go before new ones
        state.staged = receive_broadcast(state.group, plans, device)
        state.staged_version = version
        counters = state.counters
        counters["bytes_received"] += sum(plan.nbytes for plan in plans)
        counters["buckets_received"] += len(plans)
        counters["receive_seconds"] = time.perf_counter() - started
        return self.rljob_load_staged() if load_now else dict(counters)

    def rljob_load_staged(self) -> dict[str, Any]:
        """Load the version `rljob_receive` kept; the counters say which (`loaded_version`: None when none was
        kept, as when an earlier call loaded it)."""
        state = self._rljob()
        tensors, version = state.staged, state.staged_version
        state.staged, state.staged_version = None, None
        if tensors is not None:
            self._rljob_load(iter(tensors.items()))
        return {**state.counters, "loaded_version": version}

    def rljob_load_file(self, path: str) -> dict[str, Any]:
        """Load a version from a safetensors file (pulled by the rollout server for a replica that joined late)."""
        from safetensors.torch import load_file

        tensors = load_file(path)
        self._rljob().counters["bytes_received"] += sum(t.numel() * t.element_size() for t in tensors.values())
        self._rljob_load(iter(tensors.items()))
        return dict(self._rljob().counters)

    def rljob_counters(self) -> dict[str, Any]:
        return dict(self._rljob().counters)

    def _rljob_load(self, named: Iterator[tuple[str, torch.Tensor]]) -> None:
        counters = self._rljob().counters
        started = time.perf_counter()

        def counted() -> Iterator[tuple[str, torch.Tensor]]:
            for item in named:
                counters["tensors_loaded"] += 1
                yield item

        # Checkpoint (Hugging Face) names and full shapes: each tensor-parallel rank takes its own shard.
        # Not model.load_weights: vLLM re-lays weights out at load (CPU packs linear layers), and only a
        # reload runs that again on the new values.
        self.reload_weights(weights_iterator=counted())  # type: ignore[attr-defined]
        self._rljob_refresh_tied_head()
        counters["loads"] += 1
        counters["load_seconds"] = time.perf_counter() - started

    def _rljob_refresh_tied_head(self) -> None:
        """vLLM 0.32's CPU backend: with tied embeddings a checkpoint has no lm_head.weight, so a reload never
        re-processes the output layer, whose matmul reads a packed copy of the embedding made at load: its
        logits would keep the old weights. Its post-load processing is run again."""
        if self._rljob_device().type != "cpu":
            return
        model = self.model_runner.get_model()  # type: ignore[attr-defined]
        head = getattr(model, "lm_head", None)
        embedding = getattr(getattr(model, "model", None), "embed_tokens", None)
        pointers = {getattr(getattr(part, "weight", None), "data_ptr", lambda: None)() for part in (head, embedding)}
        if head is not None and len(pointers) == 1 and None not in pointers:  # one tensor: tied
            head.quant_method.process_weights_after_loading(head)


def _backend(name: str) -> BackendName:
    if name not in ("gloo", "nccl"):
        raise ValueError(f"unknown weight group backend {name!r}")
    return "gloo" if name == "gloo" else "nccl"
