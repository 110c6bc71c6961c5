"""An episode's observations as token ids, each encoded once: text as it is, chat messages as the model's chat
template continues a conversation with them (what it writes after an assistant turn, up to the next
assistant turn's generation prompt). Nothing before an observation is ever tokenized again, so a model's turn
stays exactly the ids it sampled."""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from rljob.v1 import environment_service_pb2 as env_pb
from rljob_workers.common.chat import has_chat_template, load_template_tokenizer

# A conversation the continuation is measured after: a template renders whatever follows it the same way.
_BEFORE = ({"role": "user", "content": "x"}, {"role": "assistant", "content": "y"})


class TemplateError(ValueError):
    """The chat template cannot continue a conversation with an observation (the message says why)."""


class ObservationEncoder:
    """Encodes observations for the model at `model_path` (its tokenizer and, where it has one, its chat
    template); decodes a model's turn for the environment."""

    def __init__(self, model_path: str) -> None:
        self.tokenizer: Any = load_template_tokenizer(model_path)
        self.chat = has_chat_template(model_path)

    def encode(self, observation: env_pb.Observation) -> list[int]:
        """The ids to append for `observation` (empty for an empty one)."""
        if observation.messages:
            return self._ids(self.continuation([{"role": m.role, "content": m.content} for m in observation.messages]))
        return self._ids(observation.text) if observation.text else []

    def continuation(self, messages: Sequence[dict[str, str]]) -> str:
        """What the chat template writes for `messages` after an assistant turn, with the generation prompt
        that opens the next one."""
        if not self.chat:
            return "\n".join(m["content"] for m in messages)
        before = self._render(_BEFORE, generation_prompt=False)
        after = self._render((*_BEFORE, *messages), generation_prompt=True)
        if not after.startswith(before):
            raise TemplateError(
                "the chat template rewrites the conversation before an observation's messages "
                f"(roles {', '.join(m['role'] for m in messages)}): it cannot be continued token-exactly"
            )
        return after[len(before) :]

    def renders_tools(self, tools: Sequence[dict[str, Any]]) -> bool:
        """Whether the chat template writes `tools` into a prompt at all (a template that ignores them would
        leave the model without the tools' names)."""
        if not self.chat:
            return False
        plain = self._render(_BEFORE[:1], generation_prompt=True)
        offered = str(
            self.tokenizer.apply_chat_template(
                list(_BEFORE[:1]), tools=list(tools), add_generation_prompt=True, tokenize=False
            )
        )
        return offered != plain

    def prompt_ids(self, text: str) -> list[int]:
        """A plain-text prompt's ids, as a rollout replica tokenizes it."""
        return list(self.tokenizer(text)["input_ids"])

    def decode(self, ids: Sequence[int]) -> str:
        return str(self.tokenizer.decode(list(ids), skip_special_tokens=True))

    def _render(self, messages: Sequence[dict[str, str]], *, generation_prompt: bool) -> str:
        try:
            return str(
                self.tokenizer.apply_chat_template(
                    list(messages), add_generation_prompt=generation_prompt, tokenize=False
                )
            )
        except Exception as exc:  # jinja's raise_exception, an unknown role
            raise TemplateError(f"the chat template cannot render {[m['role'] for m in messages]}: {exc}") from exc

    def _ids(self, text: str) -> list[int]:
        return list(self.tokenizer(text, add_special_tokens=False)["input_ids"])
