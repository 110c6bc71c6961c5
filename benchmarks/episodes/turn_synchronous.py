"""The baseline: a turn-synchronous agent loop over rljob's own parts (the same rollout and environment
clients, encoder, sampling and transcripts as the streamed episodes), as simple agent loops run episodes:
every live episode's turn k in one generation batch, then every environment step at once, then turn k+1.
The batch ends when its longest episode does."""

from __future__ import annotations

import asyncio
from dataclasses import dataclass

from google.protobuf import struct_pb2

from rljob.v1 import environment_service_pb2 as env_pb
from rljob.v1 import rollout_service_pb2 as rollout_pb
from rljob.v1 import sample_pb2
from rljob_workers.driver.controller.data import Prompt
from rljob_workers.driver.controller.episode import Play, Transcript
from rljob_workers.driver.controller.episodes import episode_seed
from rljob_workers.driver.pools.environment import EpisodeStream
from rljob_workers.driver.pools.rollout import Replica


@dataclass
class Live:
    """An episode of the batch, its environment stream and its token budget."""

    episode: Transcript
    stream: EpisodeStream
    budget: int

    @property
    def room(self) -> int:
        return self.budget - len(self.episode.prompt_ids) - len(self.episode.ids)


async def _start(play: Play, prompt: Prompt) -> Live:
    stream = await play.environments.open_next()
    assert stream is not None, "no environment replica"
    task = struct_pb2.Struct()
    task.update({**prompt.fields, play.config.data.prompt_field: prompt.text})
    seed = episode_seed(play.config.algorithm.seed, prompt.prompt_id, 0)
    start = env_pb.EpisodeStart(episode_id=f"{prompt.prompt_id}/0", task=task, seed=seed, prompt=prompt.text)
    first = await stream.ask(env_pb.EpisodeRequest(start=start))
    prompt_ids = play.encoder.prompt_ids(prompt.text)
    budget = play.budget(prompt_ids)
    return Live(
        Transcript(f"{prompt.prompt_id}/0", prompt_ids + play.encoder.encode(first.observation)), stream, budget
    )


async def _generate_batch(play: Play, replica: Replica, batch: list[Live], turn: int) -> list[sample_pb2.Completion]:
    """Turn `turn` of every episode of `batch` in one request: it ends when its last sample does."""
    room = min(live.room for live in batch)  # one request, one sampling: the tightest budget's (never binding here)
    request = rollout_pb.GenerateRequest(
        prompts=[
            rollout_pb.PromptRequest(
                prompt_id=live.episode.episode_id, token_ids=live.episode.prompt_ids + live.episode.ids, n=1
            )
            for live in batch
        ],
        sampling=play.sampling(room),
    )
    done: dict[str, sample_pb2.Completion] = {}
    async for completions in play.rollout.generate(replica, request):
        done.update((c.prompt_id, c) for c in completions)
    return [done[live.episode.episode_id] for live in batch]


async def _step_all(play: Play, batch: list[Live], turns: list[sample_pb2.Completion], turn: int) -> list[Live]:
    """Every episode's environment step on its new turn, all at once; the episodes that go on."""
    actions = [
        env_pb.Action(text=live.episode.last_text, token_ids=completion.token_ids, turn=turn)
        for live, completion in zip(batch, turns, strict=True)
    ]
    answers = await asyncio.gather(
        *(live.stream.ask(env_pb.EpisodeRequest(action=action)) for live, action in zip(batch, actions, strict=True))
    )
    going_on = []
    for live, answer in zip(batch, answers, strict=True):
        live.episode.turn_rewards.append(answer.reward)
        if not answer.done:
            live.episode.add_observation(play.encoder.encode(answer.observation), answer.observation)
            going_on.append(live)
    return going_on


async def play_turn_synchronous(play: Play, replica: Replica, prompts: list[Prompt]) -> int:
    """Play a batch of episodes to their ends, turn by turn in lockstep; the model turns played."""
    batch = list(await asyncio.gather(*(_start(play, p) for p in prompts)))
    streams = [live.stream for live in batch]
    turns = 0
    try:
        for turn in range(1, play.max_turns + 1):
            if not batch:
                break
            completions = await _generate_batch(play, replica, batch, turn)
            for live, completion in zip(batch, completions, strict=True):
                live.episode.add_turn(completion, play.encoder.decode(completion.token_ids))
            turns += len(batch)
            batch = await _step_all(play, batch, completions, turn)
    finally:
        for stream in streams:
            stream.close()
    return turns
