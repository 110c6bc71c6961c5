"""Tiny transformers models made in a test's tmp dir (no download): a random character-level Llama."""

from __future__ import annotations

from pathlib import Path

import torch
from tokenizers import Tokenizer, decoders, models, pre_tokenizers
from transformers import LlamaConfig, LlamaForCausalLM, PreTrainedTokenizerFast

EOS = 2
CHARS = list("0123456789+-=*/ abcdefghijklmnopqrstuvwxyz?.,")


def char_llama(path: Path, *, seed: int = 0, hidden: int = 64, eos_bias: float = 2.0) -> Path:
    """A ~80K-parameter Llama with a character tokenizer. `eos_bias` makes EOS likely (~5% a
    step with the default) so that samples end both at EOS and at max length."""
    vocab = {t: i for i, t in enumerate(["<pad>", "<s>", "</s>", "<unk>", *CHARS])}
    tok = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<unk>"))
    tok.pre_tokenizer = pre_tokenizers.Split("", "isolated")
    tok.decoder = decoders.Fuse()
    special = {"pad_token": "<pad>", "bos_token": "<s>", "eos_token": "</s>", "unk_token": "<unk>"}
    PreTrainedTokenizerFast(tokenizer_object=tok, **special).save_pretrained(path)
    config = LlamaConfig(
        vocab_size=len(vocab),
        hidden_size=hidden,
        intermediate_size=2 * hidden,
        num_hidden_layers=2,
        num_attention_heads=4,
        num_key_value_heads=2,
        max_position_embeddings=256,
        pad_token_id=0,
        bos_token_id=1,
        eos_token_id=EOS,
        tie_word_embeddings=False,
        initializer_range=0.2,  # peaked distributions, so a wrong position or token shows in the log-probs
    )
    torch.manual_seed(seed)
    model = LlamaForCausalLM(config).eval()
    with torch.no_grad():
        states = model.model(torch.randint(4, len(vocab), (8, 24))).last_hidden_state.reshape(-1, hidden).mean(0)
        model.lm_head.weight[EOS] = states * (eos_bias / states.norm() ** 2)
    model.save_pretrained(path)
    return path
