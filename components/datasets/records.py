"""Parse one line of a multi-hop QA benchmark file into a checked ``Example``, with errors that name
file, line and field (``components.io.RecordError``), e.g.

    components.io.RecordError: dev.jsonl:7: field 'paragraphs[3].title': expected str, got int

Two layouts are accepted, so the same loader reads the shared subsets and the upstream files:
- normalised (``shared/data/benchmarks/*/dev.jsonl``, see its SOURCES.md): ``id``, ``question``,
  ``answers`` (list), ``type``, ``paragraphs`` [{``title``, ``text``, ``is_supporting``}], ``supporting``
  (titles); optional ``question_decomposition`` (MuSiQue) and ``evidences`` (2Wiki) when present;
- upstream: HotpotQA / 2Wiki (``_id``, ``answer``, ``context`` [[title, sentences]], ``supporting_facts``
  [[title, sentence index]], ``evidences``, ``level``) and MuSiQue (``answer`` + ``answer_aliases``,
  ``paragraphs`` with ``paragraph_text``, ``question_decomposition``).
Unknown extra keys are ignored.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from components.io import RecordError, iter_json_objects

_NAMES = {str: "str", list: "list", dict: "object", bool: "bool", int: "int"}


@dataclass
class Paragraph:
    title: str
    text: str
    is_supporting: bool = False


@dataclass
class Example:
    id: str
    question: str
    answers: list[str]
    type: str | None
    paragraphs: list[Paragraph]
    supporting: list[str]
    decomposition: list[dict[str, Any]] | None = None  # MuSiQue: question, answer, paragraph_support_idx
    evidences: list[list[str]] | None = None  # 2Wiki: [subject, relation, object]
    extra: dict[str, Any] = field(default_factory=dict)
    line: int = 0


class _Checker:
    def __init__(self, path: str | Path, line: int):
        self.path, self.line = path, line

    def fail(self, where: str, message: str) -> RecordError:
        return RecordError(self.path, self.line, where, message)

    def typed(self, value: Any, kind: type, where: str, *, optional: bool = False) -> Any:
        if value is None and optional:
            return None
        ok = isinstance(value, kind) and not (kind is int and isinstance(value, bool))
        if not ok:
            raise self.fail(where, f"expected {_NAMES.get(kind, kind.__name__)}, got {type(value).__name__}")
        return value

    def get(
        self, obj: dict, key: str, kind: type, where: str | None = None, *, optional: bool = False
    ) -> Any:
        where = where or key
        if key not in obj:
            if optional:
                return None
            raise self.fail(where, "missing")
        return self.typed(obj[key], kind, where, optional=optional)

    def strings(self, values: list, where: str) -> list[str]:
        return [self.typed(v, str, f"{where}[{i}]") for i, v in enumerate(values)]


def _collapse(text: str) -> str:
    return " ".join(text.split())


def _paragraphs(c: _Checker, raw: dict) -> tuple[list[Paragraph], list[str] | None]:
    """Paragraphs, and supporting titles when the layout implies them (upstream ``supporting_facts``)."""
    if "paragraphs" in raw:
        out = []
        for i, p in enumerate(c.get(raw, "paragraphs", list)):
            where = f"paragraphs[{i}]"
            p = c.typed(p, dict, where)
            title = c.get(p, "title", str, f"{where}.title")
            key = "text" if "text" in p or "paragraph_text" not in p else "paragraph_text"
            text = c.get(p, key, str, f"{where}.{key}")
            flag = c.get(p, "is_supporting", bool, f"{where}.is_supporting", optional=True)
            out.append(Paragraph(title, text, bool(flag)))
        return out, None
    if "context" in raw:
        out = []
        for i, entry in enumerate(c.get(raw, "context", list)):
            where = f"context[{i}]"
            entry = c.typed(entry, list, where)
            if len(entry) != 2:
                raise c.fail(where, "expected [title, sentences]")
            title = c.typed(entry[0], str, f"{where}[0]")
            sentences = c.strings(c.typed(entry[1], list, f"{where}[1]"), f"{where}[1]")
            out.append(Paragraph(title, _collapse(" ".join(sentences))))
        supporting = None
        if "supporting_facts" in raw:
            supporting = []
            for i, fact in enumerate(c.get(raw, "supporting_facts", list)):
                fact = c.typed(fact, list, f"supporting_facts[{i}]")
                if not fact:
                    raise c.fail(f"supporting_facts[{i}]", "expected [title, sentence index]")
                supporting.append(c.typed(fact[0], str, f"supporting_facts[{i}][0]"))
            supporting = list(dict.fromkeys(supporting))
            for p in out:
                p.is_supporting = p.title in supporting
        return out, supporting
    raise c.fail("paragraphs", "missing (neither 'paragraphs' nor 'context' is present)")


def parse_example(raw: object, path: str | Path, line: int) -> Example:
    """Check one decoded JSON line and return it as an ``Example``."""
    c = _Checker(path, line)
    if not isinstance(raw, dict):
        raise RecordError(path, line, None, f"expected a JSON object, got {type(raw).__name__}")
    id_key = "id" if "id" in raw or "_id" not in raw else "_id"
    ex_id = c.get(raw, id_key, str)
    question = c.get(raw, "question", str)
    if "answers" in raw or "answer" not in raw:
        answers = c.strings(c.get(raw, "answers", list), "answers")
    else:
        answers = [c.get(raw, "answer", str)]
        answers += c.strings(c.get(raw, "answer_aliases", list, optional=True) or [], "answer_aliases")
    answers = [a.strip() for a in answers if a.strip()]
    if not answers:
        raise c.fail("answers", "no non-empty answer")
    q_type = c.get(raw, "type", str, optional=True)
    paragraphs, implied = _paragraphs(c, raw)
    if "supporting" in raw:
        supporting = c.strings(c.get(raw, "supporting", list), "supporting")
    elif implied is not None:
        supporting = implied
    else:
        supporting = list(dict.fromkeys(p.title for p in paragraphs if p.is_supporting))
    titles = {p.title for p in paragraphs}
    for i, title in enumerate(supporting):
        if paragraphs and title not in titles:
            raise c.fail(f"supporting[{i}]", f"title {title!r} is not among the paragraphs")
    decomposition = _decomposition(c, raw, len(paragraphs))
    evidences = None
    if raw.get("evidences") is not None:
        evidences = []
        for i, triple in enumerate(c.get(raw, "evidences", list)):
            triple = c.strings(c.typed(triple, list, f"evidences[{i}]"), f"evidences[{i}]")
            if len(triple) != 3:
                raise c.fail(f"evidences[{i}]", "expected [subject, relation, object]")
            evidences.append(triple)
    extra = {k: raw[k] for k in ("level",) if k in raw}
    return Example(
        ex_id,
        _collapse(question),
        answers,
        q_type,
        paragraphs,
        supporting,
        decomposition,
        evidences,
        extra,
        line,
    )


def _decomposition(c: _Checker, raw: dict, n_paragraphs: int) -> list[dict[str, Any]] | None:
    if raw.get("question_decomposition") is None:
        return None
    out = []
    for i, step in enumerate(c.get(raw, "question_decomposition", list)):
        where = f"question_decomposition[{i}]"
        step = c.typed(step, dict, where)
        idx = c.get(step, "paragraph_support_idx", int, f"{where}.paragraph_support_idx", optional=True)
        if idx is not None and not 0 <= idx < n_paragraphs:
            raise c.fail(f"{where}.paragraph_support_idx", f"{idx} is outside the {n_paragraphs} paragraphs")
        out.append(
            {
                "question": c.get(step, "question", str, f"{where}.question"),
                "answer": c.get(step, "answer", str, f"{where}.answer"),
                "paragraph_support_idx": idx,
            }
        )
    return out


def iter_examples(path: str | Path, limit: int | None = None) -> Iterator[Example]:
    """Yield checked examples from a JSONL file (blank lines skipped), at most ``limit`` of them."""
    if limit is not None and (not isinstance(limit, int) or limit < 0):
        raise ValueError(f"limit must be None or an integer >= 0, got {limit!r}")
    if limit == 0:
        return
    count = 0
    for number, raw in iter_json_objects(path):
        yield parse_example(raw, path, number)
        count += 1
        if limit is not None and count >= limit:
            return  # lines past the limit are never parsed
