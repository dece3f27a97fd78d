"""A tiny randomly initialised Qwen2, built in code: the embedded Qwen2.5 policy's architecture (so LoRA target names
and the training code path are the same) at a few thousand to a few million parameters. Nothing is downloaded.

Tests build it over a character tokenizer (components/training/tiny.py); the ``tiny-qwen2`` embedded model
(:data:`components.embedded.models.TINY_MODELS`) builds it over the 0.5B's real tokenizer for smoke runs.

    model = tiny_qwen2(vocab_size=100, seed=0)
"""

from __future__ import annotations

import torch

__all__ = ["tiny_qwen2"]


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
    pad_token_id: int = 0,
    eos_token_id: int = 1,
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
        pad_token_id=pad_token_id,
        eos_token_id=eos_token_id,
        bos_token_id=None,
    )
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = Qwen2ForCausalLM(config)
    return model.float()
