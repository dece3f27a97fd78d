"""Load HotpotQA, 2WikiMultiHopQA, MuSiQue and Bamboogle as rubricflow Questions plus a local corpus: each
question's own paragraphs pooled and de-duplicated, with stable document ids, supporting documents, gold chains
where the files have them and a common question type (:func:`load_benchmark`). Bamboogle ships no paragraphs:
:func:`bamboogle_corpus` gives it one. ``path`` is a JSONL file, or a folder holding ``<name>/dev.jsonl`` or
``dev.jsonl`` (layouts: :mod:`components.datasets.records`).

    from components.datasets import load_benchmark, bamboogle_corpus
    questions, corpus = load_benchmark("musique", "../shared/data/benchmarks", limit=20)
    corpus = bamboogle_corpus(None, "../shared/data/benchmarks")
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable
from pathlib import Path

from components.datasets.records import Example, iter_examples
from components.io import RecordError, iter_json_objects
from components.registry import Registry
from components.schemas import Document, Question, SubQuestion

Loader = Callable[[Path, "int | None"], tuple[list[Question], list[Document]]]
BENCHMARKS: Registry[Loader] = Registry("benchmark")
PARAGRAPH_BENCHMARKS = ("hotpotqa", "2wikimultihopqa", "musique")

_TYPE_MAPS: dict[str, Callable[[str | None], str]] = {
    "hotpotqa": lambda t: t if t in ("bridge", "comparison") else "other",
    "2wikimultihopqa": lambda t: {
        "compositional": "compositional",
        "comparison": "comparison",
        "inference": "inference",
        "bridge_comparison": "comparison",
    }.get(t, "other"),
    "musique": lambda t: "compositional" if t and re.fullmatch(r"\dhop\d?", t) else "other",
    "bamboogle": lambda t: "other",
}


def doc_id(source: str, title: str, text: str) -> str:
    digest = hashlib.sha1((title + "\0" + text).encode("utf-8")).hexdigest()
    return f"{source}-{digest[:16]}"


class Corpus:
    """Documents de-duplicated by (title, text), in first-seen order."""

    def __init__(self) -> None:
        self.docs: dict[str, Document] = {}

    def add(self, source: str, title: str, text: str) -> str:
        key = doc_id(source, title, text)
        seen = self.docs.get(key)
        if seen is None:
            self.docs[key] = Document(id=key, title=title, text=text, source=source)
        elif (seen.title, seen.text) != (title, text):  # a 64-bit prefix collision: never silently merge
            raise ValueError(f"document id collision for {key}: {seen.title!r} vs {title!r}")
        return key

    def documents(self) -> list[Document]:
        return list(self.docs.values())


def _gold_chain(ex: Example, ids: list[str]) -> list[SubQuestion]:
    if ex.decomposition:
        chain: list[SubQuestion] = []
        for step in ex.decomposition:
            text = re.sub(
                r"#(\d+)", lambda m: _hop_answer(chain, int(m.group(1))) or m.group(0), step["question"]
            )
            idx = step["paragraph_support_idx"]
            chain.append(
                SubQuestion(question=text, answer=step["answer"], doc_id=None if idx is None else ids[idx])
            )
        return chain
    if ex.evidences:
        first_by_title = {}
        for p, i in zip(ex.paragraphs, ids):
            first_by_title.setdefault(p.title, i)
        return [
            SubQuestion(question=f"What is the {rel} of {subj}?", answer=obj, doc_id=first_by_title.get(subj))
            for subj, rel, obj in ex.evidences
        ]
    return []


def _hop_answer(chain: list[SubQuestion], k: int) -> str | None:
    return chain[k - 1].answer if 1 <= k <= len(chain) else None


def _supporting_ids(ex: Example, ids: list[str]) -> list[str]:
    out: list[str] = []
    for title in ex.supporting:
        same = [(p, i) for p, i in zip(ex.paragraphs, ids) if p.title == title]
        flagged = [i for p, i in same if p.is_supporting]
        out += flagged or [i for _, i in same]
    out += [i for p, i in zip(ex.paragraphs, ids) if p.is_supporting]
    return list(dict.fromkeys(out))


def _to_question(ex: Example, source: str, ids: list[str], split: str) -> Question:
    original = ex.type
    if source == "musique" and original is None:  # upstream MuSiQue has no type: the id starts with it
        original = ex.id.split("__", 1)[0] if "__" in ex.id else None
    metadata = {
        "original_type": original,
        "supporting_titles": ex.supporting,
        "paragraph_ids": ids,
        **ex.extra,
    }
    if source == "musique" and original and original[0].isdigit():
        metadata["hops"] = int(original[0])
    return Question(
        id=ex.id,
        question=ex.question,
        answers=ex.answers,
        type=_TYPE_MAPS[source](original),
        source=source,
        split=split,
        supporting_doc_ids=_supporting_ids(ex, ids),
        gold_chain=_gold_chain(ex, ids),
        metadata=metadata,
    )


def read_benchmark(
    source: str, path: Path, limit: int | None = None
) -> tuple[list[Question], list[Document]]:
    """Questions and their pooled, de-duplicated paragraphs from one JSONL file."""
    split = path.stem if path.stem in ("train", "dev", "test") else "dev"
    corpus, questions, seen = Corpus(), [], {}
    for ex in iter_examples(path, limit):
        if ex.id in seen:
            raise RecordError(path, ex.line, "id", f"duplicate id {ex.id!r} (first on line {seen[ex.id]})")
        seen[ex.id] = ex.line
        ids = [corpus.add(source, p.title, p.text) for p in ex.paragraphs]
        questions.append(_to_question(ex, source, ids, split))
    return questions, corpus.documents()


def _register(name: str, *aliases: str) -> None:
    def loader(path: Path, limit: int | None = None) -> tuple[list[Question], list[Document]]:
        return read_benchmark(name, path, limit)

    loader.__name__ = f"load_{name}"
    for key in (name, *aliases):
        BENCHMARKS.register(key)(loader)


_register("hotpotqa", "hotpot")
_register("2wikimultihopqa", "2wiki")
_register("musique")
_register("bamboogle")


def resolve_path(name: str, path: str | Path) -> Path:
    """A JSONL file as is; for a folder, ``<folder>/<name>/dev.jsonl`` or else ``<folder>/dev.jsonl``."""
    path = Path(path)
    if path.is_dir():
        for candidate in (path / name / "dev.jsonl", path / "dev.jsonl"):
            if candidate.is_file():
                return candidate
        raise FileNotFoundError(f"no {name}/dev.jsonl or dev.jsonl under {path}")
    if not path.is_file():
        raise FileNotFoundError(f"benchmark file not found: {path}")
    return path


def load_benchmark(
    name: str, path: str | Path, limit: int | None = None
) -> tuple[list[Question], list[Document]]:
    """Load benchmark ``name`` (a registry name, or a dotted import path) from ``path``; first ``limit``
    examples only when given. Returns (questions, de-duplicated corpus of their paragraphs).

    - Corpus: the questions' own paragraphs, de-duplicated by (title, text); a document id is ``<source>-`` plus
      the first 16 hex digits of sha1(title NUL text), stable across runs, limits and file orders;
      ``metadata["paragraph_ids"]`` lists a question's own paragraphs (upstream order) for the distractor setting.
    - ``supporting_doc_ids`` from the ``is_supporting`` flags / supporting-fact titles, in supporting order
      (MuSiQue: decomposition order).
    - ``gold_chain`` from MuSiQue's ``question_decomposition`` ("#k" replaced by hop k's answer) and 2Wiki's
      ``evidences`` ("What is the <relation> of <subject>?") when a file has them; the shared normalised subsets
      dropped both, so their chains are empty.
    - ``type``: HotpotQA's and 2Wiki's as they are (2Wiki's bridge_comparison -> comparison); every MuSiQue pattern
      -> compositional with ``metadata["hops"]`` (read from the id prefix when a line has no type); none or unknown
      -> other; ``metadata["original_type"]`` keeps the dataset's value."""
    loader = BENCHMARKS.get(name)
    return loader(resolve_path(name, path), limit)


def bamboogle_corpus(
    path_or_none: str | Path | None, benchmarks_dir: str | Path, limit_per_benchmark: int | None = None
) -> list[Document]:
    """The retrieval corpus for Bamboogle: a JSONL file of documents when given, else the pooled
    paragraphs of HotpotQA, 2Wiki and MuSiQue under ``benchmarks_dir``: offline, but a Wikipedia-like distractor
    corpus that rarely holds the facts Bamboogle asks about, so EM on it measures behaviour under missing
    evidence. Point ``path`` at a real corpus (a Wikipedia paragraph dump) for comparable Bamboogle scores."""
    if path_or_none is not None:
        return _read_corpus_file(Path(path_or_none))
    docs: dict[tuple[str, str], Document] = {}
    found = []
    for name in PARAGRAPH_BENCHMARKS:
        try:
            file = resolve_path(name, Path(benchmarks_dir) / name)
        except FileNotFoundError:
            continue
        found.append(name)
        for doc in load_benchmark(name, file, limit_per_benchmark)[1]:
            docs.setdefault((doc.title, doc.text), doc)
    if not found:
        raise FileNotFoundError(f"none of {list(PARAGRAPH_BENCHMARKS)} found under {benchmarks_dir}")
    return list(docs.values())


def _read_corpus_file(path: Path) -> list[Document]:
    docs: dict[str, Document] = {}
    for number, raw in iter_json_objects(path):
        for key in ("title", "text") + tuple(k for k in ("id", "source") if k in raw):
            if not isinstance(raw.get(key), str):
                problem = "missing" if key not in raw else f"expected str, got {type(raw[key]).__name__}"
                raise RecordError(path, number, key, problem)
        source = raw.get("source", "corpus")
        doc = Document(
            id=raw.get("id") or doc_id(source, raw["title"], raw["text"]),
            title=raw["title"],
            text=raw["text"],
            source=source,
        )
        if doc.id in docs and (docs[doc.id].title, docs[doc.id].text) != (doc.title, doc.text):
            raise RecordError(path, number, "id", f"duplicate id {doc.id!r} with a different paragraph")
        docs.setdefault(doc.id, doc)
    return list(docs.values())
