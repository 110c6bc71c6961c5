"""The controller's gRPC messages, built from its bookkeeping (pure functions, no I/O)."""

from __future__ import annotations

from rljob.v1 import rollout_service_pb2 as rollout_pb
from rljob.v1 import sample_pb2
from rljob_api.workercfg import ControllerConfig
from rljob_workers.common.field_values import to_texts, to_values
from rljob_workers.driver.controller.data import Prompt
from rljob_workers.driver.controller.groups import Sample


def generate_request(config: ControllerConfig, prompt: Prompt, indices: list[int]) -> rollout_pb.GenerateRequest:
    """Generate samples `indices` of `prompt`: contiguous, since a group is generated whole and
    regenerated from its first missing index."""
    s = config.sampling
    sampling = sample_pb2.SamplingParams(
        temperature=s.temperature, top_p=s.top_p, top_k=s.top_k, max_new_tokens=s.max_new_tokens, stop=s.stop
    )
    # A rendered prompt goes as its token ids (the template wrote its special tokens); plain text is
    # tokenised by the replica.
    request = rollout_pb.PromptRequest(
        prompt_id=prompt.prompt_id,
        token_ids=prompt.token_ids,
        text="" if prompt.token_ids else prompt.text,
        n=len(indices),
        first_index=indices[0],
    )
    return rollout_pb.GenerateRequest(prompts=[request], sampling=sampling)


def received_sample(completion: sample_pb2.Completion) -> Sample:
    return Sample(
        sample_id=completion.sample_id,
        prompt_id=completion.prompt_id,
        index=completion.index,
        prompt_token_ids=list(completion.prompt_token_ids),
        token_ids=list(completion.token_ids),
        logprobs=list(completion.logprobs),
        policy_version=completion.policy_version,
        text=completion.text,
        truncated=completion.finish_reason == sample_pb2.FINISH_REASON_LENGTH,
        # an older replica leaves it 0: one version made every token
        last_version=max(completion.last_policy_version, completion.policy_version),
    )


def reward_request(prompt: Prompt, sample: Sample) -> sample_pb2.RewardSample:
    """What the reward pool scores: the prompt and completion; of an episode, its whole conversation as
    `messages` and its last model turn as `completion`."""
    conversation = sample.episode.messages if sample.episode is not None else prompt.messages or ()
    return sample_pb2.RewardSample(
        sample_id=sample.sample_id,
        prompt_id=sample.prompt_id,
        prompt=prompt.text,
        completion=sample.text,
        fields=to_texts(prompt.fields),
        values=to_values(prompt.fields),
        token_ids=sample.token_ids,
        policy_version=sample.policy_version,
        messages=[sample_pb2.ChatMessage(role=str(m["role"]), content=str(m["content"])) for m in conversation],
    )


def contiguous_runs(indices: list[int]) -> list[list[int]]:
    """[1, 2, 4] -> [[1, 2], [4]]."""
    runs: list[list[int]] = []
    for index in indices:
        if runs and index == runs[-1][-1] + 1:
            runs[-1].append(index)
        else:
            runs.append([index])
    return runs
