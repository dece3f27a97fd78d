"""An exact oracle for world questions: which paragraph to look up next, and the answer obtained by
following the gold chain through the paragraphs alone.

    from components.world.oracle import title_search, oracle_answer, gold_search_queries, gold_next_query
    search = title_search(world.documents)
    oracle_answer(question, search)          # the final answer, read hop by hop from paragraphs
    gold_search_queries(question)            # ['The Glass Harbor', 'Torvel Ashmere']: titles in hop order
    gold_next_query(question, ["The Glass Harbor"])   # 'Torvel Ashmere'; None once all were searched

``oracle_answer`` checks at every hop that the title it looks up is already known (named in the question
or an earlier hop's answer), that the search returns that paragraph, and that the hop's answer is
written in it; it raises ``OracleError`` otherwise. Comparisons are decided from the hop answers with
the question's ``metadata["compare"]``. An answer it returns for every question proves that every gold
chain can be followed from the paragraphs (tests assert EM 1.0 over generated worlds).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from components.schemas import Document, Question

Search = Callable[[str], "Document | None"]


class OracleError(AssertionError):
    """A gold chain that cannot be followed through the paragraphs."""


def title_search(documents: Sequence[Document]) -> Search:
    """A search function that returns the document whose title equals the query (case-insensitive)."""
    index = {d.title.casefold(): d for d in documents}
    return lambda query: index.get(query.strip().casefold())


def hop_titles(question: Question) -> list[str]:
    """The paragraph title read at each hop (one per gold-chain entry, repeats kept)."""
    titles = question.metadata.get("hop_titles")
    if not isinstance(titles, list) or len(titles) != len(question.gold_chain):
        raise OracleError(
            f"{question.id}: metadata['hop_titles'] is missing or does not match the gold chain"
        )
    return titles


def gold_search_queries(question: Question) -> list[str]:
    """The entity titles a perfect agent looks up, in hop order, each once."""
    return list(dict.fromkeys(hop_titles(question)))


def gold_next_query(question: Question, searched: Sequence[str]) -> str | None:
    """The next title to look up after ``searched`` (compared case-insensitively); None means all gold
    paragraphs were looked up and the agent should answer."""
    done = {s.strip().casefold() for s in searched}
    for title in gold_search_queries(question):
        if title.casefold() not in done:
            return title
    return None


def _number(text: str) -> int:
    return int(text.replace(",", ""))


def oracle_answer(question: Question, search: Search) -> str:
    """Follow the gold chain by title lookups, checking each hop against the paragraph text."""
    known = [question.question]
    answers = []
    for k, (hop, title) in enumerate(zip(question.gold_chain, hop_titles(question))):
        if not any(title in text for text in known):
            raise OracleError(f"{question.id} hop {k}: looks up {title!r}, which is not known yet")
        doc = search(title)
        if doc is None:
            raise OracleError(f"{question.id} hop {k}: no paragraph titled {title!r}")
        if hop.doc_id is not None and doc.id != hop.doc_id:
            raise OracleError(
                f"{question.id} hop {k}: search gave {doc.id}, the gold chain says {hop.doc_id}"
            )
        if hop.answer not in doc.text:
            raise OracleError(
                f"{question.id} hop {k}: {hop.answer!r} is not in paragraph {doc.id} ({title!r})"
            )
        known.append(hop.answer)
        answers.append(hop.answer)
    compare = question.metadata.get("compare")
    if not compare:
        return answers[-1]
    i, j = compare["value_hops"]
    if compare["op"] == "same":
        return "yes" if answers[i] == answers[j] else "no"
    a, b = compare["options"]
    va, vb = _number(answers[i]), _number(answers[j])
    if va == vb:
        raise OracleError(f"{question.id}: comparison ties at {va}")
    return a if (va < vb) == (compare["op"] == "min") else b
