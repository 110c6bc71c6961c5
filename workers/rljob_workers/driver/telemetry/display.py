"""The live progress display of `rljob run` (rich), or plain log lines with --no-display."""

from __future__ import annotations

import sys
from typing import Any

from rich.console import Console
from rich.live import Live
from rich.table import Table

from rljob.v1 import control_service_pb2 as pb

PHASES = {v.number: v.name.removeprefix("RUN_PHASE_").lower() for v in pb.RunPhase.DESCRIPTOR.values}


def status_table(job: str, status: pb.JobStatus) -> Table:
    """One table of the run's state, from the same snapshot the ControlService serves."""
    table = Table(title=f"rljob run: {job}", show_header=False, min_width=60)
    table.add_column("what", style="bold")
    table.add_column("value")
    s = status.samples
    rows = [
        ("phase", PHASES.get(status.phase, "?")),
        ("step", f"{status.step} / {status.total_steps}   (policy version {status.policy_version})"),
        ("reward", f"{status.reward_mean:.3f} ± {status.reward_std:.3f}"),
        ("samples/s", f"{status.samples_per_second:.1f}"),
        ("staleness", f"mean {status.staleness_mean:.2f}, max {status.staleness_max}"),
        ("pools", "  ".join(f"{n} {p.ready}/{p.desired}" for n, p in _pools(status))),
        ("idle", "  ".join(f"{n} {p.idle_fraction:.0%}" for n, p in _pools(status))),
        ("samples", f"generated {s.generated}  scored {s.scored}  trained {s.trained}"),
        (
            "set aside",
            f"stale {s.discarded_stale}  reward errors {s.excluded_reward_error}  lost {s.lost_replica}"
            + (f"  failed prompts {s.failed_prompts}" if s.failed_prompts else ""),
        ),
        ("reward retries", str(s.reward_retries)),
        ("elapsed", f"{status.elapsed_seconds:.0f} s"),
    ]
    if status.HasField("environment"):  # spec.environment: samples are episodes
        per = s.turns / s.episodes if s.episodes else 0.0
        rows.append(("episodes", f"in flight {s.episodes_in_flight}  played {s.episodes}  turns/episode {per:.2f}"))
        rows.append(("environment", f"errors {s.environment_errors}  restarts {s.episode_restarts}"))
    if s.filtered_groups or s.masked_truncated:
        filtered = f"{s.filtered_groups} groups ({s.filtered} samples) with all-equal rewards"
        rows.append(("filtered", f"{filtered}  truncated, out of the loss {s.masked_truncated}"))
    if status.HasField("eval"):  # spec.data.eval's newest round
        passes = "  ".join(f"pass@{k} {v:.3f}" for k, v in sorted(status.eval.pass_at_k.items()))
        rows.append(("eval reward", f"{status.eval.reward_mean:.3f} at step {status.eval.step}  {passes}"))
    if s.waiting_for_reward:
        rows.append(("waiting", f"{s.waiting_for_reward} sample(s) for reward: {status.reward_wait_reason}"))
    for r in status.restarts:  # each replacement this driver made, oldest first
        what = r.replica if r.pool == "trainer" else f"{r.pool} {r.replica}"
        rows.append(("restart", f"{what} at step {r.step} ({r.cause}): {r.replacement} in {r.seconds:.1f} s"))
    for name, value in rows:
        table.add_row(name, value)
    if status.message:
        table.add_row("message", status.message)
    return table


def _pools(status: pb.JobStatus) -> list[tuple[str, Any]]:
    # A job without reward functions has no reward pool; one without spec.environment no environment pool.
    pools = [("rollout", status.rollout), ("trainer", status.trainer)]
    return pools + [(name, getattr(status, name)) for name in ("reward", "environment") if status.HasField(name)]


class Progress:
    """Live table on a terminal; a line per step otherwise (or with --no-display)."""

    def __init__(self, job: str, live: bool) -> None:
        self.job = job
        self.console = Console(file=sys.stdout)
        self.live = (
            Live(console=self.console, refresh_per_second=2, transient=True)
            if live and self.console.is_terminal
            else None
        )

    def __enter__(self) -> Progress:
        if self.live is not None:
            self.live.__enter__()
        return self

    def __exit__(self, *exc: object) -> None:
        if self.live is not None:
            self.live.__exit__(None, None, None)

    def update(self, status: pb.JobStatus, step_done: bool) -> None:
        if self.live is not None:
            self.live.update(status_table(self.job, status))
        elif step_done:
            self.console.print(
                f"step {status.step}/{status.total_steps}  reward {status.reward_mean:.3f}  "
                f"samples/s {status.samples_per_second:.1f}  staleness {status.staleness_mean:.2f}  "
                f"stale {status.samples.discarded_stale}  "
                + (f"filtered {status.samples.filtered_groups}  " if status.samples.filtered_groups else "")
                + f"elapsed {status.elapsed_seconds:.0f}s",
                highlight=False,
            )

    def final(self, status: pb.JobStatus) -> None:
        self.console.print(status_table(self.job, status))
