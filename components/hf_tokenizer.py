"""Loading a tokenizer folder as it was saved. transformers 5's ``AutoTokenizer`` builds the tokenizer of the
folder's model type (``Qwen2Tokenizer`` for a Qwen2 config) and replaces a saved ``tokenizer.json``'s own
pre-tokenizer with that class's, so a tokenizer fitted with its own pipeline (the lab's nano policy keeps each
world name whole) comes back splitting the names it was trained on. A folder whose ``tokenizer_config.json`` names
a plain tokenizers pipeline (``TokenizersBackend``, ``PreTrainedTokenizerFast``) is loaded as that pipeline; any
other through ``AutoTokenizer``.

    tokenizer = load_tokenizer("outputs/lab/sft")
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

PIPELINE_CLASSES = ("TokenizersBackend", "PreTrainedTokenizerFast")


def saved_as_pipeline(path: str | Path) -> bool:
    """Whether ``path`` is a local folder whose tokenizer was saved as a plain tokenizers pipeline."""
    config = Path(path) / "tokenizer_config.json"
    if not config.is_file() or not (Path(path) / "tokenizer.json").is_file():
        return False
    return json.loads(config.read_text()).get("tokenizer_class") in PIPELINE_CLASSES


def load_tokenizer(path: str | Path, **kwargs: Any):
    """The tokenizer saved in ``path`` (a folder or hub id), its own pre-tokenizer kept."""
    if saved_as_pipeline(path):
        from transformers import PreTrainedTokenizerFast

        return PreTrainedTokenizerFast.from_pretrained(str(path), **kwargs)
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(str(path), **kwargs)
