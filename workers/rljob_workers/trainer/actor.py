"""The trainer pool's Ray actor: one rank of the policy trainer in the pool's process. Rank 0 also publishes
weights: the broadcast group and the WeightService (both ends of the checkpoint engine live in `weights`)."""

from __future__ import annotations

import asyncio
import os
from pathlib import Path
from typing import Any, cast

import ray

from rljob_workers.common.actor import collector_paused, free_port, limit_threads, node_host
from rljob_workers.common.auth import required_job_token


@ray.remote
class TrainerActor:
    """One trainer rank. Rank 0 also publishes weights: the broadcast group and the WeightService."""

    def __init__(self, config_json: str, rank: int, world_size: int, cpus: float) -> None:
        from rljob_api.workercfg import TrainerWorkerConfig

        limit_threads(cpus)
        self.config = TrainerWorkerConfig.model_validate_json(config_json)
        self.rank, self.world_size = rank, world_size
        self.trainer: Any = None
        self.publisher: Any = None
        self.weight_server: Any = None
        self.group: Any = None
        self.store: Any = None

    def dist_address(self) -> tuple[str, int]:
        host = node_host()
        return host, free_port(host)

    async def setup(self, dist_address: tuple[str, int] | None, resume_dir: str | None) -> None:
        with collector_paused():
            await asyncio.to_thread(self._setup, dist_address, resume_dir)

    def _setup(self, dist_address: tuple[str, int] | None, resume_dir: str | None) -> None:
        import torch

        from rljob_workers.trainer.policy import PolicyTrainer

        gpu = self.config.gpus_per_node > 0 and torch.cuda.is_available()
        device = torch.device("cuda", torch.cuda.current_device()) if gpu else torch.device("cpu")
        if self.world_size > 1 and dist_address is not None:
            backend = "nccl" if gpu else "gloo"
            host, port = dist_address
            torch.distributed.init_process_group(
                backend, init_method=f"tcp://{host}:{port}", rank=self.rank, world_size=self.world_size
            )
        model_dir = str(Path(resume_dir) / "model") if resume_dir else None
        self.trainer = PolicyTrainer(self.config, device, self.world_size, resume_from=model_dir)
        if resume_dir:
            self.trainer.load_optimizer(Path(resume_dir))

    async def train_step(self, samples: list[Any], total_samples: int, total_tokens: int) -> dict[str, float]:
        result: dict[str, float] = await asyncio.to_thread(
            self.trainer.train_step, samples, total_samples, total_tokens
        )
        return result

    # ---- checkpoint engine (rank 0 serves; every rank joins the full-weight gather) ------
    async def start_weight_service(self) -> str:
        from rljob_workers.common.grpc_server import start_server
        from rljob_workers.weights.group import bucket_device
        from rljob_workers.weights.publisher import WeightPublisher, weight_service

        # NCCL broadcasts CUDA buckets (the trainer's GPU), gloo CPU ones
        device = bucket_device(cast(Any, self.config.weight_sync.backend), self.trainer.device)
        self.publisher = WeightPublisher.for_bucket_mb(self.config.weight_sync.bucket_size_mb, device)
        host = node_host()
        self.weight_server = await start_server([weight_service(self.publisher)], host, 0, token=required_job_token())
        return f"{host}:{self.weight_server.port}"

    async def publish(self, version: int, broadcast: bool = False) -> None:
        """Snapshot the weights as `version`; with `broadcast`, send each bucket to the group as it is packed."""
        weights = await asyncio.to_thread(lambda: list(self.trainer.named_weights()))
        if self.rank == 0:
            group = self.group if broadcast else None
            await asyncio.to_thread(self.publisher.publish, version, weights, group)

    def bucket_plans(self) -> bytes:
        from rljob.v1 import rollout_service_pb2
        from rljob_workers.weights.buckets import to_proto

        source = rollout_service_pb2.BroadcastSource(buckets=[to_proto(p) for p in self.publisher.plan])
        return source.SerializeToString()

    async def open_weight_group(self, group_id: str, world_size: int, backend: str, timeout: float) -> tuple[str, int]:
        from rljob_workers.weights.group import host_store

        if self.group is not None:
            self.group.close()
            self.group = None
        host = node_host()
        self.store = host_store(host, 0, timeout)
        self._pending_group = (group_id, host, int(self.store.port), world_size, backend, timeout)
        return host, int(self.store.port)

    async def join_weight_group(self) -> None:
        from rljob_workers.weights.group import WeightGroup

        group_id, host, port, world_size, backend, timeout = self._pending_group
        self.group = await asyncio.to_thread(
            WeightGroup.create,
            group_id,
            host,
            port,
            0,
            world_size,
            cast(Any, backend),
            timeout,
            store=self.store,
            device=self.publisher.device,
        )

    async def abort_weight_group(self, group_id: str, reason: str) -> None:
        """Fail this group's join or broadcast at every member now: the controller saw a member's call fail."""
        from rljob_workers.weights.group import abort

        if self.store is not None:
            abort(self.store, group_id, reason)

    async def broadcast(self) -> int:
        """Broadcast the newest published version to the group; returns that version."""
        version: int = await asyncio.to_thread(self.publisher.broadcast, self.group)
        return version

    async def save_checkpoint(self, root: str, step: int, state: dict[str, Any], keep: int) -> str:
        """Write step `step` under its staging name and commit it (rank 0); every rank takes part in
        gathering the full weights and, sharded, writes its optimizer shard. A committed step is kept as is."""
        from rljob_workers.trainer import checkpoint

        root_path = Path(root)
        final = checkpoint.step_dir(root_path, step)
        if checkpoint.is_complete(final):  # every rank sees the same: nothing of this save is written yet
            return str(final)
        # rank 0 lays out the staging folder before the gather below, which no rank leaves before it does
        staging = checkpoint.begin(root_path, step) if self.rank == 0 else checkpoint.staging_dir(root_path, step)
        assert staging is not None
        try:
            weights = await asyncio.to_thread(lambda: dict(self.trainer.master_weights()))
            if self.trainer.sharded:
                await asyncio.to_thread(self.trainer.save_optimizer_shard, staging)
            if self.rank == 0:
                await asyncio.to_thread(self.trainer.save, staging, weights)
        except Exception as exc:  # a full disk: OSError here, CheckpointException out of the shards' save
            error = checkpoint.failure(step, root_path, exc)
            if self.rank == 0:
                checkpoint.abandon(staging)
            raise error from None
        if self.rank == 0:
            await asyncio.to_thread(checkpoint.commit, root_path, staging, step, state, keep)
        return str(final)

    def pid(self) -> int:
        return os.getpid()

    def pod_name(self) -> str:
        """The pod this rank runs in ('' locally); what the supervisor pings."""
        return os.environ.get("POD_NAME", "")
