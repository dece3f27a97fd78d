"""A character-level tokenizer and a tiny randomly initialised Qwen2 model, for tests and benchmarks.

Nothing is downloaded: the config is built in code (components/embedded/tiny.py, where the smoke overlay's
model is built too). The model has the same architecture as the embedded Qwen2.5 policy (so LoRA target
names and the training code path are the same) but ~50k parameters, so a GRPO step takes well under a
second on two CPU cores.

Usage::

    tok = CharTokenizer("abcdefgh")
    model = tiny_qwen2(vocab_size=tok.vocab_size, seed=0)
"""

from __future__ import annotations

from collections.abc import Sequence

from components.embedded.tiny import tiny_qwen2  # re-exported: its home is components/embedded/tiny.py

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
