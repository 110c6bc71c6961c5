"""The tiny model of the calculator task (`tasks.calculator`): a character tokenizer with the task's two
characters more, a chat template that writes the tools' names and a tool turn, and a warm-up that calls the
tool on `P_TOOL` of the prompts that offer it and guesses the sum on the rest.

A tool call's episode is, as the controller's token sequence holds it (and the warm-up writes it)::

    <s>calc:123+456=calc(123+456)>579=579</s>

the prompt with the tools' names, the model's call (its turn ends at the stop ``)``), the tool's answer as
the template continues the conversation with a ``tool`` message (``>579=``), the model's copy of it.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import Any

import torch

from rljob_workers.tasks import calculator

# Bump when a change here alters what the warm-up trains (models.tiny's digest includes it).
RECIPE = 4
EXTRA_CHARS = ":>"  # beside the tiny tokenizer's own (models.tiny.CHARS)
P_TOOL = 0.12  # of the first turns the warm-up trains where the tool is offered, the calls
P_OFFERED = 0.75  # of warm-up prompts, those offering the tool (the rest teach the tool-less form)
# Of the prompts offering the tool, those shown a whole tool call with only the copy of its answer trained:
# copying is learned from many, while the first turns trained (the rest) call the tool in P_TOOL of them.
P_COPY = 0.5
CALC_TEMPLATE = (
    "{{ bos_token }}{% if tools %}{% for tool in tools %}{{ tool['function']['name'] }}:{% endfor %}{% endif %}"
    "{% for message in messages %}"
    "{% if message['role'] == 'user' %}{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}={{ message['content'] }}{{ eos_token }}"
    "{% elif message['role'] == 'tool' %}>{{ message['content'] }}"
    "{% else %}{{ raise_exception('the tiny calculator model knows the roles user, assistant and tool') }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}={% endif %}"
)


def episode_parts(a: int, b: int, offered: bool, form: str, guess: int) -> list[tuple[str, bool]]:
    """One warm-up sequence as (text, trained) parts; `form`: call (the call and the copy trained), copy (the
    call but its first character, and the copy of a tool answer that is `guess`: the copy is learned as a
    copy, not as the sum) or guess."""
    total = str(a + b) if form == "call" else str(guess)
    prompt = f"<s>{'calc:' if offered else ''}{a}+{b}="
    if form in ("call", "copy"):
        # A copy trains the call after its first character: the call's form and its operands are learned
        # from every tool call shown, the choice to call (its first character) only from the calls trained.
        call = [(f"calc({a}+{b})", True)] if form == "call" else [("c", False), (f"alc({a}+{b})", True)]
        return [(prompt, False), *call, (f">{total}=", False), (total + "</s>", True)]
    return [(prompt, False), (f"{guess}</s>", True)]


def _form(rng: random.Random, offered: bool) -> str:
    if not offered:
        return "guess"
    if rng.random() < P_COPY:
        return "copy"
    return "call" if rng.random() < P_TOOL else "guess"


def _batch(tokenizer: Any, rng: random.Random, size: int) -> tuple[torch.Tensor, torch.Tensor]:
    rows, masks = [], []
    for _ in range(size):
        a = rng.randint(calculator.MIN_OPERAND, calculator.MAX_OPERAND)
        b = rng.randint(calculator.MIN_OPERAND, calculator.MAX_OPERAND)
        offered = rng.random() < P_OFFERED
        guess = rng.randint(2 * calculator.MIN_OPERAND, 2 * calculator.MAX_OPERAND)
        if guess == a + b:
            guess += 1
        ids: list[int] = []
        mask: list[bool] = []
        for text, trained in episode_parts(a, b, offered, _form(rng, offered), guess):
            part = tokenizer(text, add_special_tokens=False)["input_ids"]
            ids += part
            mask += [trained] * len(part)
        rows.append(ids)
        masks.append(mask)
    width = max(map(len, rows))
    ids_t = torch.full((size, width), tokenizer.pad_token_id, dtype=torch.long)
    mask_t = torch.zeros((size, width), dtype=torch.bool)
    for i, (ids, mask) in enumerate(zip(rows, masks, strict=True)):
        ids_t[i, : len(ids)], mask_t[i, : len(mask)] = torch.tensor(ids), torch.tensor(mask)
    return ids_t, mask_t


def warm_up(model: Any, tokenizer: Any, *, steps: int, batch_size: int, lr: Callable[[int], float], seed: int) -> float:
    """Train on the task's sequences (see the module docstring) with learning rate `lr(step)`; returns the last
    batch's loss. models.tiny builds the model and tokenizer (with EXTRA_CHARS and CALC_TEMPLATE)."""
    rng = random.Random(seed)
    opt = torch.optim.AdamW(model.parameters(), lr=lr(0), betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(steps):
        batch, mask = _batch(tokenizer, rng, batch_size)
        for group in opt.param_groups:
            group["lr"] = lr(step)
        labels = batch.masked_fill(~mask, -100)
        loss = model(input_ids=batch, attention_mask=(batch != tokenizer.pad_token_id).long(), labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    return float(loss.item())
