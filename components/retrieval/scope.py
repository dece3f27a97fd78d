"""Question-scoped retrieval: each question searches only its own paragraphs.

``retrieval.scope: corpus`` searches the pooled corpus (every question's paragraphs compete); ``question``
restricts ``search`` and ``browse`` to ``Question.metadata["paragraph_ids"]``, the distractor setting of
HotpotQA that ARCO's released code uses. Where the ids come from:

- benchmarks: the example's own context paragraphs (``components.datasets.loaders`` records them);
- world questions: ``question_paragraphs`` below, run at prepare time: the gold paragraphs, the
  look-alike distractor of each (``World.lookalikes``), then the paragraphs BM25 ranks highest for the
  question text until there are ``WORLD_QUESTION_PARAGRAPHS`` (10, as in HotpotQA, whose eight
  distractors are the top tf-idf hits for the question).

Nothing is rebuilt per question. ``ScopedIndex`` is a view of the corpus index that scores only the
question's documents with the corpus-wide statistics (BM25 IDF and average length, the stored dense
vectors), so a hit has the same score in both scopes and the question scope ranks like the corpus scope
with other questions' paragraphs filtered out.

    scoped = ScopedIndex(index, question.metadata["paragraph_ids"])
    scoped.search("Nightfall Harbor", k=3)            # only the question's paragraphs
    toolbox.for_question(question)                    # the agent's entry point (components.retrieval.tools)
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

from components.retrieval.bm25 import BM25Index, hit
from components.schemas import Document, Question, SearchHit

SCOPES = ("corpus", "question")
PARAGRAPH_IDS = "paragraph_ids"
WORLD_QUESTION_PARAGRAPHS = 10


class ScopeError(ValueError):
    """A question cannot be scoped: it names no paragraphs, or paragraphs the index does not hold."""


def paragraph_ids(question: Question) -> list[str]:
    """The question's own paragraph ids (``metadata["paragraph_ids"]``), or ScopeError naming the question."""
    ids = question.metadata.get(PARAGRAPH_IDS)
    if not isinstance(ids, list) or not ids:
        raise ScopeError(
            f"question {question.id!r} ({question.source}): retrieval.scope=question needs "
            f"metadata[{PARAGRAPH_IDS!r}], the question's own paragraphs; it has "
            f"{'none' if not ids else repr(ids)[:60]} (Bamboogle ships no paragraphs: use scope corpus)"
        )
    return [str(i) for i in ids]


class ScopedIndex:
    """A view of ``index`` that ranks only the documents whose ids are given (corpus order kept)."""

    def __init__(self, index, doc_ids: Sequence[str], *, positions: Mapping[str, int] | None = None,
                 question_id: str = "?"):
        positions = positions if positions is not None else {d.id: i for i, d in enumerate(index.docs)}
        missing = [d for d in doc_ids if d not in positions]
        if missing:
            raise ScopeError(f"question {question_id!r}: paragraph ids {missing[:3]} are not in the index "
                             f"({len(missing)} of {len(doc_ids)} missing); rebuild the index after prepare")
        self.index = index
        self.positions = sorted({positions[d] for d in doc_ids})
        self.docs = [index.docs[i] for i in self.positions]
        self.snippet_chars = index.snippet_chars
        self.method = index.method

    def __len__(self) -> int:
        return len(self.positions)

    def ranked(self, query: str, k: int) -> list[tuple[int, float]]:
        """(corpus position, score) of the best ``k`` of the scoped documents."""
        return self.index.ranked_among(query, k, self.positions)

    def search(self, query: str, k: int, snippet_chars: int | None = None) -> list[SearchHit]:
        n = self.snippet_chars if snippet_chars is None else snippet_chars
        return [hit(self.index.docs[i], s, n) for i, s in self.ranked(query, k)]


def question_paragraphs(
    questions: Sequence[Question], documents: Sequence[Document], required: Mapping[str, Sequence[str]],
    size: int = WORLD_QUESTION_PARAGRAPHS, index: BM25Index | None = None,
) -> dict[str, list[str]]:
    """Each question's paragraph set: ``required[q.id]`` (all of them, even past ``size``), then the
    best BM25 hits for the question text not yet in, up to ``size``; ids in corpus order."""
    index = index or BM25Index(documents)
    position = {d.id: i for i, d in enumerate(index.docs)}
    out = {}
    for q in questions:
        chosen = list(dict.fromkeys(required.get(q.id, ())))
        unknown = [d for d in chosen if d not in position]
        if unknown:
            raise ScopeError(f"question {q.id!r}: required paragraphs {unknown[:3]} are not in the corpus")
        if len(chosen) < size:
            taken = set(chosen)
            for i, _ in index.ranked(q.question, size + len(chosen)):
                if len(chosen) >= size:
                    break
                if index.docs[i].id not in taken:
                    chosen.append(index.docs[i].id)
                    taken.add(index.docs[i].id)
        out[q.id] = sorted(chosen, key=position.__getitem__)
    return out


def with_paragraph_ids(questions: Sequence[Question], ids: Mapping[str, list[str]]) -> list[Question]:
    """Copies of ``questions`` with ``metadata["paragraph_ids"]`` set from ``ids``."""
    return [q.model_copy(update={"metadata": {**q.metadata, PARAGRAPH_IDS: ids[q.id]}}) for q in questions]


def world_question_paragraphs(world, questions: Sequence[Question] | None = None,
                              size: int = WORLD_QUESTION_PARAGRAPHS) -> list[Question]:
    """World questions with their paragraph sets recorded: gold paragraphs, their look-alikes, BM25 fill."""
    questions = world.questions if questions is None else questions
    required = {}
    for q in questions:
        gold = list(dict.fromkeys([*q.supporting_doc_ids, *(h.doc_id for h in q.gold_chain if h.doc_id)]))
        required[q.id] = gold + [d for g in gold for d in world.lookalikes.get(g, [])]
    return with_paragraph_ids(questions, question_paragraphs(questions, world.documents, required, size))
