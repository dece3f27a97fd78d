"""Parse a policy turn into (thought, action). Small models write messy output, so the parser accepts:

- ``Action: search[query]``, ``Action: browse[doc_id]``, ``Action: finish[answer]`` (the taught form);
- ``search: query`` / ``Search(query)`` / ``search "query"`` variants, case-insensitive;
- JSON such as ``{"tool": "search", "query": "..."}`` or ``{"action": "finish", "answer": "..."}``;
- ``Final Answer: ...`` / ``Answer: ...`` as a finish.

The last action in the text wins (a model that drafts and then corrects itself meant the correction).
A finish whose argument is a placeholder (``finish[answer]``, ``finish[...]``, ``finish[<answer>]``) is not an
answer: small policies copy such slots from instructions, so it is unparseable too.
Anything else is unparseable: the agent records ``parse_error`` on the step and shows the policy a short
format reminder as the observation; the turn counts against the turn budget but not the search budget.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.llm.json_reply import outer_json

TOOLS = ("search", "browse")
FINISH = ("finish", "answer", "final_answer")

_BRACKET = re.compile(r"\b(search|browse|finish|answer)\s*[\[\(]\s*(.+?)\s*[\]\)]\s*$", re.IGNORECASE | re.DOTALL)
_COLON = re.compile(r"\b(search|browse|finish)\s*[:=]\s*(.+)$", re.IGNORECASE)
_FINAL = re.compile(r"^\s*(?:final\s+answer|answer)\s*[:=]\s*(.+)$", re.IGNORECASE | re.MULTILINE)
_THOUGHT = re.compile(r"thought\s*:\s*(.*?)(?=\n\s*action\s*:|\Z)", re.IGNORECASE | re.DOTALL)


@dataclass(frozen=True)
class ParsedAction:
    kind: str  # "search", "browse", "finish" or "invalid"
    argument: str = ""
    thought: str = ""
    error: str | None = None

    @property
    def text(self) -> str:
        """Normalised action string, e.g. ``search[Nightfall Harbor]``."""
        return f"{self.kind}[{self.argument}]" if self.kind != "invalid" else ""


def _clean(arg: str) -> str:
    arg = arg.strip().strip("`").strip()
    if len(arg) >= 2 and arg[0] == arg[-1] and arg[0] in "\"'":
        arg = arg[1:-1].strip()
    return arg


PLACEHOLDERS = {"answer", "the answer", "your answer", "final answer", "short answer", "...", "…", "<answer>",
                "answer here", "<the answer>", "<your answer>"}


def _finish_or_placeholder(arg: str, thought: str) -> ParsedAction:
    if arg.lower().strip(" .") in PLACEHOLDERS or arg.strip() in PLACEHOLDERS:
        return ParsedAction("invalid", thought=thought, error=f"placeholder {arg!r} instead of an answer")
    return ParsedAction("finish", arg, thought)


def _from_json(text: str) -> tuple[str, str] | None:
    try:
        data = outer_json(text)
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    kind = str(data.get("tool") or data.get("action") or data.get("name") or "").lower()
    arg = data.get("query") or data.get("doc_id") or data.get("answer") or data.get("argument") or data.get("input")
    if kind in FINISH:
        kind = "finish"
    if kind in (*TOOLS, "finish") and isinstance(arg, (str, int, float)):
        return kind, str(arg)
    return None


def parse_turn(text: str) -> ParsedAction:
    thought_match = _THOUGHT.search(text)
    thought = thought_match.group(1).strip() if thought_match else ""
    # keep only what follows the last "Action:" marker when there is one
    lowered = text.lower()
    marker = lowered.rfind("action:")
    tail = text[marker + len("action:"):] if marker >= 0 else text
    if not thought and marker > 0:
        thought = text[:marker].strip()

    candidates: list[tuple[int, str, str]] = []
    for line_start, line in _lines_with_offsets(tail):
        m = _BRACKET.search(line) or _COLON.search(line)
        if m:
            candidates.append((line_start, m.group(1).lower(), m.group(2)))
    if candidates:
        _, kind, arg = candidates[-1]
        kind = "finish" if kind in FINISH else kind
        arg = _clean(arg)
        if arg:
            return _finish_or_placeholder(arg, thought) if kind == "finish" else ParsedAction(kind, arg, thought)
        return ParsedAction("invalid", thought=thought, error=f"empty argument for {kind}")
    as_json = _from_json(tail)
    if as_json:
        if as_json[0] == "finish":
            return _finish_or_placeholder(_clean(as_json[1]), thought)
        return ParsedAction(as_json[0], _clean(as_json[1]), thought)
    final = _FINAL.findall(text)
    if final and _clean(final[-1]):
        return _finish_or_placeholder(_clean(final[-1]), thought)
    return ParsedAction("invalid", thought=thought or text.strip()[:200],
                        error="no action found (expected search[...], browse[...] or finish[...])")


def _lines_with_offsets(text: str):
    offset = 0
    for line in text.splitlines(keepends=True):
        yield offset, line.strip()
        offset += len(line)
