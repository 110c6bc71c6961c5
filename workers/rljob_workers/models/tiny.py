"""A tiny Llama and a character tokenizer, made locally: the policy for tests and demos.

`make_tiny_model` writes a directory that ``AutoTokenizer.from_pretrained`` and
``AutoModelForCausalLM.from_pretrained`` load with no network. The model is a *weak SFT
base* for the arithmetic task: a short supervised warm-up in which the label is the
bare correct answer only with probability ``p_correct`` (15%) and otherwise the same sum
in one of three wrong forms an LM plausibly produces: a leading zero (``"081"``), a
magnitude slip (``"810"``) or a failure to stop (``"8181"``). Every label carries the exact
sum, so the model learns the arithmetic itself, while sampling at temperature 1 earns a low
exact-match reward (about ``p_correct``). GRPO lifts it within a short run, because the
correct answer is in the policy's support and the fix is one behaviour shared by all
prompts. (Not value noise, such as a random digit in place of a right one: it teaches the
model worse arithmetic and caps the reward RL can reach.)

The ``arithmetic-chat`` task builds the same model as a chat model: its tokenizer carries a
chat template (`CHAT_TEMPLATE`) and the warm-up reads each problem as the template renders it
under the task's system prompt (longer prompts: more warm-up steps), so templated prompts are tested
for real.

The build is deterministic given the spec (on one machine and thread count) and is a training
run of its own, too slow to repeat for every use. So it is idempotent: a marker file records
the spec's digest, and a directory whose marker matches is returned as it is.
"""

from __future__ import annotations

import hashlib
import json
import math
import os
import shutil
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from tokenizers import Regex, Tokenizer, decoders, models, pre_tokenizers, processors
from transformers import (
    GenerationConfig,
    LlamaConfig,
    LlamaForCausalLM,
    PreTrainedTokenizerBase,
    PreTrainedTokenizerFast,
)

from rljob_workers.models import tiny_calculator
from rljob_workers.tasks import arithmetic

MARKER = "rljob-tiny-model.json"
# Bump when a code change alters what a given spec builds, so old directories rebuild.
FORMAT_VERSION = 1

PAD, BOS, EOS, UNK = "<pad>", "<s>", "</s>", "<unk>"
SPECIAL_TOKENS = (PAD, BOS, EOS, UNK)
# Digits and operators for arithmetic; a little punctuation and lowercase for later tasks.
CHARS = "0123456789+-*/=()., abcdefghijklmnopqrstuvwxyz"
# Tasks with a tiny model: the plain one (no chat template, like a base model) and its chat form, with
# what each sets apart from TinyModelSpec's defaults.
TASKS: dict[str, dict[str, Any]] = {
    "arithmetic": {},
    "arithmetic-chat": {"sft_steps": 1000},
    "calculator": {"sft_steps": 1200},  # models/tiny_calculator.py
}
# The chat model's template, in its own characters and special tokens: `<s>`, the system prompt ended
# by `</s>`, the user's question, then "=" opens the assistant's answer (the generation prompt).
CHAT_TEMPLATE = (
    "{{ bos_token }}{% for message in messages %}"
    "{% if message['role'] == 'system' %}{{ message['content'] }}{{ eos_token }}"
    "{% elif message['role'] == 'user' %}{{ message['content'] }}"
    "{% elif message['role'] == 'assistant' %}={{ message['content'] }}{{ eos_token }}"
    "{% else %}{{ raise_exception('the tiny chat model knows the roles system, user and assistant') }}"
    "{% endif %}{% endfor %}{% if add_generation_prompt %}={% endif %}"
)
# Wrong forms of a correct answer t (see the module docstring).
WRONG_FORMS = ("leading-zero", "times-ten", "no-stop")


@dataclass(frozen=True)
class TinyModelSpec:
    """Everything that determines the built model; its digest names a build."""

    task: str = "arithmetic"
    seed: int = 0
    min_operand: int = arithmetic.MIN_OPERAND
    max_operand: int = arithmetic.MAX_OPERAND
    hidden_size: int = 64
    intermediate_size: int = 256
    num_layers: int = 2
    # Heads of 32 dimensions: vLLM's CPU attention takes head sizes of 32 and up (32, 64, 80, ...), not 8.
    num_heads: int = 2
    max_positions: int = 64
    sft_steps: int = 800
    batch_size: int = 128
    lr: float = 3e-3
    p_correct: float = 0.15
    # One intra-op thread: at this size a second buys little on an idle machine and, on a
    # busy one, OpenMP's spinning threads slow a build down many times over. The bits depend on it.
    threads: int = 1

    def digest(self) -> str:
        recipe: dict[str, Any] = {"format": FORMAT_VERSION, **asdict(self)}
        if self.task == "arithmetic-chat":  # its template and system prompt shape what it learns
            recipe.update(template=CHAT_TEMPLATE, system_prompt=arithmetic.SYSTEM_PROMPT)
        if self.task == "calculator":
            recipe.update(
                template=tiny_calculator.CALC_TEMPLATE,
                p_tool=tiny_calculator.P_TOOL,
                p_copy=tiny_calculator.P_COPY,
                recipe=tiny_calculator.RECIPE,
            )
        blob = json.dumps(recipe, sort_keys=True)
        return hashlib.sha256(blob.encode()).hexdigest()[:16]


def make_tiny_model(out_dir: str | Path, task: str = "arithmetic", seed: int = 0, **overrides: Any) -> Path:
    """Build the tiny model and tokenizer into ``out_dir`` unless already built there.

    ``overrides`` are :class:`TinyModelSpec` fields (``sft_steps=200`` for a quick test
    build). A directory that exists without this module's marker is never overwritten.
    """
    if task not in TASKS:
        raise ValueError(f"task {task!r} has no tiny model; known: {', '.join(TASKS)}")
    spec = TinyModelSpec(task=task, seed=seed, **{**TASKS[task], **overrides})
    out = Path(out_dir)
    if read_marker(out).get("digest") == spec.digest():
        return out
    if out.exists() and any(out.iterdir()) and not (out / MARKER).exists():
        raise FileExistsError(f"{out} is not empty and holds no {MARKER}; refusing to overwrite")
    # Build beside the target and rename into place, so no reader sees half a model.
    tmp = out.parent / f".{out.name}.tmp-{os.getpid()}"
    shutil.rmtree(tmp, ignore_errors=True)
    _build(spec, tmp)
    shutil.rmtree(out, ignore_errors=True)
    tmp.rename(out)
    return out


def read_marker(out_dir: str | Path) -> dict[str, Any]:
    """The marker of a built directory (digest, spec, base reward), or {} if none."""
    path = Path(out_dir) / MARKER
    return json.loads(path.read_text()) if path.exists() else {}


def char_tokenizer(
    chars: str = CHARS, *, bos: bool = True, padding_side: str = "left", max_length: int | None = 64
) -> PreTrainedTokenizerFast:
    """A character-level tokenizer: one token per character of `chars`, any other character ``<unk>``.

    Ids 0-3 are ``<pad> <s> </s> <unk>``, then `chars` in order; decoding joins the characters
    back without spaces. With `bos`, ``<s>`` is prepended to every encoding. Padding is on the
    left by default, as batched generation wants; pass ``padding_side="right"`` when encoding
    for training. `max_length` None sets no length limit.
    """
    vocab = {tok: i for i, tok in enumerate((*SPECIAL_TOKENS, *chars))}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token=UNK))
    tok.pre_tokenizer = pre_tokenizers.Split(Regex("."), behavior="isolated")
    tok.decoder = decoders.Fuse()  # join characters back without spaces
    if bos:
        tok.post_processor = processors.TemplateProcessing(
            single=f"{BOS} $A", pair=f"{BOS} $A $B", special_tokens=[(BOS, vocab[BOS])]
        )
    tok.add_special_tokens(list(SPECIAL_TOKENS))
    limit = {} if max_length is None else {"model_max_length": max_length}
    return PreTrainedTokenizerFast(
        tokenizer_object=tok,
        bos_token=BOS,
        eos_token=EOS,
        pad_token=PAD,
        unk_token=UNK,
        padding_side=padding_side,
        **limit,
    )


def build_model(tokenizer: PreTrainedTokenizerBase, spec: TinyModelSpec) -> LlamaForCausalLM:
    """A freshly initialised Llama of the spec's size (uses the global torch RNG)."""
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=spec.hidden_size,
        intermediate_size=spec.intermediate_size,
        num_hidden_layers=spec.num_layers,
        num_attention_heads=spec.num_heads,
        num_key_value_heads=spec.num_heads,
        max_position_embeddings=spec.max_positions,
        tie_word_embeddings=True,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    model = LlamaForCausalLM(config)
    # Explicit sampling defaults: transformers 5 falls back to top_k=50 when unset, which
    # would make the sampler's distribution differ from log_softmax(logits / T).
    model.generation_config = GenerationConfig(
        do_sample=True,
        temperature=1.0,
        top_k=0,
        top_p=1.0,
        max_new_tokens=8,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
        pad_token_id=tokenizer.pad_token_id,
    )
    return model


def wrong_form(answer: str, form: str) -> str:
    """The answer written in one of :data:`WRONG_FORMS`; never equal to ``answer``."""
    if form == "leading-zero":
        return "0" + answer
    if form == "times-ten":
        return answer + "0"
    if form == "no-stop":
        return answer + answer
    raise ValueError(f"unknown wrong form {form!r}")


def label_table(
    tokenizer: PreTrainedTokenizerBase, problems: list[dict[str, str]], *, templated: bool = False
) -> tuple[torch.Tensor, torch.Tensor]:
    """Token ids ``[P, 1 + len(WRONG_FORMS), L]`` of every problem with every label.

    Variant 0 is the correct answer, variant i the i-th wrong form; each row is
    ``<s> prompt label </s>``, right-padded. The second tensor is the loss mask: the
    label and ``</s>``, not the prompt or padding. A `templated` prompt holds its ``<s>`` already.
    """
    special = not templated
    texts, prompt_lens = [], []
    for p in problems:
        labels = [p["answer"], *(wrong_form(p["answer"], f) for f in WRONG_FORMS)]
        texts += [p["prompt"] + lab + EOS for lab in labels]
        prompt_lens += [len(tokenizer(p["prompt"], add_special_tokens=special)["input_ids"])] * len(labels)
    enc = tokenizer(texts, padding=True, padding_side="right", return_tensors="pt", add_special_tokens=special)
    ids, attn = enc["input_ids"], enc["attention_mask"]
    positions = torch.arange(ids.shape[1]).expand_as(ids)
    loss_mask = (positions >= torch.tensor(prompt_lens)[:, None]) & (attn == 1)
    shape = (len(problems), 1 + len(WRONG_FORMS), ids.shape[1])
    return ids.reshape(shape), loss_mask.reshape(shape)


def _all_problems(min_operand: int, max_operand: int) -> list[dict[str, str]]:
    span = range(min_operand, max_operand + 1)
    return [arithmetic.problem(a, b) for a in span for b in span]


def chat_prompts(tokenizer: PreTrainedTokenizerBase, problems: list[dict[str, str]]) -> list[dict[str, str]]:
    """The problems with each prompt as the chat template renders its messages row under the task's system
    prompt (as examples/arithmetic-chat.yaml prompts the model)."""
    out = []
    for p in problems:
        row: Any = arithmetic.chat_row(p)
        messages = [{"role": "system", "content": arithmetic.SYSTEM_PROMPT}, *row["messages"]]
        text = tokenizer.apply_chat_template(messages, add_generation_prompt=True, tokenize=False)
        out.append({"prompt": str(text), "answer": p["answer"]})
    return out


def _lr_at(step: int, spec: TinyModelSpec, warmup: int = 50, floor: float = 0.1) -> float:
    """Linear warm-up, then cosine decay to ``floor`` of the peak.

    The floor matters: a model annealed to lr 0 sits in a sharp minimum that the first
    RL steps knock it out of.
    """
    ramp = min(1.0, (step + 1) / warmup)
    cosine = 0.5 * (1.0 + math.cos(math.pi * step / spec.sft_steps))
    return spec.lr * ramp * (floor + (1.0 - floor) * cosine)


def sft_warmup(model: LlamaForCausalLM, tokenizer: PreTrainedTokenizerBase, spec: TinyModelSpec) -> float:
    """Train on weak labels (see the module docstring); returns the last batch's loss."""
    problems = _all_problems(spec.min_operand, spec.max_operand)
    chat = spec.task == "arithmetic-chat"
    if chat:
        problems = chat_prompts(tokenizer, problems)
    ids, loss_mask = label_table(tokenizer, problems, templated=chat)
    gen = torch.Generator().manual_seed(spec.seed)
    opt = torch.optim.AdamW(model.parameters(), lr=spec.lr, betas=(0.9, 0.98), weight_decay=0.0)
    model.train()
    loss = torch.tensor(float("nan"))
    for step in range(spec.sft_steps):
        rows = torch.randint(0, ids.shape[0], (spec.batch_size,), generator=gen)
        wrong = torch.randint(1, ids.shape[1], (spec.batch_size,), generator=gen)
        correct = torch.rand(spec.batch_size, generator=gen) < spec.p_correct
        variant = torch.where(correct, 0, wrong)
        batch, mask = ids[rows, variant], loss_mask[rows, variant]
        for group in opt.param_groups:
            group["lr"] = _lr_at(step, spec)
        labels = batch.masked_fill(~mask, -100)  # HF shifts labels itself
        attn = (batch != tokenizer.pad_token_id).long()
        loss = model(input_ids=batch, attention_mask=attn, labels=labels).loss
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
    model.eval()
    return loss.item()


@torch.no_grad()
def sample_exact_match(
    model: Any,  # a causal LM; Any because mypy cannot type transformers' generate()
    tokenizer: PreTrainedTokenizerBase,
    problems: list[dict[str, str]],
    *,
    temperature: float = 1.0,
    max_new_tokens: int = 8,
    seed: int = 0,
    templated: bool = False,
) -> float:
    """Mean exact-match reward of one sampled completion per problem (`templated`: prompts that hold their `<s>`)."""
    prompts = [p["prompt"] for p in problems]
    enc = tokenizer(prompts, padding=True, return_tensors="pt", add_special_tokens=not templated)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        out = model.generate(**enc, do_sample=True, temperature=temperature, max_new_tokens=max_new_tokens)
    completions = tokenizer.batch_decode(out[:, enc["input_ids"].shape[1] :])
    rewards = [arithmetic.exact_match(p["prompt"], c, p["answer"]) for p, c in zip(problems, completions, strict=True)]
    return sum(rewards) / len(rewards)


def _build_calculator(spec: TinyModelSpec) -> tuple[Any, Any, float]:
    """The calculator task's model (models/tiny_calculator.py): its tokenizer has two characters more and a
    template with tools and a tool turn."""
    tokenizer = char_tokenizer(CHARS + tiny_calculator.EXTRA_CHARS, max_length=spec.max_positions)
    tokenizer.chat_template = tiny_calculator.CALC_TEMPLATE
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(spec.seed)
        model = build_model(tokenizer, spec)
    loss = tiny_calculator.warm_up(
        *(model, tokenizer),
        steps=spec.sft_steps,
        batch_size=spec.batch_size,
        lr=lambda step: _lr_at(step, spec),
        seed=spec.seed,
    )
    return model, tokenizer, loss


def _build(spec: TinyModelSpec, out: Path) -> None:
    """Tokenizer, model, warm-up, evaluation, files; the marker is written last."""
    start = time.perf_counter()
    threads = torch.get_num_threads()
    torch.set_num_threads(spec.threads)
    try:
        if spec.task == "calculator":
            model, tokenizer, final_loss = _build_calculator(spec)
            _save(spec, out, model, tokenizer, final_loss, None, start)
            return
        tokenizer = char_tokenizer(max_length=spec.max_positions)
        chat = spec.task == "arithmetic-chat"
        if chat:
            tokenizer.chat_template = CHAT_TEMPLATE
        with torch.random.fork_rng(devices=[]):  # leave the caller's RNG as it was
            torch.manual_seed(spec.seed)
            model = build_model(tokenizer, spec)
        final_loss = sft_warmup(model, tokenizer, spec)
        held_out = arithmetic.make_problems(512, spec.seed + 1, spec.max_operand, spec.min_operand)
        if chat:
            held_out = chat_prompts(tokenizer, held_out)
        base_reward = sample_exact_match(model, tokenizer, held_out, seed=spec.seed, templated=chat)
    finally:
        torch.set_num_threads(threads)
    _save(spec, out, model, tokenizer, final_loss, base_reward, start)


def _save(
    spec: TinyModelSpec, out: Path, model: Any, tokenizer: Any, loss: float, base: float | None, start: float
) -> None:
    model.save_pretrained(out)
    tokenizer.save_pretrained(out)
    final_loss, base_reward = loss, base
    marker = {
        "digest": spec.digest(),
        "spec": asdict(spec),
        "sft_final_loss": round(final_loss, 4),
        "base_reward": base_reward,
        "build_seconds": round(time.perf_counter() - start, 1),
    }
    (out / MARKER).write_text(json.dumps(marker, indent=2) + "\n")
