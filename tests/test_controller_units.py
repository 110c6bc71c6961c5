"""Pure parts of the controller: prompt order and checkpointed position, groups, staleness gate."""

from __future__ import annotations

import json

import pytest

from rljob_workers.driver.controller.data import DataError, Prompt, PromptSource, Row, check_rows, load_prompts
from rljob_workers.driver.controller.groups import GroupTracker, Sample, dispatch_allowed, staleness


def _source(n: int = 5, seed: int = 3) -> PromptSource:
    return PromptSource([Row(f"p{i}", {"answer": str(i)}) for i in range(n)], seed=seed)


def test_epochs_cover_every_prompt_once_in_seeded_order():
    a, b = _source(), _source()
    first = [a.next().prompt_id for _ in range(10)]
    assert first == [b.next().prompt_id for _ in range(10)]
    rows = [p.split("-")[1] for p in first]
    assert sorted(rows[:5]) == sorted(rows[5:]) == ["0", "1", "2", "3", "4"]
    assert all(p.startswith("e0-") for p in first[:5]) and all(p.startswith("e1-") for p in first[5:])


def test_restore_reissues_exactly_the_untrained_prompts():
    source = _source()
    issued = [source.next() for _ in range(4)]
    for prompt in issued[:2]:
        source.trained(prompt.prompt_id)
    saved = json.loads(json.dumps(source.state()))
    resumed = _source()
    resumed.restore(saved)
    again = [resumed.next().prompt_id for _ in range(3)]
    assert sorted(again[:2]) == sorted(p.prompt_id for p in issued[2:])
    assert again[2] == _continue_after(4)


def _continue_after(count: int) -> str:
    reference = _source()
    for _ in range(count):
        reference.next()
    return reference.next().prompt_id


def test_retry_hands_a_pending_prompt_out_again_first():
    source = _source()
    prompt = source.next()
    source.retry(prompt)
    assert source.next() == prompt
    source.trained(prompt.prompt_id)
    with pytest.raises(KeyError):
        source.retry(prompt)


def test_bad_data_rows_are_errors_naming_the_line(tmp_path):
    path = tmp_path / "d.jsonl"
    path.write_text('{"prompt": "1+1=", "answer": "2"}\n{"prompt": "2+2="}\n')
    with pytest.raises(DataError, match=r"d.jsonl:2: missing field\(s\) answer"):
        check_rows(path, "prompt", ["answer"], None, split="train", rows=100)  # the set-up check
    path.write_text("{not json\n")
    for check in (
        lambda: check_rows(path, "prompt", [], None, split="train", rows=100),
        lambda: load_prompts(path, "prompt", [], seed=0, shuffle=True, cache_dir=tmp_path / "cache"),
    ):
        with pytest.raises(DataError, match=r"d.jsonl:1: not valid JSON"):
            check()
    with pytest.raises(DataError, match=r"spec\.data\.path"):
        load_prompts(tmp_path / "missing.jsonl", "prompt", [], seed=0, shuffle=True, cache_dir=tmp_path / "cache")


@pytest.mark.parametrize(
    ("outstanding", "k", "allowed"),
    [(0, 0, True), (3, 0, True), (4, 0, False), (7, 1, True), (8, 1, False), (11, 2, True), (12, 2, False)],
)
def test_dispatch_gate_bounds_outstanding_batches(outstanding, k, allowed):
    assert dispatch_allowed(outstanding, prompts_per_step=4, max_staleness=k) is allowed


def test_staleness_is_trainer_minus_sample_version():
    assert staleness(3, 5) == 2 and staleness(5, 5) == 0


def _sample(prompt_id: str, index: int, version: int = 0) -> Sample:
    return Sample(f"{prompt_id}/{index}", prompt_id, index, [1], [2], [-0.1], version, "x")


def test_group_is_ready_once_every_sample_is_scored_or_excluded():
    source = _source()
    tracker = GroupTracker()
    prompt = source.next()
    tracker.start(prompt, 3)
    for i in range(3):
        assert tracker.receive(_sample(prompt.prompt_id, i))
    assert not tracker.receive(_sample(prompt.prompt_id, 1))
    assert not tracker.receive(_sample(prompt.prompt_id, 7))
    assert tracker.duplicates == 2
    tracker.score(prompt.prompt_id, 0, 1.0, {})
    tracker.exclude(prompt.prompt_id, 1)
    assert not tracker.ready
    tracker.score(prompt.prompt_id, 2, 0.0, {})
    group = tracker.ready.popleft()
    assert [s.index for s in group.scored] == [0, 2]
    assert tracker.outstanding == 0


def test_a_sample_scored_again_or_excluded_after_its_score_counts_once():
    tracker = GroupTracker()
    prompt = Prompt("p", "p", {})
    group = tracker.start(prompt, 2, version=5)
    assert group.oldest_version() == 5  # nothing received yet: the dispatch version
    tracker.receive(_sample("p", 0, version=7))
    tracker.receive(_sample("p", 1, version=6))
    assert group.oldest_version() == 6
    tracker.score("p", 0, 1.0, {})
    tracker.score("p", 0, 0.5, {})  # a retried sample answered twice
    tracker.exclude("p", 0)
    assert not group.complete and not tracker.ready
    tracker.score("p", 1, 0.0, {})
    assert group.complete and tracker.ready.popleft() is group


def test_missing_indices_after_partial_stream():
    source = _source()
    tracker = GroupTracker()
    prompt = source.next()
    group = tracker.start(prompt, 4)
    tracker.receive(_sample(prompt.prompt_id, 0))
    tracker.receive(_sample(prompt.prompt_id, 2))
    assert group.missing() == [1, 3]


def _ready_group(tracker: GroupTracker, prompt_id: str, dispatched: int, version: int | None = None) -> None:
    prompt = Prompt(prompt_id, prompt_id, {})
    tracker.start(prompt, 1, dispatched)
    tracker.receive(_sample(prompt_id, 0, dispatched if version is None else version))
    tracker.score(prompt_id, 0, 1.0, {})


def test_batch_takes_oldest_ready_group_first():
    tracker = GroupTracker()
    _ready_group(tracker, "new", dispatched=3)
    _ready_group(tracker, "old", dispatched=2)
    taken = tracker.take_for_batch(version=3, max_staleness=2, room=2)
    assert taken is not None and taken.prompt.prompt_id == "old"


def test_batch_waits_for_a_group_the_next_step_could_not_train():
    tracker = GroupTracker()
    tracker.start(Prompt("slow", "slow", {}), 1, 1)  # dispatched at version 1, still generating
    _ready_group(tracker, "fresh", dispatched=3)
    # Trained at version 3 with maxStaleness 2, "slow" must be in this batch or it is too stale:
    # with one place left, the batch waits for it instead of taking "fresh".
    assert tracker.take_for_batch(version=3, max_staleness=2, room=1) is None
    # With room for both, "fresh" may go first.
    taken = tracker.take_for_batch(version=3, max_staleness=2, room=2)
    assert taken is not None and taken.prompt.prompt_id == "fresh"
    assert tracker.take_for_batch(version=3, max_staleness=2, room=1) is None  # nothing ready
