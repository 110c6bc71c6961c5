"""One attempt at an episode: the environment's start, then model turn and observation in turn until the
environment says done, the turn limit or the token budget ends it. The episode is kept as one token
sequence (prompt, each turn as sampled, each observation encoded once) with its loss mask.

An attempt either returns its whole transcript or raises: `EpisodeFailed` for the environment's error, a
timeout, a lost environment replica or a malformed answer; `ReplicaLost` for a lost rollout replica. The
caller (`episodes.EpisodeRunner`) restarts or excludes the episode; a part of one is never trained.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any

from google.protobuf import struct_pb2

from rljob.v1 import environment_service_pb2 as env_pb
from rljob.v1 import rollout_service_pb2 as rollout_pb
from rljob.v1 import sample_pb2
from rljob_api.workercfg import ControllerConfig
from rljob_workers.common.field_values import task_fields
from rljob_workers.driver.controller.data import Prompt
from rljob_workers.driver.controller.observations import ObservationEncoder, TemplateError
from rljob_workers.driver.pools.environment import (
    ERROR_KINDS,
    EnvironmentClients,
    EnvironmentInfo,
    EnvironmentLost,
    EpisodeStream,
)
from rljob_workers.driver.pools.rollout import Replica, RolloutClients


class EpisodeFailed(Exception):
    """An attempt that ended in error; `kind`: invalid_action, failure, timeout, lost or malformed."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(message)
        self.kind = kind


class NoEnvironmentReplica(Exception):
    """No environment replica was live when the attempt would start: it starts once one is (not an error)."""


@dataclass
class Transcript:
    """An episode as the trainer and the logs see it."""

    episode_id: str
    prompt_ids: list[int]
    ids: list[int] = field(default_factory=list)  # after the prompt: turns and observations
    logprobs: list[float] = field(default_factory=list)  # 0.0 for observation ids (masked)
    mask: list[int] = field(default_factory=list)  # 1: the model sampled it; 0: an observation's
    messages: list[dict[str, Any]] = field(default_factory=list)  # the conversation, each turn's reward
    turn_rewards: list[float] = field(default_factory=list)
    final_reward: float = 0.0
    metrics: dict[str, float] = field(default_factory=dict)
    tools: list[str] = field(default_factory=list)  # the tool each turn called ('' for none)
    truncated: bool = False  # ended by maxTurns or maxEpisodeTokens, not by the environment
    first_version: int | None = None
    last_version: int = 0
    last_text: str = ""  # the last model turn's text
    # Of the turns after the first, which continue the episode's earlier ones: their prompt tokens, and how
    # many of them the engine served from its prefix cache (where it reports it: None otherwise).
    later_prompt_tokens: int = 0
    later_cached_tokens: int | None = None

    @property
    def turns(self) -> int:
        return len(self.turn_rewards)

    @property
    def episode_return(self) -> float:
        return self.final_reward + sum(self.turn_rewards)

    def add_turn(self, completion: sample_pb2.Completion, text: str) -> None:
        if self.turns and completion.HasField("cached_prompt_tokens"):
            self.later_prompt_tokens += len(self.prompt_ids) + len(self.ids)
            self.later_cached_tokens = (self.later_cached_tokens or 0) + completion.cached_prompt_tokens
        self.ids += completion.token_ids
        self.logprobs += completion.logprobs
        self.mask += [1] * len(completion.token_ids)
        self.messages.append({"role": "assistant", "content": text})
        self.last_text = text
        if self.first_version is None:
            self.first_version = completion.policy_version
        self.last_version = max(completion.last_policy_version, completion.policy_version)

    def add_observation(self, ids: list[int], observation: env_pb.Observation) -> None:
        self.ids += ids
        self.logprobs += [0.0] * len(ids)
        self.mask += [0] * len(ids)
        if observation.messages:
            self.messages += [{"role": m.role, "content": m.content} for m in observation.messages]
        elif observation.text:
            self.messages.append({"role": "observation", "content": observation.text})


def _finite(value: float, what: str, where: str) -> float:
    if not math.isfinite(value):
        raise EpisodeFailed("malformed", f"{where}: {what} is {value}")
    return value


def _answer(response: env_pb.EpisodeResponse, where: str) -> env_pb.EpisodeResponse:
    """The response, or EpisodeFailed for an error or a malformed reward."""
    if response.HasField("error"):
        kind = ERROR_KINDS.get(response.error.kind, "failure")
        raise EpisodeFailed(kind, f"{where}: {kind}: {response.error.message or 'no message'}")
    _finite(response.reward, "the turn's reward", where)
    _finite(response.final_reward, "the final reward", where)
    for name, value in response.metrics.items():
        _finite(value, f"metric {name!r}", where)
    return response


@dataclass
class Play:
    """What every attempt shares: the pools' clients, the encoder, the limits."""

    config: ControllerConfig
    rollout: RolloutClients
    environments: EnvironmentClients
    encoder: ObservationEncoder
    info: EnvironmentInfo

    @property
    def max_turns(self) -> int:
        spec = self.config.environment
        assert spec is not None
        return min(spec.max_turns, self.info.max_turns) if self.info.max_turns else spec.max_turns

    def budget(self, prompt_ids: list[int]) -> int:
        spec = self.config.environment
        assert spec is not None
        own = spec.max_episode_tokens
        return own if own is not None else len(prompt_ids) + self.max_turns * self.config.sampling.max_new_tokens

    async def play(
        self,
        prompt: Prompt,
        episode_id: str,
        seed: int,
        replica: Replica,
        sampling: sample_pb2.SamplingParams | None = None,
    ) -> Transcript:
        """One attempt on rollout `replica` and the least-loaded environment replica; `sampling` (the eval's)
        instead of the job's."""
        stream = await self.environments.open_next()
        if stream is None:
            raise NoEnvironmentReplica()
        where = f"environment {self.info.name!r}, episode {episode_id}"
        try:
            return await self._play(prompt, episode_id, seed, replica, stream, where, sampling)
        except EnvironmentLost as exc:
            raise EpisodeFailed(exc.kind, f"{where}: {exc}") from None
        except TemplateError as exc:
            raise EpisodeFailed("malformed", f"{where}: {exc}") from None
        finally:
            stream.close()

    async def _play(
        self,
        prompt: Prompt,
        episode_id: str,
        seed: int,
        replica: Replica,
        stream: EpisodeStream,
        where: str,
        sampling: sample_pb2.SamplingParams | None,
    ) -> Transcript:
        task = struct_pb2.Struct()
        task.update({**task_fields(prompt.fields), self.config.data.prompt_field: prompt.text})
        start = env_pb.EpisodeStart(episode_id=episode_id, task=task, seed=seed, prompt=prompt.text)
        first = _answer(await stream.ask(env_pb.EpisodeRequest(start=start)), where)
        prompt_ids = list(prompt.token_ids) or self.encoder.prompt_ids(prompt.text)
        budget = self.budget(prompt_ids)
        prompt_ids += self._observation_ids(first.observation, budget, len(prompt_ids), where)
        episode = Transcript(episode_id, prompt_ids, messages=[dict(m) for m in prompt.messages or ()])
        for turn in range(1, self.max_turns + 1):
            room = budget - len(prompt_ids) - len(episode.ids)
            if room <= 0:
                break
            completion = await self._generate(episode, replica, turn, self.sampling(room, sampling))
            text = self.encoder.decode(completion.token_ids)
            episode.add_turn(completion, text)
            action = env_pb.Action(text=text, token_ids=completion.token_ids, turn=turn)
            response = _answer(await stream.ask(env_pb.EpisodeRequest(action=action)), where)
            episode.turn_rewards.append(response.reward)
            episode.messages[-1]["reward"] = response.reward
            episode.tools.append(response.tool)
            if response.done:
                episode.final_reward, episode.metrics = response.final_reward, dict(response.metrics)
                return episode
            ids = self._observation_ids(response.observation, budget, len(prompt_ids), where)
            if len(prompt_ids) + len(episode.ids) + len(ids) >= budget:
                break  # the next turn would have no room
            episode.add_observation(ids, response.observation)
        episode.truncated = True
        return episode

    def _observation_ids(self, observation: env_pb.Observation, budget: int, prompt: int, where: str) -> list[int]:
        ids = self.encoder.encode(observation)
        if len(ids) > budget - prompt:
            raise EpisodeFailed(
                "malformed", f"{where}: an observation of {len(ids)} tokens alone exceeds the episode's budget"
            )
        return ids

    def sampling(self, room: int, base: sample_pb2.SamplingParams | None = None) -> sample_pb2.SamplingParams:
        """A model turn's sampling: the job's (or `base`, the eval's), at most `room` new tokens, stopping also
        at the environment's stop strings."""
        s = self.config.sampling
        if base is None:
            base = sample_pb2.SamplingParams(
                temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens, stop=s.stop
            )
        turn = sample_pb2.SamplingParams()
        turn.CopyFrom(base)
        turn.max_new_tokens = min(base.max_new_tokens or s.max_new_tokens, room)
        turn.stop[:] = [*base.stop, *self.info.stop]
        return turn

    async def _generate(
        self, episode: Transcript, replica: Replica, turn: int, sampling: sample_pb2.SamplingParams
    ) -> sample_pb2.Completion:
        request = rollout_pb.GenerateRequest(
            prompts=[
                rollout_pb.PromptRequest(
                    prompt_id=f"{episode.episode_id}/t{turn}", token_ids=episode.prompt_ids + episode.ids, n=1
                )
            ],
            sampling=sampling,
        )
        async for completions in self.rollout.generate(replica, request):
            return completions[0]
        raise EpisodeFailed("lost", f"rollout replica {replica.name} ended turn {turn} of {episode.episode_id} empty")
