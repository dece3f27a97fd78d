"""The nano policy: a byte-level BPE tokenizer fitted to the lab's rendered trajectories and paragraphs (a name such as
"Corus Ulawyn" one token), wrapped as a transformers
fast tokenizer with a minimal chat template, and a randomly initialised Qwen2 of a few million parameters built
from ``lab.nano``. Nothing is downloaded; the same texts give the same vocabulary and the same seed the same
weights.

    tok = fit_tokenizer(texts, vocab_size=1024)
    model = nano_qwen2(params.lab.nano, tok, seed=0)

The chat template writes ``<|role|>content<|end|>`` per message and ``<|assistant|>`` as the generation prompt, so
each turn's prompt extends the previous one (what chat-history SFT rows and rollouts need) and ``<|end|>`` is the
end-of-turn token the policy learns to stop on.
"""

from __future__ import annotations

from collections.abc import Iterable, Sequence
from pathlib import Path

import torch

from components.lab.params import NanoParams

__all__ = ["CHAT_TEMPLATE", "SPECIAL_TOKENS", "TOKEN_CLASSES", "fit_tokenizer", "load_nano", "load_tokenizer", "nano_qwen2",
           "token_classes"]

SPECIAL_TOKENS = ["<pad>", "<|end|>", "<|system|>", "<|user|>", "<|assistant|>"]
CHAT_TEMPLATE = ("{% for m in messages %}<|{{ m['role'] }}|>{{ m['content'] }}<|end|>\n{% endfor %}"
                 "{% if add_generation_prompt %}<|assistant|>{% endif %}")


def _wrap(raw):
    from transformers import PreTrainedTokenizerFast

    tok = PreTrainedTokenizerFast(tokenizer_object=raw, pad_token="<pad>", eos_token="<|end|>")
    tok.chat_template = CHAT_TEMPLATE
    return tok


# GPT-2's pre-tokenizer pattern, with a run of capitalised words (" Corus Ulawyn", " The Glass Harbor") and a
# document id ("wd-00273") each kept as one piece: BPE then learns a name or id the world repeats as one token, which
# the nano policy copies with one attention step
PRE_TOKENS = r" ?[A-Z][a-z]+(?: [A-Z][a-z]+)+| ?wd-\d+| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+"


def fit_tokenizer(texts: Iterable[str], vocab_size: int, tags: Sequence[str] = ()):
    """A byte-level BPE fitted to ``texts`` (deterministic: the same texts in the same order give the same merges),
    names kept whole (:data:`PRE_TOKENS`), as a ``PreTrainedTokenizerFast`` with the lab's chat template; ids 0-4 are
    :data:`SPECIAL_TOKENS`. Each of ``tags`` (a scaffold's ``<think>``, ``<call_tool name="search">``) is then added
    as one token after the learned ones: an ordinary token, so a decoded reply keeps it."""
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, pre_tokenizers, trainers

    raw = Tokenizer(models.BPE())
    raw.pre_tokenizer = pre_tokenizers.Sequence([pre_tokenizers.Split(Regex(PRE_TOKENS), behavior="isolated"),
                                                 pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    raw.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(vocab_size=vocab_size, special_tokens=SPECIAL_TOKENS, show_progress=False,
                                  initial_alphabet=pre_tokenizers.ByteLevel.alphabet())
    raw.train_from_iterator(list(texts), trainer=trainer)
    if tags:
        raw.add_tokens([AddedToken(tag, normalized=False) for tag in tags])
    return _wrap(raw)


def load_tokenizer(path: str | Path):
    """A tokenizer saved with ``save_pretrained`` by :func:`fit_tokenizer`'s caller."""
    from components.hf_tokenizer import load_tokenizer as load_saved

    tok = load_saved(path)
    tok.chat_template = CHAT_TEMPLATE
    return tok


def load_nano(folder: str | Path) -> torch.nn.Module:
    """The nano model saved in ``folder`` (float32)."""
    from transformers import AutoModelForCausalLM

    return AutoModelForCausalLM.from_pretrained(str(folder), dtype=torch.float32)


# each as the text shows it: a name or a number after a space, an id after "(" or "["
TOKEN_CLASSES = {"name": r" [A-Z][a-z]+(?: [A-Z][a-z]+)*", "doc_id": r"wd-\d+", "number": r" \d+"}


def token_classes(tokenizer) -> dict[str, list[int]]:
    """The ids of the tokens that are a whole name, a whole document id or a whole number (:data:`TOKEN_CLASSES`)."""
    import re

    vocab = sorted(tokenizer.get_vocab().values())
    texts = [tokenizer.decode([i]) for i in vocab]
    return {name: [i for i, t in zip(vocab, texts) if re.fullmatch(pattern, t)] for name, pattern in
            TOKEN_CLASSES.items()}


def nano_qwen2(config: NanoParams, tokenizer, *, seed: int = 0) -> torch.nn.Module:
    """A randomly initialised ``Qwen2ForCausalLM`` of ``config``'s size over ``tokenizer``'s vocabulary (tied
    embeddings); the same ``seed`` gives the same weights and the global torch RNG is left untouched."""
    from components.embedded.tiny import tiny_qwen2

    model = tiny_qwen2(len(tokenizer), hidden_size=config.hidden_size, num_layers=config.num_layers,
                       num_heads=config.num_heads, num_kv_heads=config.num_kv_heads,
                       intermediate_size=config.intermediate_size, max_positions=config.max_positions,
                       initializer_range=config.initializer_range, seed=seed,
                       pad_token_id=tokenizer.pad_token_id, eos_token_id=tokenizer.eos_token_id)
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        weight = model.get_input_embeddings().weight
        if config.embedding_std is not None:
            weight.copy_(torch.randn(weight.shape, generator=generator) * config.embedding_std)
        if config.class_direction:
            for ids in token_classes(tokenizer).values():
                direction = torch.randn(weight.shape[1], generator=generator)
                weight[ids] += direction / direction.norm() * config.class_direction
    model.generation_config.eos_token_id = tokenizer.eos_token_id
    model.generation_config.pad_token_id = tokenizer.pad_token_id
    return model
