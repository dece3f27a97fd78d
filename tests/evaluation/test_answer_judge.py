"""The answer judge is called only where string matching cannot decide; a failed call is unjudged (None)."""

from __future__ import annotations

import asyncio

from components.judges.answer import judge_answers
from components.llm.base import ChatModel, Completion, PermanentLLMError
from components.schemas import Question


class CountingJudge(ChatModel):
    name = "counting"

    def __init__(self, reply: str | None):
        self.reply, self.calls = reply, 0

    async def _complete(self, messages, sampling) -> Completion:
        self.calls += 1
        if self.reply is None:
            raise PermanentLLMError("judge down")
        return Completion(texts=[self.reply], model=self.name)


def test_exact_and_empty_answers_need_no_call_the_rest_are_judged():
    questions = [Question(id=f"q{i}", question="?", answers=["The Lantern"], source="world") for i in range(4)]
    judge = CountingJudge('{"correct": true}')
    verdicts = asyncio.run(judge_answers(judge, questions, ["the lantern", None, "  ", "Lantern film"]))
    assert verdicts == [True, False, False, True]
    assert judge.calls == 1  # only "Lantern film" needed the judge


def test_a_failed_judge_call_is_unjudged_not_wrong():
    questions = [Question(id="q", question="?", answers=["Ada"], source="world")]
    judge = CountingJudge(None)
    assert asyncio.run(judge_answers(judge, questions, ["Ada Lovelace"])) == [None]
