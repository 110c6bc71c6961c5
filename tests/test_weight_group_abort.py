"""A weight group whose member died: gloo's other members never notice (they wait out the group's timeout,
weightSync.timeoutSeconds, minutes), so the controller, which sees the dead replica's call fail, aborts the
group through its store, and every member's join or broadcast fails at once."""

from __future__ import annotations

import multiprocessing as mp
import os
import threading
import time
from typing import Any

import torch

from rljob.v1 import rollout_service_pb2 as pb
from rljob_workers.weights import WeightGroup, WeightPublisher, from_proto, host_store, receive_broadcast, to_proto
from rljob_workers.weights.group import WeightGroupAborted, abort

GROUP_TIMEOUT = 30.0  # what a member would wait without the abort
PROMPT = 10.0  # what "at once" allows on a loaded 2-core machine


def _join_in_thread(store: Any, rank: int, outcomes: list[tuple[int, str, float]]) -> threading.Thread:
    def join() -> None:
        try:
            WeightGroup.create(
                "g", "127.0.0.1", store.port, rank, 3, "gloo", GROUP_TIMEOUT, store=store if not rank else None
            )
            outcomes.append((rank, "joined", time.monotonic()))
        except WeightGroupAborted as error:
            outcomes.append((rank, str(error), time.monotonic()))

    thread = threading.Thread(target=join, name=f"join-rank-{rank}")
    thread.start()
    return thread


def test_an_aborted_join_fails_every_member_waiting_for_one_that_never_comes() -> None:
    store = host_store("127.0.0.1", timeout=GROUP_TIMEOUT)
    outcomes: list[tuple[int, str, float]] = []
    threads = [_join_in_thread(store, rank, outcomes) for rank in (0, 1)]  # rank 2 died before it joined
    time.sleep(0.5)
    aborted_at = time.monotonic()
    abort(store, "g", "joining the weight group of rollout-1 failed: Socket closed")
    for thread in threads:
        thread.join(PROMPT)
    assert sorted(rank for rank, _, _ in outcomes) == [0, 1], outcomes
    for rank, outcome, at in outcomes:
        assert outcome == "weight group 'g' was aborted: joining the weight group of rollout-1 failed: Socket closed"
        assert at - aborted_at < PROMPT, f"rank {rank} waited {at - aborted_at:.1f}s after the abort"


def _receives(port: int, wire: list[bytes], results: Any, dies_after_first_bucket: bool) -> None:
    """A rollout replica. One that dies reads the first bucket and is gone while the trainer still sends. One that
    survives exits right after its receive failed, without closing the group (as a process told to stop then)."""
    group = WeightGroup.create("g", "127.0.0.1", port, 2 if dies_after_first_bucket else 1, 3, "gloo", GROUP_TIMEOUT)
    plans = [from_proto(pb.Bucket.FromString(b)) for b in wire]
    if dies_after_first_bucket:
        group.broadcast(torch.empty(plans[0].nbytes, dtype=torch.uint8))
        os._exit(1)
    try:
        receive_broadcast(group, plans)
        results.put(("received", time.monotonic()))
    except RuntimeError as error:
        results.put((f"failed: {error}", time.monotonic()))


def test_a_member_killed_mid_broadcast_and_aborted_frees_the_trainer_and_the_others_at_once() -> None:
    ctx = mp.get_context("spawn")
    results = ctx.Queue()
    store = host_store("127.0.0.1", timeout=GROUP_TIMEOUT)
    model = {f"layer{i}.weight": torch.randn(1024, 1024) for i in range(16)}  # 16 buckets of 4 MiB
    publisher = WeightPublisher(4 << 20)
    plan_source = WeightPublisher(4 << 20)
    plan_source.publish(1, model.items())
    wire = [to_proto(p).SerializeToString() for p in plan_source.plan]
    members = [ctx.Process(target=_receives, args=(store.port, wire, results, dies)) for dies in (False, True)]
    for process in members:
        process.start()
    publish_error: list[BaseException] = []

    def publish() -> None:
        group = WeightGroup.create("g", "127.0.0.1", store.port, 0, 3, "gloo", GROUP_TIMEOUT, store=store)
        try:
            publisher.publish(1, model.items(), group)
        except RuntimeError as error:
            publish_error.append(error)

    trainer = threading.Thread(target=publish, name="trainer-publish")
    trainer.start()
    try:
        members[1].join(timeout=60)
        assert members[1].exitcode == 1
        time.sleep(1.0)  # the controller sees rollout-2's call fail
        aborted_at = time.monotonic()
        abort(store, "g", "weight update of rollout-2 failed: Socket closed")
        trainer.join(PROMPT)
        assert not trainer.is_alive(), f"the trainer's publish still waits {PROMPT:g}s after the abort"
        assert publish_error, "the publish finished although a member died before its buckets arrived"
        assert publisher.latest_version == -1, "a version not delivered is not published"
        outcome, at = results.get(timeout=PROMPT)
        assert outcome.startswith("failed"), outcome
        assert "weight group 'g' was aborted" in outcome, outcome  # by the controller, or by the trainer itself
        assert at - aborted_at < PROMPT, f"the surviving replica waited {at - aborted_at:.1f}s after the abort"
        # Its aborted collective never ends before the group's timeout; the process does not wait for it to exit.
        members[0].join(PROMPT)
        assert members[0].exitcode == 0, "the surviving replica's process did not exit at once after the abort"
    finally:
        for process in members:
            if process.is_alive():
                process.kill()
        # A collective gloo never ended holds its group until the group's timeout; its release thread ends then.
        for thread in threading.enumerate():
            if thread.name.startswith("release-weight-group-"):
                thread.join(GROUP_TIMEOUT)
