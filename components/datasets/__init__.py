"""Loaders for the multi-hop QA benchmarks (HotpotQA, 2WikiMultiHopQA, MuSiQue, Bamboogle).

    from components.datasets import load_benchmark
    questions, corpus = load_benchmark("hotpotqa", "../shared/data/benchmarks", limit=20)

See ``loaders`` for what is mapped where and for the Bamboogle corpus choice, ``records`` for the
accepted line layouts and error messages.
"""

from components.datasets.loaders import (
    BENCHMARKS,
    PARAGRAPH_BENCHMARKS,
    bamboogle_corpus,
    doc_id,
    load_benchmark,
    read_benchmark,
    resolve_path,
)
from components.datasets.records import Example, Paragraph, iter_examples, parse_example

__all__ = [
    "BENCHMARKS",
    "PARAGRAPH_BENCHMARKS",
    "Example",
    "Paragraph",
    "bamboogle_corpus",
    "doc_id",
    "iter_examples",
    "load_benchmark",
    "parse_example",
    "read_benchmark",
    "resolve_path",
]
