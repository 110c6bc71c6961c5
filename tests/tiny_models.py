"""Tiny transformers models made in a test's tmp dir (no download), all with the character tokenizer of
`rljob_workers.models.tiny`: a random Llama policy, a scripted judge and a random reward model."""

from __future__ import annotations

from pathlib import Path

import torch
from transformers import GPT2Config, GPT2LMHeadModel, LlamaConfig, LlamaForCausalLM, LlamaForSequenceClassification

from rljob_workers.models.tiny import char_tokenizer

EOS = 2
CHARS = "0123456789+-=*/ abcdefghijklmnopqrstuvwxyz?.,"
JUDGE_CHARS = CHARS + ":"  # judges read templates that end in "score:"


def save_char_tokenizer(path: Path, chars: str = CHARS) -> dict[str, int]:
    """Save a character tokenizer of `chars` (no <s> prepended, right padding) at `path`; its vocabulary."""
    tokenizer = char_tokenizer(chars, bos=False, padding_side="right", max_length=None)
    tokenizer.save_pretrained(path)
    return dict(tokenizer.get_vocab())


def char_llama(
    path: Path,
    *,
    seed: int = 0,
    hidden: int = 64,
    eos_bias: float = 2.0,
    heads: int = 4,
    tied: bool = False,
    positions: int = 256,
) -> Path:
    """A ~80K-parameter Llama with a character tokenizer. `eos_bias` makes EOS likely (~5% a
    step with the default) so that samples end both at EOS and at max length. vLLM's CPU attention takes
    heads of 32 dimensions and up: `heads=2` of the default 64. `tied`: one matrix embeds and un-embeds."""
    vocab = save_char_tokenizer(path)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=heads,
        num_key_value_heads=min(2, heads),
        max_position_embeddings=positions,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=EOS,
        tie_word_embeddings=tied,
        initializer_range=0.2,  # peaked distributions, so a wrong position or token shows in the log-probs
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        states = model.model(torch.randint(4, len(vocab), (8, 24))).last_hidden_state.reshape(-1, hidden).mean(0)
        model.lm_head.weight[EOS] = states * (eos_bias / states.norm() ** 2)
    model.save_pretrained(path)
    return path


def char_gpt2(path: Path, *, positions: int = 128, seed: int = 0) -> Path:
    """A tiny GPT-2 with the character tokenizer: its learned position embeddings end at `positions`, so the
    engine fails (IndexError) on a longer prompt, as a real engine fails one request of many."""
    vocab = save_char_tokenizer(path)
    config = GPT2Config(
        vocab_size=len(vocab),
        n_positions=positions,
        n_embd=32,
        n_layer=1,
        n_head=2,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=EOS,
    )
    torch.manual_seed(seed)
    GPT2LMHeadModel(config).eval().save_pretrained(path)
    return path


def scripted_judge(path: Path, script: dict[str, str], default: str = "</s>", *, unsure_after: str = "") -> Path:
    """A Llama with no layers: logits depend on the last token only, so `script` (token -> next) is what it says.

    After `unsure_after` it hesitates: the scripted token leads every other by about 0.7 (of logit), so
    it is the greedy choice but only about 4% of the samples at temperature 1.
    """
    vocab = save_char_tokenizer(path, JUDGE_CHARS)
    n = len(vocab)
    config = LlamaConfig(
        vocab_size=n, hidden_size=n, intermediate_size=8, num_hidden_layers=0, num_attention_heads=1,
        max_position_embeddings=512, pad_token_id=0, bos_token_id=1, eos_token_id=2, tie_word_embeddings=False,
    )  # fmt: skip
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        model.model.embed_tokens.weight.copy_(torch.eye(n))
        model.model.norm.weight.fill_(1.0)
        head = torch.zeros(n, n)
        for token, index in vocab.items():
            # Final-norm output of a one-hot embedding is sqrt(n) at its token: 0.1 is a lead of about 0.7.
            head[vocab[script.get(token, default)], index] = 0.1 if token == unsure_after else 30.0
        model.lm_head.weight.copy_(head)
    model.save_pretrained(path)
    return path


def tiny_rm(path: Path, seed: int = 0) -> Path:
    """A random char-level LlamaForSequenceClassification with one label: a reward model."""
    vocab = save_char_tokenizer(path, JUDGE_CHARS)
    config = LlamaConfig(
        vocab_size=len(vocab), hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
        num_key_value_heads=2, max_position_embeddings=256, pad_token_id=0, initializer_range=0.2,
    )  # fmt: skip
    config.num_labels = 1
    torch.manual_seed(seed)
    LlamaForSequenceClassification(config).eval().save_pretrained(path)
    return path


BPE_CORPUS = [f"{a}+{b}={a + b} ok" for a in range(0, 100, 3) for b in range(0, 100, 7)] + ["left right done"] * 50


def bpe_llama(path: Path, *, seed: int = 0, vocab_size: int = 320) -> Path:
    """A random Llama with a byte-level BPE tokenizer trained here on arithmetic text: unlike the character
    tokenizer, a sequence the model samples (`1`, `2`) can decode to text that encodes to other ids (`12`),
    which is what re-tokenizing an episode would change."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    specials = ["<pad>", "<s>", "</s>", "<unk>"]
    bpe = Tokenizer(models.BPE(unk_token="<unk>"))
    bpe.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    bpe.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size, special_tokens=specials, initial_alphabet=pre_tokenizers.ByteLevel.alphabet()
    )
    bpe.train_from_iterator(BPE_CORPUS, trainer)
    tokenizer = PreTrainedTokenizerFast(
        tokenizer_object=bpe, pad_token="<pad>", bos_token="<s>", eos_token="</s>", unk_token="<unk>"
    )
    tokenizer.save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(tokenizer),
        hidden_size=64,
        intermediate_size=128,
        num_hidden_layers=2,
        num_attention_heads=2,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=tokenizer.pad_token_id,
        bos_token_id=tokenizer.bos_token_id,
        eos_token_id=tokenizer.eos_token_id,
    )
    torch.manual_seed(seed)
    LlamaForCausalLM(config).eval().save_pretrained(path)
    return path
