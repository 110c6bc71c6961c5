"""The prefix-cache hit rate of episodes (#55): of the prompt tokens of every turn after an episode's first (each
continues the turns before it, token for token), the share the engine served from its prefix cache, as it reports
it per request (vLLM's num_cached_tokens). An engine without a prefix cache (hf) reports nothing, and the step has
no such figure rather than a 0."""

from __future__ import annotations

import pytest

from rljob.v1 import sample_pb2
from rljob_workers.driver.controller.episode import Transcript
from rljob_workers.driver.controller.groups import Sample
from rljob_workers.driver.controller.step_report import episode_metrics


def played(turns: list[tuple[int, int | None]]) -> Sample:
    """An episode of `turns` (tokens generated, prompt tokens the engine had cached or None), 3 observation tokens
    after each turn but the last."""
    episode = Transcript("e0-0/0", prompt_ids=[1] * 10)
    for number, (generated, cached) in enumerate(turns):
        completion = sample_pb2.Completion(token_ids=[2] * generated)
        if cached is not None:
            completion.cached_prompt_tokens = cached
        episode.add_turn(completion, "turn")
        episode.turn_rewards.append(0.0)
        if number < len(turns) - 1:
            episode.ids += [3] * 3
            episode.mask += [0] * 3
    sample = Sample("e0-0/0", "e0-0", 0, [1] * 10, episode.ids, [0.0] * len(episode.ids), 0, "turn")
    sample.episode = episode
    return sample


def test_the_hit_rate_counts_the_later_turns_prompts_and_what_the_engine_found_cached() -> None:
    # turn 1: a prompt of 10 (not counted: nothing of it came before); turn 2: 10 + 4 + 3 = 17 tokens, 16
    # cached (vLLM caches whole blocks); turn 3: 17 + 5 + 3 = 25 tokens, 24 cached
    stats = episode_metrics([played([(4, 0), (5, 16), (2, 24)])], None)
    assert stats["prefix_cache_hit_rate"] == pytest.approx((16 + 24) / (17 + 25))


def test_an_engine_that_keeps_no_prefix_cache_reports_no_rate() -> None:
    assert "prefix_cache_hit_rate" not in episode_metrics([played([(4, None), (5, None)])], None)
    assert "prefix_cache_hit_rate" not in episode_metrics([played([(4, 0)])], None)  # one turn: nothing later
