"""build_index / load_index: round trips for every method, stale and altered indexes refused."""

from __future__ import annotations

import json

import pytest

from components.io import write_jsonl
from components.retrieval.store import IndexLoadError, StaleIndexError, build_index, load_index
from components.retrieval.text import corpus_sha256

QUERIES = ["Mara Quill", "Nightfall Harbor", "qfilm", "qplace", "film director", "Vantor"]


def _results(index):
    return [[(h.doc_id, round(h.score, 6), h.snippet) for h in index.search(q, k=3)] for q in QUERIES]


@pytest.mark.parametrize("method", ["bm25", "dense", "hybrid"])
def test_round_trip_gives_identical_results(tmp_path, docs, fake_embedder, method):
    opts = {} if method == "bm25" else {"embedder": fake_embedder, "embedder_name": "fake"}
    built = build_index(method, docs, tmp_path / "idx", snippet_chars=40, **opts)
    loaded = load_index(tmp_path / "idx", docs=docs, embedder=fake_embedder if method != "bm25" else None)
    assert type(loaded) is type(built) and loaded.method == method
    assert loaded.snippet_chars == 40
    assert _results(loaded) == _results(built)
    assert any(_results(loaded))
    manifest = json.loads((tmp_path / "idx" / "manifest.json").read_text())
    assert manifest["method"] == method and manifest["n_docs"] == len(docs)
    assert manifest["corpus_sha256"] == corpus_sha256(docs)
    assert ("dense.faiss" in manifest["files"]) == (method != "bm25")


def test_load_from_a_corpus_path(tmp_path, docs):
    write_jsonl(tmp_path / "corpus.jsonl", docs)
    build_index("bm25", docs, tmp_path / "idx")
    assert load_index(tmp_path / "idx", docs=tmp_path / "corpus.jsonl").search("Vantor", 1)[0].doc_id == "d3"


def test_stale_index_is_refused(tmp_path, docs):
    build_index("bm25", docs, tmp_path / "idx")
    changed = [d.model_copy() for d in docs]
    changed[2].text += " It also has a lighthouse."
    with pytest.raises(StaleIndexError, match="stale index .* rebuild"):
        load_index(tmp_path / "idx", docs=changed)
    with pytest.raises(StaleIndexError):
        load_index(tmp_path / "idx", docs=docs[:4])  # a document removed
    load_index(tmp_path / "idx", docs=docs)  # the original corpus still loads


def test_altered_files_are_refused(tmp_path, docs, fake_embedder):
    build_index("dense", docs, tmp_path / "idx", embedder=fake_embedder, embedder_name="fake")
    (tmp_path / "idx" / "dense.faiss").write_bytes(b"garbage")
    with pytest.raises(StaleIndexError, match="changed after the index was built"):
        load_index(tmp_path / "idx", embedder=fake_embedder)
    build_index("bm25", docs, tmp_path / "b")
    with (tmp_path / "b" / "docs.jsonl").open("a") as fh:
        fh.write(json.dumps({"id": "d9", "title": "Extra", "text": "Added by hand."}) + "\n")
    with pytest.raises(StaleIndexError):
        load_index(tmp_path / "b")


def test_missing_manifest_and_unknown_method(tmp_path, docs):
    with pytest.raises(IndexLoadError, match="manifest.json is missing"):
        load_index(tmp_path / "nothing")
    with pytest.raises(ValueError, match="unknown retrieval method"):
        build_index("splade", docs, tmp_path / "x")


def test_rebuild_with_another_method_replaces_the_folder(tmp_path, docs, fake_embedder):
    build_index("dense", docs, tmp_path / "idx", embedder=fake_embedder, embedder_name="fake")
    build_index("bm25", docs, tmp_path / "idx")
    assert not (tmp_path / "idx" / "dense.faiss").exists()
    assert load_index(tmp_path / "idx").method == "bm25"


def test_duplicate_ids_are_rejected(tmp_path, docs):
    with pytest.raises(ValueError, match="duplicate document id 'd1'"):
        build_index("bm25", docs + [docs[0]], tmp_path / "idx")


def test_unknown_embedder_name_needs_an_explicit_embedder(tmp_path, docs, fake_embedder):
    build_index("dense", docs, tmp_path / "idx", embedder=fake_embedder, embedder_name="fake")
    with pytest.raises(ValueError, match="unknown embedder 'fake'"):
        load_index(tmp_path / "idx")
