"""A character-level tokenizer and a tiny randomly initialised Qwen2 model, for tests and benchmarks.

Nothing is downloaded: the config is built in code. The model has the same architecture as the
embedded Qwen2.5 policy (so LoRA target names and the training code path are the same) but ~50k
parameters, so a GRPO step takes well under a second on two CPU cores.

Usage::

    tok = CharTokenizer("abcdefgh")
    model = tiny_qwen2(vocab_size=tok.vocab_size, seed=0)
"""

from __future__ import annotations

from collections.abc import Sequence

import torch

__all__ = ["CharTokenizer", "tiny_qwen2"]


class CharTokenizer:
    """One token per character. Id 0 is padding, id 1 end-of-sequence; characters start at 2."""

    pad_token_id = 0
    eos_token_id = 1

    def __init__(self, alphabet: str):
        if len(set(alphabet)) != len(alphabet):
            raise ValueError("alphabet characters must be unique")
        self.alphabet = alphabet
        self._index = {c: i + 2 for i, c in enumerate(alphabet)}

    @property
    def vocab_size(self) -> int:
        return len(self.alphabet) + 2

    def encode(self, text: str, add_special_tokens: bool = False) -> list[int]:
        unknown = set(text) - self._index.keys()
        if unknown:
            raise ValueError(f"characters not in the alphabet: {sorted(unknown)}")
        ids = [self._index[c] for c in text]
        return ids + [self.eos_token_id] if add_special_tokens else ids

    def decode(self, ids: Sequence[int], skip_special_tokens: bool = True) -> str:
        """Characters of ``ids``; padding and EOS never have text, whatever ``skip_special_tokens``."""
        return "".join(self.alphabet[i - 2] for i in ids if i >= 2)


def tiny_qwen2(
    vocab_size: int,
    *,
    hidden_size: int = 32,
    num_layers: int = 2,
    num_heads: int = 4,
    num_kv_heads: int = 2,
    intermediate_size: int = 64,
    max_positions: int = 128,
    initializer_range: float = 0.2,
    seed: int = 0,
) -> torch.nn.Module:
    """A randomly initialised ``Qwen2ForCausalLM``; the same ``seed`` gives the same weights, and the
    global torch RNG is left untouched.

    ``initializer_range`` is 10x transformers' default: with std 0.02 embeddings and a final RMSNorm,
    the logits of a 32-wide model cannot spread more than ~0.6 nats whatever the adapter does, so no
    reward could push a token's probability much above uniform.
    """
    from transformers import Qwen2Config, Qwen2ForCausalLM

    config = Qwen2Config(
        vocab_size=vocab_size,
        hidden_size=hidden_size,
        intermediate_size=intermediate_size,
        num_hidden_layers=num_layers,
        num_attention_heads=num_heads,
        num_key_value_heads=num_kv_heads,
        max_position_embeddings=max_positions,
        initializer_range=initializer_range,
        tie_word_embeddings=True,
        pad_token_id=0,
        eos_token_id=1,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.float()
