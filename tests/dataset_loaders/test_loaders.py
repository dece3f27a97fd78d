"""Benchmark loaders: the shared subsets (skipped when absent), de-duplication, upstream layouts, and
errors that name file, line and field. Synthetic lines below are invented, not copied from any dataset."""

import json
import os
from pathlib import Path

import pytest

from components.datasets import BENCHMARKS, bamboogle_corpus, doc_id, load_benchmark
from components.io import RecordError
from components.registry import RegistryError

BENCHMARKS_DIR = Path(
    os.environ.get(
        "RUBRICFLOW_BENCHMARKS", Path(__file__).resolve().parents[2].parent / "shared" / "data" / "benchmarks"
    )
)
NAMES = ["hotpotqa", "2wikimultihopqa", "musique", "bamboogle"]
TYPES = {"bridge", "comparison", "inference", "compositional", "other"}


@pytest.fixture
def shared_dir() -> Path:
    if not BENCHMARKS_DIR.is_dir():
        pytest.skip(f"benchmark subsets not found at {BENCHMARKS_DIR}")
    return BENCHMARKS_DIR


def _write(path: Path, records: list) -> Path:
    path.write_text(
        "".join((r if isinstance(r, str) else json.dumps(r)) + "\n" for r in records), encoding="utf-8"
    )
    return path


def _example(i: int, **override) -> dict:
    record = {
        "id": f"ex-{i}",
        "question": f"Who founded the studio of film {i}?",
        "answers": [f"Person {i}"],
        "type": "bridge",
        "paragraphs": [
            {"title": f"Film {i}", "text": f"Film {i} was produced by Studio {i}.", "is_supporting": True},
            {"title": f"Studio {i}", "text": f"Studio {i} was founded by Person {i}.", "is_supporting": True},
            {"title": "Shared", "text": "A paragraph every example carries.", "is_supporting": False},
        ],
        "supporting": [f"Film {i}", f"Studio {i}"],
    }
    record.update(override)
    return record


# ---- the shared subsets ------------------------------------------------------------------------------
@pytest.mark.parametrize("name", NAMES)
def test_load_shared_subset(shared_dir, name):
    questions, corpus = load_benchmark(name, shared_dir, limit=20)
    assert 0 < len(questions) <= 20
    ids = {d.id for d in corpus}
    assert len(ids) == len(corpus)
    assert len({(d.title, d.text) for d in corpus}) == len(corpus)
    assert all(d.id.startswith(f"{name}-") and d.source == name and d.title for d in corpus)
    assert len({q.id for q in questions}) == len(questions)
    for q in questions:
        assert q.source == name and q.type in TYPES and q.answers and q.question
        assert set(q.supporting_doc_ids) <= ids
        assert set(q.metadata["paragraph_ids"]) <= ids
        if name == "bamboogle":
            assert q.supporting_doc_ids == [] and q.metadata["paragraph_ids"] == []
        else:
            assert q.supporting_doc_ids
            by_id = {d.id: d for d in corpus}
            assert {by_id[i].title for i in q.supporting_doc_ids} == set(q.metadata["supporting_titles"])
    if name == "bamboogle":
        assert corpus == []
    if name == "musique":
        assert {q.type for q in questions} == {"compositional"} and all(
            q.metadata["hops"] >= 2 for q in questions
        )


def test_shared_corpus_is_deduplicated_and_ids_are_stable(shared_dir):
    questions, corpus = load_benchmark("2wikimultihopqa", shared_dir)
    n_paragraphs = sum(len(q.metadata["paragraph_ids"]) for q in questions)
    assert len(corpus) < n_paragraphs  # 2Wiki examples share paragraphs
    small_q, small_corpus = load_benchmark(
        "2wikimultihopqa", shared_dir / "2wikimultihopqa" / "dev.jsonl", limit=5
    )
    assert {d.id: d for d in small_corpus}.items() <= {d.id: d for d in corpus}.items()
    assert [q.model_dump() for q in small_q] == [q.model_dump() for q in questions[:5]]


def test_bamboogle_default_corpus_pools_the_other_benchmarks(shared_dir):
    corpus = bamboogle_corpus(None, shared_dir, limit_per_benchmark=10)
    sources = {d.source for d in corpus}
    assert sources == {"hotpotqa", "2wikimultihopqa", "musique"}
    assert len({(d.title, d.text) for d in corpus}) == len(corpus)


# ---- synthetic files -------------------------------------------------------------------------------
def test_dedupe_and_supporting_ids(tmp_path):
    path = _write(tmp_path / "dev.jsonl", [_example(1), _example(2)])
    questions, corpus = load_benchmark("hotpotqa", path)
    assert len(corpus) == 5  # 3 + 3 paragraphs, "Shared" once
    shared = doc_id("hotpotqa", "Shared", "A paragraph every example carries.")
    assert [d.id for d in corpus].count(shared) == 1
    q1 = questions[0]
    assert q1.supporting_doc_ids == [
        doc_id("hotpotqa", "Film 1", "Film 1 was produced by Studio 1."),
        doc_id("hotpotqa", "Studio 1", "Studio 1 was founded by Person 1."),
    ]
    assert q1.metadata["paragraph_ids"][2] == shared and q1.split == "dev" and q1.type == "bridge"


def test_type_mapping(tmp_path):
    path = _write(
        tmp_path / "dev.jsonl",
        [_example(1, type="bridge_comparison"), _example(2, type="inference"), _example(3, type=None)],
    )
    assert [q.type for q in load_benchmark("2wiki", path)[0]] == ["comparison", "inference", "other"]
    path = _write(tmp_path / "m.jsonl", [_example(1, type="3hop2"), _example(2, type="weird")])
    questions = load_benchmark("musique", path)[0]
    assert [q.type for q in questions] == ["compositional", "other"]
    assert questions[0].metadata == {**questions[0].metadata, "hops": 3, "original_type": "3hop2"}


def test_upstream_hotpot_and_2wiki_layout(tmp_path):
    record = {
        "_id": "up-1",
        "question": "Which  came first?",
        "answer": "Alpha",
        "type": "comparison",
        "level": "hard",
        "context": [
            ["Alpha", [" Alpha opened in 1901.", " It is old."]],
            ["Beta", ["Beta opened in 1950."]],
            ["Gamma", ["Unrelated."]],
        ],
        "supporting_facts": [["Alpha", 0], ["Beta", 0]],
        "evidences": [["Alpha", "inception", "1901"], ["Beta", "inception", "1950"]],
    }
    questions, corpus = load_benchmark("2wikimultihopqa", _write(tmp_path / "dev.jsonl", [record]))
    q = questions[0]
    assert q.id == "up-1" and q.answers == ["Alpha"] and q.question == "Which came first?"
    assert corpus[0].text == "Alpha opened in 1901. It is old."
    assert [d.title for d in corpus if d.id in q.supporting_doc_ids] == ["Alpha", "Beta"]
    assert [(s.question, s.answer) for s in q.gold_chain] == [
        ("What is the inception of Alpha?", "1901"),
        ("What is the inception of Beta?", "1950"),
    ]
    assert q.gold_chain[0].doc_id == corpus[0].id and q.metadata["level"] == "hard"


def test_upstream_musique_layout_with_decomposition(tmp_path):
    record = {
        "id": "2hop__1_2",
        "question": "Where was the founder of Studio born?",
        "answer": "Velmora",
        "answer_aliases": ["Velmora City"],
        "answerable": True,
        "paragraphs": [
            {"idx": 0, "title": "Noise", "paragraph_text": "Nothing here.", "is_supporting": False},
            {
                "idx": 1,
                "title": "Studio",
                "paragraph_text": "Studio was founded by Ada.",
                "is_supporting": True,
            },
            {"idx": 2, "title": "Ada", "paragraph_text": "Ada was born in Velmora.", "is_supporting": True},
        ],
        "question_decomposition": [
            {"id": 1, "question": "Studio >> founded by", "answer": "Ada", "paragraph_support_idx": 1},
            {"id": 2, "question": "Where was #1 born?", "answer": "Velmora", "paragraph_support_idx": 2},
        ],
    }
    questions, corpus = load_benchmark("musique", _write(tmp_path / "dev.jsonl", [record]))
    q = questions[0]
    assert q.answers == ["Velmora", "Velmora City"] and q.type == "compositional"
    assert [s.question for s in q.gold_chain] == ["Studio >> founded by", "Where was Ada born?"]
    assert [s.doc_id for s in q.gold_chain] == [corpus[1].id, corpus[2].id] == q.supporting_doc_ids


@pytest.mark.parametrize(
    "bad_line, field",
    [
        ('{"id": "x", "question": "q?", "answers": ["a"], "type": null, "paragraphs": [', None),  # bad JSON
        (json.dumps({k: v for k, v in _example(9).items() if k != "question"}), "question"),
        (json.dumps(_example(9, answers="a")), "answers"),
        (
            json.dumps(_example(9, paragraphs=[{"title": "T", "text": "x"}, {"title": 5, "text": "y"}])),
            "paragraphs[1].title",
        ),
        (json.dumps(_example(9, paragraphs=[{"title": "T"}])), "paragraphs[0].text"),
        (json.dumps(_example(9, supporting=["Nope"])), "supporting[0]"),
        (json.dumps(_example(9, type=3)), "type"),
    ],
)
def test_malformed_line_names_file_line_and_field(tmp_path, bad_line, field):
    path = _write(tmp_path / "broken.jsonl", [_example(1), "", bad_line])
    with pytest.raises(RecordError) as err:
        load_benchmark("hotpotqa", path)
    message = str(err.value)
    assert str(path) in message and ":3:" in message and err.value.line == 3
    assert err.value.field == field
    if field:
        assert field in message
    else:
        assert "invalid JSON" in message


def test_duplicate_ids_are_an_error(tmp_path):
    with pytest.raises(RecordError, match=r":2: field 'id'"):
        load_benchmark("hotpotqa", _write(tmp_path / "dev.jsonl", [_example(1), _example(1)]))


def test_limit_and_paths(tmp_path):
    (tmp_path / "musique").mkdir()
    _write(tmp_path / "musique" / "dev.jsonl", [_example(i) for i in range(4)] + ["{not json"])
    assert len(load_benchmark("musique", tmp_path, limit=2)[0]) == 2  # the broken 5th line is never read
    assert len(load_benchmark("musique", tmp_path / "musique", limit=4)[0]) == 4
    with pytest.raises(FileNotFoundError):
        load_benchmark("hotpotqa", tmp_path)
    with pytest.raises(ValueError):
        load_benchmark("musique", tmp_path, limit=-1)
    with pytest.raises(RegistryError, match="unknown benchmark"):
        load_benchmark("squad", tmp_path)
    assert set(NAMES) <= set(BENCHMARKS.names())


def test_bamboogle_corpus_from_file(tmp_path):
    path = _write(
        tmp_path / "corpus.jsonl",
        [
            {"title": "A", "text": "a text"},
            {"id": "d2", "title": "B", "text": "b text", "source": "wiki"},
            {"title": "A", "text": "a text"},
        ],
    )
    docs = bamboogle_corpus(path, tmp_path / "missing")
    assert [(d.id, d.title, d.source) for d in docs] == [
        (doc_id("corpus", "A", "a text"), "A", "corpus"),
        ("d2", "B", "wiki"),
    ]
    bad = _write(tmp_path / "bad.jsonl", [{"title": "A", "text": "x"}, {"title": "B", "text": 3}])
    with pytest.raises(RecordError, match=r"bad.jsonl:2: field 'text'"):
        bamboogle_corpus(bad, tmp_path)
    with pytest.raises(FileNotFoundError):
        bamboogle_corpus(None, tmp_path / "missing")
