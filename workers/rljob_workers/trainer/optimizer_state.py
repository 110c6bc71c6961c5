"""The optimizer's state in a checkpoint: one file from rank 0 for an unsharded policy (every rank holds the
same); every rank's own shard, with torch.distributed.checkpoint, for a sharded one (rank 0 alone holds only
its shards of a `fully_shard` model)."""

from __future__ import annotations

from pathlib import Path

import torch

OPTIMIZER_FILE = "optimizer.pt"  # unsharded: one file, rank 0 writes it
OPTIMIZER_SHARDS = "optimizer"  # sharded: a torch.distributed.checkpoint folder, every rank writes its shard


def save_optimizer(optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Rank 0 of an unsharded policy."""
    torch.save(optimizer.state_dict(), directory / OPTIMIZER_FILE)


def save_optimizer_shard(policy: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path) -> None:
    """Every rank of a sharded policy: its own shard."""
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict

    state = get_optimizer_state_dict(policy, optimizer)
    dcp.save({"optimizer": state}, checkpoint_id=str(directory / OPTIMIZER_SHARDS))


def load_optimizer(
    policy: torch.nn.Module, optimizer: torch.optim.Optimizer, directory: Path, *, sharded: bool, device: torch.device
) -> None:
    """The state a checkpoint holds, as it was saved."""
    if sharded and (directory / OPTIMIZER_SHARDS).is_dir():
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict import get_optimizer_state_dict, set_optimizer_state_dict

        # get_optimizer_state_dict lays the state out first (AdamW makes it lazily), so load fills it
        loaded = {"optimizer": get_optimizer_state_dict(policy, optimizer)}
        dcp.load(loaded, checkpoint_id=str(directory / OPTIMIZER_SHARDS))
        set_optimizer_state_dict(policy, optimizer, loaded["optimizer"])
        return
    state = torch.load(directory / OPTIMIZER_FILE, map_location=device, weights_only=True)
    optimizer.load_state_dict(state)
