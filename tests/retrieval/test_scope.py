"""Question-scoped retrieval: a scoped view ranks only a question's paragraphs with the corpus index's own
scores (nothing rebuilt), and ``Toolbox.for_question`` honours ``retrieval.scope`` on a benchmark-like
corpus (context paragraphs per example) and on the world."""

from __future__ import annotations

import json

import pytest

from components.datasets import read_benchmark
from components.retrieval.bm25 import BM25Index
from components.retrieval.dense import DenseIndex
from components.retrieval.hybrid import HybridIndex
from components.retrieval.scope import ScopedIndex, ScopeError, question_paragraphs, world_question_paragraphs
from components.retrieval.tools import make_toolbox
from components.schemas import Question
from components.world import generate_world


def q(ids, qid="q1") -> Question:
    return Question(id=qid, question="?", answers=["x"], source="hotpotqa", metadata={"paragraph_ids": ids})


def test_scoped_bm25_keeps_the_corpus_scores_of_its_documents(docs):
    full = BM25Index(docs)
    scoped = ScopedIndex(full, ["d4", "d2", "d3"])  # any order; corpus order is kept
    assert [d.id for d in scoped.docs] == ["d2", "d3", "d4"]
    everywhere = dict(full.ranked("Nightfall Harbor", 5))
    hits = scoped.search("Nightfall Harbor", k=3)
    assert [h.doc_id for h in hits] == ["d2"]             # d1 and d5 mention it too, but are not in scope
    assert hits[0].score == pytest.approx(everywhere[1])   # corpus-wide IDF: the same score in both scopes
    assert [h.doc_id for h in scoped.search("Mara Quill film", k=2)] == ["d2", "d4"]
    assert scoped.search("zeppelin", k=3) == [] and scoped.search("  ", k=3) == []


def test_scoped_dense_uses_the_stored_vectors(docs, fake_embedder):
    full = DenseIndex(docs, fake_embedder)
    calls = fake_embedder.calls
    scoped = ScopedIndex(full, ["d2", "d3", "d4"])
    ranked = scoped.ranked("qfilm", 3)
    assert fake_embedder.calls == calls + 1  # the query only: documents are not re-embedded
    # qfilm = (1, .2, 0)/|.|; Glass Orchard (1,1,0)/sqrt2 -> 1.2/(1.0198*1.4142); Mara Quill (0,1,0) -> .2/1.0198
    assert [i for i, _ in ranked] == [3, 1, 2]
    assert ranked[0][1] == pytest.approx(1.2 / (1.0198039 * 2 ** 0.5), abs=1e-5)
    assert ranked[1][1] == pytest.approx(0.2 / 1.0198039, abs=1e-5) and ranked[2][1] == pytest.approx(0.0, abs=1e-6)
    assert dict(full.ranked("qfilm", 5))[3] == pytest.approx(ranked[0][1], abs=1e-6)


def test_scoped_hybrid_fuses_scoped_rankings(docs, fake_embedder):
    full = HybridIndex(BM25Index(docs), DenseIndex(docs, fake_embedder), rrf_k=60)
    hits = ScopedIndex(full, ["d1", "d3"]).search("Vantor", k=3)
    # in scope, BM25 ranks only d3 (d2 also mentions Vantor but is out of scope); the fake embeds the
    # query "Vantor" as d3's vector, so dense ranks d3 then d1: d3 = 2/61, d1 = 1/62
    assert [h.doc_id for h in hits] == ["d3", "d1"]
    assert hits[0].score == pytest.approx(2 / 61) and hits[1].score == pytest.approx(1 / 62)
    # in the corpus scope d2 (BM25's second) comes between them
    assert [h.doc_id for h in full.search("Vantor", k=2)] == ["d3", "d2"]


def test_unknown_or_missing_paragraphs_are_errors_that_name_the_question(docs):
    tools = make_toolbox(BM25Index(docs), docs, scope="question")
    with pytest.raises(ScopeError, match="'q7'.*paragraph_ids"):
        tools.for_question(q([], qid="q7"))
    with pytest.raises(ScopeError, match=r"'q8': paragraph ids \['d99'\]"):
        tools.for_question(q(["d1", "d99"], qid="q8"))
    with pytest.raises(ValueError, match="unknown retrieval scope 'global'"):
        make_toolbox(BM25Index(docs), docs, scope="global")


def test_corpus_scope_is_the_same_toolbox(docs):
    tools = make_toolbox(BM25Index(docs), docs)
    assert tools.scope == "corpus" and tools.for_question(q(["d1"])) is tools


def test_question_scope_filters_search_and_browse(docs):
    tools = make_toolbox(BM25Index(docs), docs, top_k=3, scope="question")
    first = tools.for_question(q(["d2", "d3", "d4"]))
    call = first.call("search", "Nightfall Harbor")
    assert call.doc_ids == ["d2"] and "(d1)" not in call.observation and "(d5)" not in call.observation
    assert first.call("browse", "d1").error == "unknown document id 'd1'"
    assert first.call("browse", "d3").doc_ids == ["d3"]
    # scoping a scoped toolbox starts again from the whole corpus, and the root is untouched
    second = first.for_question(q(["d1", "d5"], qid="q2"))
    assert second.call("search", "Nightfall Harbor").doc_ids == ["d1", "d5"]
    assert tools.call("search", "Nightfall Harbor").doc_ids[:2] == ["d1", "d5"] and tools.scope == "question"


def _example(i: int, titles: list[str]) -> dict:
    return {"id": f"h{i}", "question": f"Question about {titles[0]}?", "answers": [f"answer {i}"],
            "type": "bridge", "supporting": titles[:2],
            "paragraphs": [{"title": t, "text": f"{t} is a thing described in example {i}.",
                            "is_supporting": k < 2} for k, t in enumerate(titles)]}


def test_benchmark_examples_search_their_own_context(tmp_path):
    path = tmp_path / "dev.jsonl"
    shared = "Port Elsby"   # the same paragraph in both contexts: one document, in both scopes
    rows = [_example(0, ["Mara Quill", "Vantor", shared]), _example(1, ["Ossian Threll", "Kestrow", shared])]
    rows[1]["paragraphs"][2]["text"] = rows[0]["paragraphs"][2]["text"] = "Port Elsby is a fishing town."
    path.write_text("\n".join(json.dumps(r) for r in rows) + "\n")
    questions, corpus = read_benchmark("hotpotqa", path)
    assert len(corpus) == 5
    tools = make_toolbox(BM25Index(corpus), corpus, scope="question")
    first, second = (tools.for_question(x) for x in questions)
    by_title = {d.title: d.id for d in corpus}
    assert first.call("search", "Ossian Threll Kestrow").doc_ids == []       # the other example's paragraphs
    assert second.call("search", "Ossian Threll").doc_ids[0] == by_title["Ossian Threll"]
    assert first.call("search", "fishing town").doc_ids == [by_title[shared]]
    assert second.call("search", "fishing town").doc_ids == [by_title[shared]]
    corpus_tools = make_toolbox(BM25Index(corpus), corpus)
    assert by_title["Ossian Threll"] in corpus_tools.for_question(questions[0]).call("search", "Ossian Threll").doc_ids


def test_question_paragraphs_keep_required_ids_and_fill_by_bm25(docs):
    a = Question(id="a", question="Who directed Glass Orchard?", answers=["Mara Quill"], source="world")
    b = a.model_copy(update={"id": "b"})
    ids = question_paragraphs([a, b], docs, {"a": ["d5", "d1"]}, size=3)
    # BM25 for the question ranks d4 (titled Glass Orchard) first; d1, d2 match 'directed' / 'Glass Orchard'
    assert ids == {"a": ["d1", "d4", "d5"], "b": ["d1", "d2", "d4"]}  # corpus order, not rank order
    assert question_paragraphs([a], docs, {"a": ["d1", "d2", "d3", "d4"]}, size=2) == {"a": ["d1", "d2", "d3", "d4"]}


def test_world_questions_name_gold_paragraphs_their_lookalikes_and_neighbours():
    world = generate_world(seed=5, n_people=40, n_films=15, n_cities=8, n_companies=6, distractors_per_entity=1,
                           question_mix=None, n_questions=40)
    scoped = world_question_paragraphs(world)
    all_ids = {d.id for d in world.documents}
    for question in scoped:
        ids = question.metadata["paragraph_ids"]
        gold = set(question.supporting_doc_ids)
        assert len(ids) == len(set(ids)) == 10 and set(ids) <= all_ids
        assert gold <= set(ids)
        assert {d for g in gold for d in world.lookalikes.get(g, [])} <= set(ids)
    assert [x.id for x in scoped] == [x.id for x in world.questions]
    tools = make_toolbox(BM25Index(world.documents), world.documents, scope="question")
    question = scoped[0]
    hits = tools.for_question(question).call("search", question.metadata["hop_titles"][0])
    assert hits.doc_ids and set(hits.doc_ids) <= set(question.metadata["paragraph_ids"])
    assert hits.doc_ids[0] == question.gold_chain[0].doc_id
