"""Text helpers shared by the retrievers and the slate selector: one tokenizer, snippets, fingerprints.

The tokenizer is deliberately plain (lowercase, runs of Unicode letters/digits) so BM25 over documents
and BM25 over action strings (``components.methods.coreact.slates``) see the same tokens:

    tokenize("search[Nightfall Harbor]")   # ['search', 'nightfall', 'harbor']
    make_snippet(doc.text, 300)            # leading text cut at a word boundary, with '...'
    corpus_sha256(docs)                    # content fingerprint stored in an index manifest
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable

from components.schemas import Document

_TOKEN = re.compile(r"[^\W_]+", re.UNICODE)


def tokenize(text: str) -> list[str]:
    """Lowercased alphanumeric tokens (Unicode letters and digits; punctuation and '_' separate)."""
    return _TOKEN.findall(text.lower())


def make_snippet(text: str, max_chars: int) -> str:
    """The first ``max_chars`` characters of ``text``, cut back to a word boundary, '...' if truncated."""
    text = " ".join(text.split())
    if len(text) <= max_chars:
        return text
    cut = text[:max_chars]
    space = cut.rfind(" ")
    if space > max_chars // 2:
        cut = cut[:space]
    return cut.rstrip(" ,;:") + "..."


def corpus_sha256(docs: Iterable[Document]) -> str:
    """sha256 over (id, title, text) of every document in order: changes when any of them changes."""
    h = hashlib.sha256()
    for d in docs:
        h.update(json.dumps([d.id, d.title, d.text], ensure_ascii=False).encode("utf-8"))
        h.update(b"\n")
    return h.hexdigest()


def file_sha256(path, chunk: int = 1 << 22) -> str:
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()
