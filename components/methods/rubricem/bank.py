"""RubricEM's agent rubric bank (paper 3.4, D.5, D.6.3): accepted reflections keyed by question, retrieved
exactly (within-episode refinement) or by similarity (cross-episode transfer), injected before the question.

- Exact match: by the sha256 of the question text (whitespace collapsed); a repeat of a question overwrites
  its entry, so the bank follows the evolving policy.
- Similarity: a FAISS inner-product index over unit-normalised question embeddings (the embedder is injected:
  anything with ``encode(list[str])``); the top ``k`` entries of *other* questions.
- Persistence: one JSON file written atomically (temporary file, fsync, rename), so a crash at any moment
  leaves either the old bank or the new one; entries keep their embeddings, so a restore needs no embedder.

    bank = RubricBank(embedder, top_k=2)
    bank.put(question, rubrics="...", takeaways="...", step=4, score=0.8)
    block, info = BankGuidance(bank)(question)     # what the scaffold agent puts before the question
    bank.save(folder / BANK_FILE); bank.load(folder / BANK_FILE)
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import faiss
import numpy as np
from pydantic import Field, ValidationError

from components.io import RecordError, atomic_path
from components.retrieval.dense import embed
from components.schemas import Question, Record

__all__ = ["BANK_FILE", "PHASE_KEY", "BankEntry", "BankGuidance", "RubricBank", "cross_block", "question_key",
           "within_block"]

BANK_FILE = "rubric_bank.json"
PHASE_KEY = "rubricem_phase"  # Question.metadata key set by the windowed curriculum: "cross" or "within"


def question_key(text: str) -> str:
    """sha256 of the question text with its whitespace collapsed."""
    return hashlib.sha256(" ".join(text.split()).encode("utf-8")).hexdigest()


class BankEntry(Record):
    """The accepted reflection on one question."""

    key: str = Field(description="sha256 of the question text (question_key).")
    question: str = Field(description="The question text.")
    question_id: str = Field(default="", description="Dataset id of the question.")
    rubrics: str = Field(description="The reflection's rubric block.")
    takeaways: str = Field(description="The reflection's takeaways block.")
    step: int = Field(default=0, ge=0, description="Training step that wrote it.")
    score: float | None = Field(default=None, description="The reflection judge's score of the entry.")
    embedding: list[float] = Field(description="Unit-norm embedding of the question.")


class RubricBank:
    def __init__(self, embedder: Any, top_k: int = 2):
        self.embedder, self.top_k = embedder, top_k
        self.entries: dict[str, BankEntry] = {}
        self.version = 0  # bumped on every change; lets callers cache retrievals
        self._index: faiss.Index | None = None
        self._keys: list[str] = []
        self._query_cache: dict[str, np.ndarray] = {}

    def __len__(self) -> int:
        return len(self.entries)

    def _embed(self, text: str) -> np.ndarray:
        key = question_key(text)
        if key in self.entries:
            return np.asarray(self.entries[key].embedding, dtype=np.float32)
        if key not in self._query_cache:
            self._query_cache[key] = embed(self.embedder, [text])[0]
        return self._query_cache[key]

    def put(self, question: str, *, rubrics: str, takeaways: str, step: int = 0, score: float | None = None,
            question_id: str = "") -> bool:
        """Store a question's reflection; returns True when it overwrote an earlier one."""
        key = question_key(question)
        replaced = key in self.entries
        self.entries[key] = BankEntry(key=key, question=question, question_id=question_id, rubrics=rubrics,
                                      takeaways=takeaways, step=step, score=score,
                                      embedding=self._embed(question).tolist())
        self._changed()
        return replaced

    def _changed(self) -> None:
        self.version += 1
        self._index = None

    def exact(self, question: str) -> BankEntry | None:
        return self.entries.get(question_key(question))

    def similar(self, question: str, k: int | None = None) -> list[tuple[BankEntry, float]]:
        """The ``k`` (default ``top_k``) most similar entries of other questions, best first, with their
        inner-product similarity."""
        k = self.top_k if k is None else k
        own = question_key(question)
        if k <= 0 or not any(key != own for key in self.entries):
            return []
        if self._index is None:
            self._keys = list(self.entries)
            vectors = np.asarray([self.entries[key].embedding for key in self._keys], dtype=np.float32)
            self._index = faiss.IndexFlatIP(vectors.shape[1])
            self._index.add(vectors)
        query = self._embed(question)[None, :].astype(np.float32)
        sims, ids = self._index.search(query, min(k + 1, len(self._keys)))
        hits = [(self.entries[self._keys[i]], float(s)) for s, i in zip(sims[0], ids[0])
                if i >= 0 and self._keys[i] != own]
        return hits[:k]

    # -- persistence --------------------------------------------------------------------------------------
    def save(self, path: str | Path) -> None:
        """Write the bank atomically: a crash before the rename leaves the previous file as it was."""
        data = {"format": 1, "entries": [e.model_dump(mode="json") for e in self.entries.values()]}
        with atomic_path(path) as fh:
            json.dump(data, fh, ensure_ascii=False)

    def load(self, path: str | Path) -> None:
        """Replace the bank's contents with the file's (errors name the file and the entry's field)."""
        path = Path(path)
        try:
            data = json.loads(path.read_text(encoding="utf-8"))
        except (OSError, json.JSONDecodeError) as exc:
            raise RecordError(path, None, None, f"cannot read the rubric bank: {exc}") from exc
        entries = {}
        for i, raw in enumerate(data.get("entries", []) if isinstance(data, dict) else []):
            try:
                entry = BankEntry.model_validate(raw)
            except ValidationError as exc:
                err = exc.errors()[0]
                raise RecordError(path, i + 1, ".".join(map(str, err["loc"])), err["msg"]) from exc
            entries[entry.key] = entry
        dims = {len(e.embedding) for e in entries.values()}
        if len(dims) > 1:
            raise RecordError(path, None, "embedding", f"entries of different dimensions {sorted(dims)}")
        self.entries = entries
        self._changed()

    def clear(self) -> None:
        self.entries = {}
        self._changed()


# ---------------------------------------------------------------------------------- injection formats


def within_block(entry: BankEntry) -> str:
    return ("<reference_examples>\nYou have worked on this very question before. Below are the rubrics and lessons "
            "you drew from that attempt: keep what worked and do not repeat its mistakes.\n\n"
            f"## Your earlier attempt at this question\n### Rubrics:\n{entry.rubrics.strip()}\n\n"
            f"### Takeaways:\n{entry.takeaways.strip()}\n</reference_examples>")


def cross_block(entries: list[BankEntry]) -> str:
    parts = [f"## Similar question {i + 1}: {e.question.strip()}\n### Rubrics:\n{e.rubrics.strip()}\n\n"
             f"### Takeaways:\n{e.takeaways.strip()}" for i, e in enumerate(entries)]
    return ("<reference_examples>\nBelow are rubrics and lessons from related questions worked on earlier. Use what "
            "applies to this question and adapt it; do not copy them.\n\n" + "\n\n---\n\n".join(parts)
            + "\n</reference_examples>")


class BankGuidance:
    """What the scaffold agent injects for a question (its ``guidance`` option): ``(block or None, info)``.

    The mode comes from the curriculum (``question.metadata[PHASE_KEY]``): ``within`` looks up the question's
    own entry, ``cross`` the ``top_k`` similar ones. Without a curriculum tag the exact entry is used when
    there is one, else similar ones. ``info`` records the mode, whether anything was found and the hits."""

    def __init__(self, bank: RubricBank):
        self.bank = bank

    def __call__(self, question: Question) -> tuple[str | None, dict[str, Any]]:
        phase = question.metadata.get(PHASE_KEY)
        entry = self.bank.exact(question.question) if phase != "cross" else None
        if phase == "within" or entry is not None:
            info = {"mode": "within", "hit": entry is not None, "items": int(entry is not None)}
            return (within_block(entry) if entry is not None else None), info
        hits = self.bank.similar(question.question)
        info = {"mode": "cross", "hit": bool(hits), "items": len(hits),
                "similarity": [round(s, 4) for _, s in hits]}
        return (cross_block([e for e, _ in hits]) if hits else None), info
