"""The agent's search / browse tools and the Toolbox that never raises on policy input."""

from __future__ import annotations

import pytest

from components.retrieval.bm25 import BM25Index
from components.retrieval.tools import BrowseTool, SearchTool, Toolbox
from components.schemas import ToolCall


@pytest.fixture
def toolbox(docs) -> Toolbox:
    return Toolbox(SearchTool(BM25Index(docs), top_k=2, snippet_chars=40),
                   BrowseTool({d.id: d for d in docs}, max_chars=60))


def test_search_renders_numbered_hits(docs):
    text, ids = SearchTool(BM25Index(docs), top_k=2, snippet_chars=40).search("Mara Quill")
    lines = text.splitlines()
    assert ids[0] == "d2" and len(ids) == 2
    assert lines[0].startswith("[1] (d2) Mara Quill: Mara Quill is a film director")
    assert lines[1].startswith(f"[2] ({ids[1]}) ")


def test_search_without_results_or_query(docs):
    tool = SearchTool(BM25Index(docs))
    assert tool.search("zeppelin") == ("No results for 'zeppelin'. Try other keywords.", [])
    text, ids = tool.search("   ")
    assert text.startswith("Error:") and ids == []


def test_browse_returns_the_document_and_truncates(docs):
    tool = BrowseTool({d.id: d for d in docs}, max_chars=40)
    text, ids = tool.browse("d3")
    assert ids == ["d3"] and text.startswith("Vantor\nVantor is a coastal") and text.endswith("[truncated]")
    assert tool.browse("(d3)")[1] == ["d3"]  # the decoration shown in hit lists is tolerated


def test_browse_unknown_id_is_an_error_message_not_an_exception(docs):
    text, ids = BrowseTool({d.id: d for d in docs}).browse("d33")
    assert ids == []
    assert text.startswith("Error: no document with id 'd33'") and "Did you mean: d3" in text


def test_toolbox_call_records_the_call(toolbox):
    call = toolbox.call("search", "Nightfall Harbor")
    assert isinstance(call, ToolCall)
    assert call.name == "search" and call.arguments == {"query": "Nightfall Harbor"} and call.error is None
    assert call.doc_ids[0] == "d1" and call.observation.startswith("[1] (d1)")
    call = toolbox.call("browse", {"doc_id": "d2"})
    assert call.doc_ids == ["d2"] and call.observation.startswith("Mara Quill\n")


@pytest.mark.parametrize("name, argument, error", [
    ("browse", "nope", "unknown document id"),
    ("fly", "to the moon", "unknown tool"),
    ("search", None, "empty query"),
    ("search", {"unexpected": 1, "keys": 2}, "empty query"),
    ("browse", object(), "unknown document id"),
])
def test_toolbox_never_raises_on_bad_policy_input(toolbox, name, argument, error):
    call = toolbox.call(name, argument)
    assert call.error is not None and error in call.error
    assert call.observation.startswith("Error") and call.doc_ids == []


def test_toolbox_reports_a_failing_retriever(docs):
    class Broken:
        def search(self, query, k, snippet_chars=None):
            raise RuntimeError("index offline")

    call = Toolbox(SearchTool(Broken()), BrowseTool({})).call("Search", "x")
    assert call.name == "search" and "index offline" in call.error and call.observation.startswith("Error")
