"""The texts a judge (or a writer of rubrics or reflections) is shown for an agent's steps, one home for the
renderers, each named for its view: :func:`render_prefix` (Co-ReAct's committed steps as numbered action /
observation lines), :func:`trajectory_text` (ARBOR's and RaR's turn-by-turn view), :func:`scaffold_text` (RubricEM's
episode as the policy wrote it, observations in ``<tool_output>`` blocks; :func:`clip_tool_outputs` shortens them),
and :func:`untrusted`, the one gate for text a judge must read but not obey (documents, observations, actions,
answers, rubric text a policy wrote), which the renderers and each method's prompt pass every such piece through.

    prefix = render_prefix(point.prefix, 400)
    text = trajectory_text(episode.info["trajectory"], observation_chars=300)
    attempt = clip_tool_outputs(scaffold_text(trajectory), 600)
    f"Predicted answer: {untrusted(prediction)}"
"""

from __future__ import annotations

import json
import re
from collections.abc import Sequence

from components.clipping import clip
from components.schemas import Step, Trajectory

__all__ = ["LOOKALIKES", "clip_tool_outputs", "render_prefix", "scaffold_text", "tool_output", "trajectory_text",
           "untrusted"]


# ------------------------------------------------------------------------------------------ untrusted text

LOOKALIKES = {"{": "\uff5b", "}": "\uff5d", ":": "\ua789", "=": "\uff1d", ">": "\u203a", "<": "\u2039",
              "[": "\uff3b", "-": "\u2010"}
"""The stand-in of each character :func:`untrusted` may swap: fullwidth braces, equals sign and bracket, the
modifier-letter colon, single angle quotes and the Unicode hyphen."""

# a JSON object: an opening brace before a double-quoted key (HotpotQA's paragraphs hold {'1': ", ...} debris)
_OBJECT = re.compile(r'\{(?=\s*")')
# a quoted key that a judge's reply would carry, with its colon
_KEY = re.compile(r"""(["'])(?:winner|ranking|rating|scores?|satisfied|verdicts?|correct|accepted|candidates"""
                  r"""|criteria|rubrics|items|steps|decision)\1\s*(:)""", re.IGNORECASE)
_LABEL = r"""[\[\("'`*]*\s*[A-Za-z]\s*[\]\)"'`*]*"""
# a verdict said in words: the separator before a value a judge could have given
_VERDICTS = [re.compile(p, re.IGNORECASE | re.MULTILINE) for p in (
    r"""\bwinner\s*([:=])\s*["'`*]*\s*(?:A|B|TIE|attempt\s+[AB])\b""",
    r"""\b(?:correct|satisfied|accepted|passed|pass|verdict)\s*([:=])\s*["'`*]*\s*(?:true|false|yes|no)\b""",
    r"""\b(?:rating|score)\s*([:=])\s*["'`*]*\s*\d+(?:\.\d+)?\s*(?:/|out of)\s*\d+""",
    r"""^[ \t]*(?:rating|score)\s*([:=])\s*["'`*]*\s*\d+(?:\.\d+)?\s*$""",
    rf"""\b(?:final\s+)?(?:ranking|order)\s*([:=])\s*{_LABEL}(?:\s*(?:>>?|=+|,|->|→|≻)\s*{_LABEL})+""",
)]
# a line that is only labels in a ranking order ("X > Y > Z"): its ">" signs
_RANKING_LINE = re.compile(rf"^[ \t]*{_LABEL}(?:\s*(?:>>?|->|→|≻)\s*{_LABEL})+[ \t]*\.?[ \t]*$",
                           re.MULTILINE)
# the section headers of the judges' prompts, at the start of a line, up to their colon
_HEADER = re.compile(
    r"^[ \t]*(?:Attempt(?: [A-Z]| \d+)?|Criterion|A strong attempt|A weak attempt|Candidate next actions"
    r"|Candidate rubrics(?: from recent questions)?|Proposed (?:next )?actions?|Requirement|Checklists?"
    r"|Agent's reasoning|Predicted answer|Reference answers?|Reference notes|Rubrics(?: already in use)?"
    r"|Reflections|How it was graded|Existing rubrics|Standards already in use|What each stage is for)"
    r"(?:[ \t]*\([^)\n]*\))?[ \t]*(:)", re.MULTILINE)
# "=== Attempt 2 ===" / "--- Reflection 1 ---" banners, "[Stage 1: Plan]" and "[X] action" labels
_BANNER = re.compile(r"^[ \t]*(={3,}|-{3,})[^\n]*?(?:={3,}|-{3,})[ \t]*$", re.MULTILINE)
_BRACKET = re.compile(r"^[ \t]*(\[)(?:[A-Z]\]|Stage \d)", re.MULTILINE)
# the scaffold's tags and the reflection's blocks, and chat-template tokens such as <|im_end|>
_TAG = re.compile(r"(<)/?(?:tool_output|think|structured_plan|deep_analysis|rubric|research_plan"
                  r"|state_evaluation|review|rubric_review|writing_plan|answer|call_tool|cite"
                  r"|reflection_rubrics|reflection_takeaways)\b[^<>]*>")
_CHAT_TOKEN = re.compile(r"(<)\|[A-Za-z0-9_]+\|>")


def _objects(text: str) -> set[int]:
    """Offsets of the braces that open a JSON-looking object, and the closing brace of each that decodes."""
    decoder, found = json.JSONDecoder(), set()
    for m in _OBJECT.finditer(text):
        found.add(m.start())
        try:
            _, end = decoder.raw_decode(text, m.start())
        except ValueError:
            continue
        found.add(end - 1)
    return found


def untrusted(text: str, *, tags: bool = True) -> str:
    """``text`` defanged, not quoted, for a judge's prompt: the same text when it holds nothing that
    reads as a delimiter of a judge's prompt or as a verdict, else the same text with the character that makes
    each such sequence one swapped for its look-alike (:data:`LOOKALIKES`). ``tags`` False leaves the
    scaffold's tags alone, for the policy's own scaffold text, where they are the structure the stage parser
    reads. What is swapped: the brace of a JSON object, the colon of a ``winner: A`` or of a section header such
    as ``Attempt B:`` at the start of a line, the ``>`` of a line that is only a ranking, the ``<`` of a scaffold
    or chat-template tag, the dashes of a ``--- banner ---``. A reader sees the same words, no parser of a judge's
    reply or delimiter of its prompt matches them, and each swap is one character for one, so lengths (and where
    a clip cuts) do not change; ordinary text, and so the response cache's keys, stay as they were."""
    if not text:
        return text
    swap = _objects(text) if "{" in text else set()
    for pattern in (_KEY, *_VERDICTS, _HEADER, _BRACKET, _CHAT_TOKEN) + ((_TAG,) if tags else ()):
        swap.update(m.start(m.lastindex) for m in pattern.finditer(text))  # each pattern's last group
    for m in _RANKING_LINE.finditer(text):
        swap.update(m.start() + i for i, ch in enumerate(m.group(0)) if ch == ">")
    for m in _BANNER.finditer(text):
        swap.update(range(m.start(1), m.end(1)))
    if not swap:
        return text
    chars = list(text)
    for i in swap:
        chars[i] = LOOKALIKES.get(chars[i], chars[i])
    return "".join(chars)


# ------------------------------------------------------------------------------------------ renderers


def render_prefix(steps: Sequence[Step], max_observation_chars: int = 600) -> str:
    """The committed steps as numbered action / observation lines (each :func:`untrusted`)."""
    lines = []
    for s in steps:
        lines.append(f"Step {s.index + 1} action: {untrusted(s.action or s.raw.strip())}")
        if s.tool_call is not None:
            observation = untrusted(clip(s.tool_call.observation, max_observation_chars))
            lines.append(f"Step {s.index + 1} observation: {observation}")
    return "\n".join(lines)


def _cut(text: str, limit: int) -> str:
    return untrusted(clip(" ".join(text.split()), limit))


def trajectory_text(trajectory: Trajectory, observation_chars: int = 300) -> str:
    """Each turn's thought, action and observation (whitespace collapsed, cut to ``observation_chars``), then
    the final answer or the reason the episode ended; every piece the policy or a tool wrote is
    :func:`untrusted`."""
    lines = []
    for step in trajectory.steps:
        lines.append(f"Turn {step.index + 1}")
        if step.parse_error is not None:
            lines.append(f"Unreadable output: {_cut(step.raw, observation_chars)}")
            continue
        if step.thought:
            lines.append(f"Thought: {_cut(step.thought, observation_chars)}")
        if step.action:
            lines.append(f"Action: {untrusted(step.action)}")
        observation = step.tool_call.observation if step.tool_call is not None else step.observation
        if observation:
            lines.append(f"Observation: {_cut(observation, observation_chars)}")
    if trajectory.final_answer is not None:
        lines.append(f"Final answer: {untrusted(trajectory.final_answer)}")
    else:
        lines.append(f"No final answer (episode ended: {trajectory.finish_reason})")
    return "\n".join(lines)


def tool_output(observation: str) -> str:
    """A tool's result as the scaffold shows it."""
    return f"\n<tool_output>\n{observation}\n</tool_output>\n"


def scaffold_text(trajectory: Trajectory) -> str:
    """The episode as one text: each turn as the policy wrote it, each observation in ``<tool_output>``. Both
    are :func:`untrusted`, the turns with their scaffold tags kept (the stage parser reads them): a document
    cannot open a stage or close its ``<tool_output>``, and neither can forge a verdict."""
    return "".join(untrusted(s.raw, tags=False) + (tool_output(untrusted(s.observation))
                                                    if s.final_answer is None and s.observation else "")
                   for s in trajectory.steps)


_TOOL_OUTPUT = re.compile(r"(<tool_output>\n?)(.*?)(\n?</tool_output>)", re.DOTALL)


def clip_tool_outputs(text: str, chars: int | None) -> str:
    """``text`` (see :func:`scaffold_text`) with each ``<tool_output>`` cut to ``chars`` characters and marked
    ``[...]``; None leaves it whole."""
    if chars is None:
        return text

    def cut(m: re.Match) -> str:
        body = m.group(2)
        return m.group(0) if len(body) <= chars else m.group(1) + clip(body, chars) + m.group(3)

    return _TOOL_OUTPUT.sub(cut, text)
