"""The agent's tools: ``search`` (ranked snippets from an index) and ``browse`` (one full document).

Tools answer the policy with text. Bad input from the policy (an empty query, an unknown document id,
an unknown tool name, a malformed argument) is answered with an error message the agent can read
and act on; it is never raised. ``Toolbox.call`` wraps everything into a ``schemas.ToolCall``.

    tools = Toolbox(SearchTool(index, top_k=3, snippet_chars=300), BrowseTool(docs_by_id, max_chars=1200))
    call = tools.call("search", "Nightfall Harbor")
    call.observation      # "[1] (w-doc-3) Nightfall Harbor: Nightfall Harbor is a 1998 film ..."
    call.doc_ids          # ["w-doc-3", ...]
    tools.call("browse", "w-doc-3").observation
    tools.for_question(question)   # per episode: the same toolbox, or one scoped to the question's paragraphs
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any, Protocol

from components.clipping import clip
from components.retrieval.scope import SCOPES, ScopedIndex, paragraph_ids
from components.schemas import Document, Question, SearchHit, ToolCall


class Searchable(Protocol):
    def search(self, query: str, k: int, snippet_chars: int | None = None) -> list[SearchHit]: ...


@dataclass
class ToolOutput:
    text: str
    doc_ids: list[str] = field(default_factory=list)
    error: str | None = None


def render_hits(hits: list[SearchHit]) -> str:
    """Numbered hits, one per line: ``[1] (doc_id) Title: snippet``."""
    return "\n".join(f"[{i}] ({h.doc_id}) {h.title}: {h.snippet}" for i, h in enumerate(hits, start=1))


class SearchTool:
    """``search(query)``: the top ``top_k`` hits of ``index`` rendered as numbered lines."""

    name = "search"

    def __init__(self, index: Searchable, top_k: int = 3, snippet_chars: int = 300):
        if top_k < 1:
            raise ValueError(f"top_k must be >= 1, got {top_k}")
        self.index, self.top_k, self.snippet_chars = index, top_k, snippet_chars

    def run(self, query: str) -> ToolOutput:
        query = " ".join(str(query).split())
        if not query:
            return ToolOutput("Error: search needs a non-empty query.", error="empty query")
        hits = self.index.search(query, self.top_k, snippet_chars=self.snippet_chars)
        if not hits:
            return ToolOutput(f"No results for {query!r}. Try other keywords.")
        return ToolOutput(render_hits(hits), [h.doc_id for h in hits])

    def __call__(self, query: str) -> tuple[str, list[str]]:
        out = self.run(query)
        return out.text, out.doc_ids

    search = __call__


class BrowseTool:
    """``browse(doc_id)``: the title and text of one document, cut to ``max_chars``."""

    name = "browse"

    def __init__(self, docs_by_id: Mapping[str, Document], max_chars: int = 1200):
        self.docs_by_id, self.max_chars = docs_by_id, max_chars

    def run(self, doc_id: str) -> ToolOutput:
        # tolerate the decorations the hit list shows around ids: (id), [id], quotes
        key = str(doc_id).strip().strip("()[]<>{}\"'` ").strip()
        doc = self.docs_by_id.get(key)
        if doc is None:
            close = difflib.get_close_matches(key, list(self.docs_by_id), n=3)
            hint = f" Did you mean: {', '.join(close)}?" if close else ""
            msg = f"Error: no document with id {key!r}. Browse an id shown in parentheses in search results."
            msg += hint
            return ToolOutput(msg, error=f"unknown document id {key!r}")
        text = f"{doc.title}\n{doc.text}"
        return ToolOutput(clip(text, self.max_chars, " [truncated]"), [doc.id])

    def __call__(self, doc_id: str) -> tuple[str, list[str]]:
        out = self.run(doc_id)
        return out.text, out.doc_ids

    browse = __call__


_ARG_KEYS = {"search": ("query", "q", "text"), "browse": ("doc_id", "id", "document", "url")}


class Toolbox:
    """Both tools behind one entry point that turns any policy input into a ``ToolCall``.

    ``scope`` is ``corpus`` (every question searches the whole corpus) or ``question`` (``for_question``
    restricts search and browse to the question's own paragraphs, see ``components.retrieval.scope``).
    """

    def __init__(self, search: SearchTool, browse: BrowseTool, observation_max_chars: int | None = None,
                 scope: str = "corpus"):
        if scope not in SCOPES:
            raise ValueError(f"unknown retrieval scope {scope!r}; expected one of {', '.join(SCOPES)}")
        self.tools = {"search": search, "browse": browse}
        self.observation_max_chars = observation_max_chars
        self.scope = scope
        self.root = self
        self._positions: dict[str, int] | None = None

    @property
    def names(self) -> list[str]:
        return list(self.tools)

    def for_question(self, question: Question) -> Toolbox:
        """The tools one episode on ``question`` uses: this toolbox for the corpus scope; for the question
        scope a view over the question's paragraphs (nothing is rebuilt; see ``ScopedIndex``). A scoped
        toolbox scopes again from the whole corpus, so calling this on it is safe."""
        root = self.root
        if root.scope == "corpus":
            return root
        search, browse = root.tools["search"], root.tools["browse"]
        ids = paragraph_ids(question)
        if root._positions is None:
            root._positions = {d.id: i for i, d in enumerate(search.index.docs)}
        index = ScopedIndex(search.index, ids, positions=root._positions, question_id=question.id)
        own = {d.id: d for d in index.docs}
        scoped = Toolbox(SearchTool(index, top_k=search.top_k, snippet_chars=search.snippet_chars),
                         BrowseTool(own, max_chars=browse.max_chars), root.observation_max_chars, scope="question")
        scoped.root = root
        return scoped

    def call(self, name: Any, argument: Any) -> ToolCall:
        tool_name = str(name).strip().lower()
        arg_name = {"search": "query", "browse": "doc_id"}.get(tool_name, "argument")
        try:
            value = _argument(tool_name, argument)
        except Exception as exc:  # noqa: BLE001 - a bad argument is reported to the agent, not raised
            value, bad = "", f"cannot read the argument ({type(exc).__name__})"
        else:
            bad = None
        tool = self.tools.get(tool_name)
        if tool is None:
            msg = f"Error: unknown tool {str(name)!r}. Available tools: {', '.join(self.tools)}."
            return ToolCall(name=str(name), arguments={arg_name: value}, observation=msg, error=msg)
        if bad is not None:
            return ToolCall(name=tool_name, arguments={}, observation=f"Error: {bad}.", error=bad)
        try:
            out = tool.run(value)
        except Exception as exc:  # noqa: BLE001 - a retriever failure is shown, the episode goes on
            out = ToolOutput(f"Error: {tool_name} failed ({type(exc).__name__}: {exc}).",
                             error=f"{type(exc).__name__}: {exc}")
        text = out.text if self.observation_max_chars is None else clip(out.text, self.observation_max_chars,
                                                                         " [truncated]")
        return ToolCall(name=tool_name, arguments={arg_name: value}, observation=text,
                        doc_ids=out.doc_ids, error=out.error)


def _argument(tool_name: str, argument: Any) -> str:
    """The tool's single string argument from a string, a dict holding it, or anything printable."""
    if argument is None:
        return ""
    if isinstance(argument, Mapping):
        for key in _ARG_KEYS.get(tool_name, ()):
            if key in argument:
                return _argument(tool_name, argument[key])
        if len(argument) == 1:
            return _argument(tool_name, next(iter(argument.values())))
        return ""
    if isinstance(argument, (list, tuple)):
        return " ".join(_argument(tool_name, a) for a in argument)
    return str(argument).strip()


def make_toolbox(index: Searchable, docs, *, top_k: int = 3, snippet_chars: int = 300,
                 browse_chars: int = 1200, scope: str = "corpus") -> Toolbox:
    """The standard agent toolbox over an index and its corpus (the agent truncates observations)."""
    return Toolbox(SearchTool(index, top_k=top_k, snippet_chars=snippet_chars),
                   BrowseTool({d.id: d for d in docs}, max_chars=browse_chars), scope=scope)
