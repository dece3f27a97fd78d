"""Hand-made episodes and scripted LLM roles for the ARBOR tests.

Each trajectory carries ``quality=N`` in its turn; the scripted pairwise judge prefers the higher quality
(equal: TIE), so every expected score can be worked out by hand from the graph."""

from __future__ import annotations

import json
import re

import numpy as np

from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import TransientLLMError
from components.schemas import Question, Step, Trajectory
from components.training.grpo.episodes import Episode

Q0 = Question(id="q0", question="Who directed Nightfall Harbor?", answers=["Ossian Threll"], source="world")
Q1 = Question(id="q1", question="Where was Ossian Threll born?", answers=["Kestrow"], source="world")
RUBRIC = {"title": "Follows the chain", "description": "Each query uses the name the last result gave.",
          "counter_description": "Queries ignore what the results said."}
COMMON = {"title": "Targets one entity per query", "description": "Searches one named entity at a time.",
          "counter_description": "Searches vague or compound phrases."}


def episode(group: int, answer: str | None, quality: int, question: Question = Q0, valid: bool = True,
            length: int = 10) -> Episode:
    step = Step(index=0, raw=f"quality={quality}", thought=f"quality={quality}", action="search[x]",
                parse_error=None if valid else "no action line")
    t = Trajectory(question_id=question.id, question=question.question, steps=[step], final_answer=answer,
                   finish_reason="answer" if answer else "max_turns")
    return Episode(prompt=question, group=group, rows=[], text="x" * length, info={"trajectory": t})


def qualities(user_text: str) -> tuple[int, int]:
    a = re.search(r"Attempt A:\n.*?quality=(\d+)", user_text, re.DOTALL)
    b = re.search(r"Attempt B:\n.*?quality=(\d+)", user_text, re.DOTALL)
    return int(a.group(1)), int(b.group(1))


class QualityJudge(ScriptedChatModel):
    """Prefers the higher quality; ``fail(qa, qb)`` -> 'error' (a failed call) or 'junk' (an unreadable reply)."""

    def __init__(self, fail=lambda qa, qb: None):
        self.seen: list[tuple[int, int]] = []

        def respond(messages, sampling):
            qa, qb = qualities(messages[-1].content)
            self.seen.append((qa, qb))
            kind = fail(qa, qb)
            if kind == "error":
                return TransientLLMError("judge down")
            if kind == "junk":
                return "I am not sure."
            return json.dumps({"winner": "A" if qa > qb else "B" if qb > qa else "TIE"})

        super().__init__(respond, name="judge")


def writer(payload: dict | None = None, fail: bool = False) -> ScriptedChatModel:
    """An inducer / consolidator that always writes the same rubric list (or always fails)."""
    reply = TransientLLMError("down") if fail else json.dumps({"rubrics": [payload or RUBRIC]})
    return ScriptedChatModel(lambda messages, sampling: reply, name="writer")


class FakeEncoder:
    """A sentence-transformers stand-in: a distinct axis per distinct text."""

    def __init__(self):
        self.axes: dict[str, int] = {}

    def encode(self, texts):
        out = np.zeros((len(texts), 16), dtype=np.float32)
        for row, t in enumerate(texts):
            out[row, self.axes.setdefault(t, len(self.axes))] = 1.0
        return out
