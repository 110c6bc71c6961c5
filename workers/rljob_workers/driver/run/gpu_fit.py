"""Whether a colocated job's rollout replica and trainer rank fit one GPU (`spec.colocate`), checked before
Ray starts: the policy's parameters counted from its config (no weights loaded), the GPU's memory from
torch, or from `rljob validate --deep --gpu-memory` for a GPU this machine does not have."""

from __future__ import annotations

import os
from collections.abc import Callable
from pathlib import Path

from rljob_api import RLJob
from rljob_api.colocate import COLOCATE_ON_A_CLUSTER
from rljob_api.colocate_fit import colocate_refusal
from rljob_workers.driver.errors import SetupError, first_line


def policy_parameters(path: str) -> int:
    """The policy's parameter count, from its config on torch's meta device (nothing allocated)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM

    try:
        config = AutoConfig.from_pretrained(path, local_files_only=True)
        with torch.device("meta"):
            model = AutoModelForCausalLM.from_config(config)
    except Exception as exc:  # the model check names the folder's fault; this says where it showed
        raise SetupError(f"spec.model.path: {path} does not build: {type(exc).__name__}: {first_line(exc)}") from None
    return sum(p.numel() for p in model.parameters())


def visible_gpu_bytes() -> int | None:
    """The smallest visible GPU's memory (every GPU holds a pair), or None without a GPU."""
    import torch

    if not torch.cuda.is_available():
        return None
    return min(torch.cuda.get_device_properties(i).total_memory for i in range(torch.cuda.device_count()))


def check_colocate_fits(job: RLJob, *, cluster: bool = False, gpu_bytes: int | None = None) -> bool:
    """A colocated job's pair fits each GPU (`gpu_bytes`, else the visible GPUs'): a SetupError saying
    what to change where it does not, or where colocate cannot run (a cluster; no GPU for `rljob run`).
    False when there was nothing to check against (`rljob validate --deep` on a machine without a GPU)."""
    if not job.spec.colocate:
        return True
    if cluster:
        raise SetupError(f"spec.colocate: {COLOCATE_ON_A_CLUSTER}")
    gpu = gpu_bytes if gpu_bytes is not None else visible_gpu_bytes()
    if gpu is None:
        return False
    refusal = colocate_refusal(job.spec, policy_parameters(job.spec.model.path), gpu)
    if refusal:
        raise SetupError(refusal)
    return True


def visible_gpus() -> int:
    """NVIDIA GPUs this machine shows its processes, counted as Ray counts them (device files, narrowed by
    CUDA_VISIBLE_DEVICES) without importing torch: a check before Ray starts must take no seconds."""
    devices = len([path for path in Path("/dev").glob("nvidia*") if path.name[len("nvidia") :].isdigit()])
    chosen = os.environ.get("CUDA_VISIBLE_DEVICES")
    if chosen is None:
        return devices
    return min(devices, len([d for d in chosen.split(",") if d.strip() and not d.strip().startswith("-")]))


def require_gpus_here(job: RLJob, visible: Callable[[], int] = visible_gpus) -> None:
    """`rljob run` of a job that asks for GPUs: there are as many here, or a SetupError naming the field. Ray
    would otherwise wait for them for ever, its actors' leases pending without a word."""
    rollout, trainer = job.spec.rollout, job.spec.trainer
    asked = rollout.replicas * rollout.gpus_per_replica
    if not job.spec.colocate:  # colocated, each rank shares its rollout replica's GPU
        asked += trainer.nodes * trainer.gpus_per_node
    if asked == 0:
        return
    here = visible()
    if asked <= here:
        return
    field = "spec.rollout.gpusPerReplica" if rollout.gpus_per_replica else "spec.trainer.gpusPerNode"
    raise SetupError(
        f"{field}: the job asks for {asked} GPU{'s' if asked > 1 else ''} (rollout.replicas × gpusPerReplica"
        f"{'' if job.spec.colocate else ' + trainer.nodes × gpusPerNode'}) and {here} {'is' if here == 1 else 'are'} "
        "visible here; set rollout.gpusPerReplica and trainer.gpusPerNode to 0 to run on CPU"
    )


def require_gpu_to_colocate(job: RLJob) -> None:
    """`rljob run` of a colocated job: the pair must fit the GPUs here, and there must be some."""
    if job.spec.colocate and not check_colocate_fits(job):
        raise SetupError(
            "spec.colocate: no GPU is visible here (torch.cuda.is_available() is false); colocate shares GPUs "
            "between rollout and trainer (`rljob validate --deep --gpu-memory 80GiB` checks a job for a GPU "
            "you do not have)"
        )
