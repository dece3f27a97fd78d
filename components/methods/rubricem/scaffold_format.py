"""The text format of RubricEM's scaffold (paper 3.2, B.1, C.3): its tags, the stage parser, the turn parser
and the validator, with the rejection reasons of scaffold SFT data (B.2.3). Pure text functions, no model:
the agent (:mod:`components.methods.rubricem.scaffold_agent`), the stagewise judge and the SFT rejection all read episodes
through them.

Stages (the judge's boundaries, C.3): PLAN runs to the first ``</structured_plan>``; RESEARCH from there through
the tool loop (a revised ``<structured_plan>`` inside it stays RESEARCH); REVIEW from the last ``<think>`` of
the reviewing turn through ``</review>``; ANSWER from ``<answer>`` to the end. :func:`stage_spans` finds these
boundaries in any text given the stage it starts in, so the agent tags each reply and :func:`split_stages`
cuts a whole trajectory with the same rule.

    split_stages(scaffold_text(trajectory)).blocks["review"]        # scaffold_text: components.judges.render
    scaffold_problems(trajectory)          # [("citation", "step 3: cites d9, which no tool returned"), ...]
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from components.agents.parsing import PLACEHOLDERS, ParsedAction
from components.judges.render import scaffold_text
from components.schemas import Step, Trajectory
from components.warmstart.rejection import grounded

PLAN, RESEARCH, REVIEW, ANSWER = range(4)
STAGES = ("plan", "research", "review", "answer")
TOOLS = ("search", "browse")
SCAFFOLD_REASONS = ("stage_boundary", "tool_syntax", "citation", "tool_errors", "grounding")
MAX_CONSECUTIVE_TOOL_ERRORS = 1  # B.2.3: one failed round followed by a recovery is kept; two in a row are not

_CALL = re.compile(r'<call_tool\s+name\s*=\s*"?([A-Za-z_]+)"?\s*>(.*?)</call_tool>', re.DOTALL)
_ANSWER = re.compile(r"<answer>(.*?)</answer>", re.DOTALL)
_CITE = re.compile(r"<cite\b([^>]*)>(.*?)</cite>", re.DOTALL)
_CITE_ID = re.compile(r'^\s*id\s*=\s*"([^"]*)"\s*$')
_THINK = re.compile(r"<think>(.*?)</think>", re.DOTALL)
_BOXED = re.compile(r"^\\boxed\{(.*)\}$", re.DOTALL)
_TAGS = ("think", "structured_plan", "deep_analysis", "rubric", "research_plan", "state_evaluation", "review",
         "rubric_review", "writing_plan", "answer", "call_tool")


def _open(text: str, tag: str, start: int = 0) -> int:
    m = re.compile(rf"<{tag}\b[^>]*>").search(text, start)
    return m.start() if m else -1


def _inner(text: str, tag: str) -> str | None:
    m = re.search(rf"<{tag}\b[^>]*>(.*?)</{tag}>", text, re.DOTALL)
    return m.group(1) if m else None


# ----------------------------------------------------------------------------------------- stages


def stage_spans(text: str, stage: int = PLAN) -> list[tuple[int, int]]:
    """``[(offset, stage), ...]``: where each stage starts in ``text``, given the stage in force at its start.

    PLAN ends after the first ``</structured_plan>`` (or, when it is missing, where the first ``<call_tool``
    starts); REVIEW starts at the last ``<think>`` before ``<review>`` that follows the last tool output (the
    reviewing turn's own thinking); ANSWER starts at ``<answer>``. Stages only move forward and may be
    skipped (an answer with no review)."""
    spans = [(0, stage)]

    def move(offset: int, new: int) -> None:
        if spans[-1][0] == offset:
            spans[-1] = (offset, new)
        else:
            spans.append((offset, new))

    pos = 0
    if stage == PLAN:
        close, call = text.find("</structured_plan>"), _open(text, "call_tool")
        if close >= 0 and (call < 0 or close < call):
            pos, stage = close + len("</structured_plan>"), RESEARCH
        elif call >= 0:
            pos, stage = call, RESEARCH
        if stage == RESEARCH:
            move(pos, RESEARCH)
    if stage < REVIEW:
        review, answer = _open(text, "review", pos), _open(text, "answer", pos)
        if review >= 0 and (answer < 0 or review < answer):
            output_end = text.rfind("</tool_output>", pos, review)
            floor = pos if output_end < 0 else output_end + len("</tool_output>")
            think = text.rfind("<think>", floor, review)
            move(think if think >= 0 else review, REVIEW)
            pos, stage = review, REVIEW
    if stage < ANSWER:
        answer = _open(text, "answer", pos)
        if answer >= 0:
            move(answer, ANSWER)
    return spans


@dataclass
class StageSplit:
    """A trajectory cut into its stages: ``blocks[name]`` is the stage's text (None when it never occurs)."""

    blocks: dict[str, str | None]
    spans: list[tuple[int, int]]

    def present(self) -> list[bool]:
        return [self.blocks[name] is not None for name in STAGES]


def split_stages(text: str) -> StageSplit:
    """Cut a whole trajectory text (:func:`components.judges.render.scaffold_text`) into the four stages' text
    blocks."""
    spans = stage_spans(text, PLAN)
    blocks: dict[str, str | None] = dict.fromkeys(STAGES)
    for i, (start, stage) in enumerate(spans):
        end = spans[i + 1][0] if i + 1 < len(spans) else len(text)
        if end > start or stage == PLAN:
            blocks[STAGES[stage]] = text[start:end]
    return StageSplit(blocks, spans)


def self_rubrics(trajectory: Trajectory) -> list[str]:
    """The ``<rubric>`` blocks the agent wrote for itself (the first plan and any revisions), in order."""
    return [m.strip() for m in re.findall(r"<rubric>(.*?)</rubric>", scaffold_text(trajectory), re.DOTALL) if m.strip()]


# ----------------------------------------------------------------------------------------- one turn


def complete_reply(text: str) -> str:
    """Put back the closing tag a stop string cut off (the engines drop ``</call_tool>`` / ``</answer>``)."""
    stripped = text.rstrip()
    for tag in ("call_tool", "answer"):
        last_open = max(stripped.rfind(f"<{tag}>"), stripped.rfind(f"<{tag} "))
        if last_open >= 0 and stripped.rfind(f"</{tag}>") < last_open:
            return stripped + f"</{tag}>"
    return text


def clean_answer(text: str) -> str:
    """The answer text without citation tags, a ``\\boxed{}`` wrapper or surrounding space."""
    out = _CITE.sub(lambda m: m.group(2), text).strip()
    boxed = _BOXED.match(out)
    return (boxed.group(1) if boxed else out).strip()


def parse_scaffold_turn(text: str) -> ParsedAction:
    """The reply's action: its last complete ``<call_tool>`` or ``<answer>`` (whichever comes later)."""
    think = _THINK.search(text)
    thought = think.group(1).strip()[:500] if think else ""
    calls, answers = list(_CALL.finditer(text)), list(_ANSWER.finditer(text))
    call, answer = (calls[-1] if calls else None), (answers[-1] if answers else None)
    if answer is not None and (call is None or answer.start() > call.start()):
        value = clean_answer(answer.group(1))
        if not value or value.lower().strip(" .") in PLACEHOLDERS:
            return ParsedAction("invalid", thought=thought, error=f"empty or placeholder answer {value!r}")
        return ParsedAction("finish", value, thought)
    if call is not None:
        name, argument = call.group(1).lower(), " ".join(call.group(2).split())
        if name not in TOOLS:
            return ParsedAction("invalid", thought=thought, error=f"unknown tool {name!r} (expected search or browse)")
        if not argument:
            return ParsedAction("invalid", thought=thought, error=f"empty argument for {name}")
        return ParsedAction(name, argument, thought)
    return ParsedAction("invalid", thought=thought, error="no <call_tool> or <answer> found")


# ----------------------------------------------------------------------------------------- validation


def _balance(raw: str) -> str | None:
    for tag in _TAGS:
        opened, closed = len(re.findall(rf"<{tag}\b[^>]*>", raw)), raw.count(f"</{tag}>")
        if opened != closed:
            return f"<{tag}> opened {opened} times, closed {closed} times"
    return None


def _ordered(text: str, tags: tuple[str, ...]) -> str | None:
    """None when every tag is present, closed, and in the given order; else what is wrong."""
    last = -1
    for tag in tags:
        start = _open(text, tag)
        if start < 0 or text.find(f"</{tag}>", start) < 0:
            return f"missing <{tag}>...</{tag}>"
        if start < last:
            return f"<{tag}> out of order"
        last = start
    return None


def validate_scaffold(trajectory: Trajectory) -> list[tuple[str, str]]:
    """Stage-boundary and tool-syntax violations of an episode, as (reason, detail) in turn order."""
    out: list[tuple[str, str]] = []
    steps = trajectory.steps
    if not steps:
        return [("stage_boundary", "the episode has no turn")]
    for step in steps:
        raw, i, final = step.raw, step.index, step.final_answer is not None
        body = raw.strip()
        if not body.startswith("<think>"):
            out.append(("stage_boundary", f"step {i}: the reply does not begin with <think>"))
        unbalanced = _balance(raw)
        if unbalanced:
            out.append(("stage_boundary", f"step {i}: {unbalanced}"))
        if "<tool_output>" in raw:
            out.append(("tool_syntax", f"step {i}: the policy wrote a <tool_output> itself"))
        n_calls, n_open = len(_CALL.findall(raw)), len(re.findall(r"<call_tool\b", raw))
        if i == 0:
            plan = _inner(raw, "structured_plan")
            problem = "missing <structured_plan>" if plan is None else _ordered(plan, ("deep_analysis", "rubric",
                                                                                       "research_plan"))
            if problem:
                out.append(("stage_boundary", f"step 0: plan stage: {problem}"))
            if final:
                out.append(("stage_boundary", "step 0: answered in the first reply, before any search"))
        elif "<state_evaluation>" not in raw:
            out.append(("stage_boundary", f"step {i}: no <state_evaluation>"))
        if final:
            problem = _ordered(raw, ("review", "answer"))
            review = _inner(raw, "review")
            if problem is None and review is not None:
                problem = _ordered(review, ("rubric_review", "writing_plan"))
            if problem:
                out.append(("stage_boundary", f"step {i}: review/answer stage: {problem}"))
            if not body.endswith("</answer>"):
                out.append(("stage_boundary", f"step {i}: text after </answer>"))
            if n_open:
                out.append(("tool_syntax", f"step {i}: a tool call in the answering turn"))
        else:
            if n_open != 1 or n_calls != 1:
                why = f"step {i}: {n_open} <call_tool> tags ({n_calls} well-formed); exactly one is required"
                out.append(("tool_syntax", why))
            elif not body.endswith("</call_tool>"):
                out.append(("tool_syntax", f"step {i}: text after </call_tool>"))
            else:
                name, argument = _CALL.search(raw).groups()
                if name.lower() not in TOOLS or not argument.strip():
                    out.append(("tool_syntax", f"step {i}: bad call {name!r}({argument.strip()!r})"))
            if "<answer>" in raw:
                out.append(("stage_boundary", f"step {i}: <answer> in a turn that calls a tool"))
    if steps[-1].final_answer is None:
        out.append(("stage_boundary", "the episode never reaches the <answer> stage"))
    return out


def consecutive_tool_errors(trajectory: Trajectory) -> list[tuple[str, str]]:
    """B.2.3's tool-error rule: an episode with two or more tool rounds in a row whose call came back as an
    error is discarded; a single failed round followed by a successful one is kept (it shows a recovery).

    A failed round is a turn whose ``tool_call.error`` is set: the toolbox marks an empty query, an unknown
    document id, an unknown tool, an unreadable argument or a retriever exception that way
    (:meth:`components.retrieval.tools.Toolbox.call`). A search that finds nothing is an answer, not an error.
    Runs are counted over the turns that called a tool: a turn with no call (an unreadable reply, the answer)
    neither counts nor ends a run, since no successful call came in between."""
    runs: list[list[Step]] = []
    current: list[Step] = []
    for step in trajectory.steps:
        if step.tool_call is None:
            continue
        if step.tool_call.error is None:
            current = []
            continue
        if not current:
            runs.append(current)
        current.append(step)
    found = []
    for run in runs:
        if len(run) > MAX_CONSECUTIVE_TOOL_ERRORS:
            steps = ", ".join(str(s.index) for s in run)
            first = run[0].tool_call.error if run[0].tool_call is not None else None
            found.append(("tool_errors", f"steps {steps}: {len(run)} tool errors in a row (first: {first})"))
    return found


def scaffold_problems(trajectory: Trajectory) -> list[tuple[str, str]]:
    """What rejection sampling of scaffold SFT data discards an episode for (B.2.3), as (reason, detail) in
    ``SCAFFOLD_REASONS`` order: stage boundaries, tool syntax, citations (a malformed or empty ``<cite>``, a
    cited id no tool returned, a review citing nothing), two or more tool errors in a row
    (:func:`consecutive_tool_errors`) and grounding (an answer no tool output contains). Correctness,
    repeated calls and duplicates stay with ``components.warmstart.rejection``."""
    found = validate_scaffold(trajectory)
    found.extend(consecutive_tool_errors(trajectory))
    seen = set(trajectory.docs_seen)
    for step in trajectory.steps:
        if step.raw.count("<cite") != len(_CITE.findall(step.raw)):
            found.append(("citation", f"step {step.index}: an unclosed or malformed <cite>"))
        for attrs, claim in _CITE.findall(step.raw):
            m = _CITE_ID.match(attrs)
            ids = [x.strip() for x in m.group(1).split(",")] if m else []
            if not ids or not all(ids) or not claim.strip():
                found.append(("citation", f"step {step.index}: empty citation {attrs.strip()!r}"))
            elif unseen := [x for x in ids if x not in seen]:
                found.append(("citation", f"step {step.index}: cites {', '.join(unseen)}, which no tool returned"))
    review = next((s for s in trajectory.steps if "<review>" in s.raw), None)
    if review is not None and not _CITE.search(_inner(review.raw, "review") or ""):
        found.append(("citation", f"step {review.index}: the review cites no document"))
    if trajectory.final_answer is not None and not grounded(trajectory.final_answer, trajectory):
        found.append(("grounding", f"{trajectory.final_answer!r} is in no tool output"))
    return sorted(found, key=lambda p: SCAFFOLD_REASONS.index(p[0]))


def scaffold_rejections(t: Trajectory) -> list[tuple[str, str]]:
    """The turn-format problems rejection sampling finds in a scaffold warm-start episode (B.2.3): the
    scaffold's own checks but grounding (``components.warmstart.rejection`` checks that for every format),
    and a turn the parser could not read as ``tool_syntax``."""
    found = [(reason, detail) for reason, detail in scaffold_problems(t) if reason != "grounding"]
    parse = next((s for s in t.steps if s.parse_error), None)
    if parse is not None:
        found.append(("tool_syntax", f"step {parse.index}: {parse.parse_error}"))
    return found
