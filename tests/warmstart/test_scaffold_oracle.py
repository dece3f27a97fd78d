"""The world oracle in RubricEM's scaffold: every question of every type becomes an episode that passes the
scaffold's rejection checks (stage boundaries, tool syntax, citations, grounding) and answers correctly, the
plan names no answer it has not looked up, and the stage split finds all four stages."""

import asyncio
import collections
import random

import pytest

from components.judges.render import scaffold_text
from components.methods.rubricem.scaffold_format import STAGES, split_stages
from components.evaluation.metrics import exact_match
from components.schemas import Question, SubQuestion
from components.warmstart.oracle import oracle_trajectory, plan_turns
from components.warmstart.rejection import problems, select
from components.methods.rubricem.scaffold_oracle import planned_need, scaffold_replies
from components.world import QUESTION_TYPES
from tests.warmstart.test_oracle import SETTINGS, world_and_tools


def run(question, tools):
    return asyncio.run(oracle_trajectory(question, tools.for_question(question), SETTINGS, agent="scaffold",
                                         options={"max_tokens": 384}))


@pytest.mark.parametrize("scope", ["corpus", "question"])
def test_every_question_yields_a_valid_scaffold_episode(scope):
    questions, tools = world_and_tools(0, scope)
    types = collections.Counter()
    for q in questions:
        t = run(q, tools)
        types[q.type] += 1
        assert t.finish_reason == "answer" and exact_match(t.final_answer, q.answers) == 1.0
        assert problems(t, q, min_f1=1.0, agent="scaffold") == []
        split = split_stages(scaffold_text(t))
        assert split.present() == [True] * 4, (q.id, split.spans)
        plan = split.blocks["plan"]
        intermediate = [h.answer for h in q.gold_chain[:-1] if h.answer not in q.question]
        assert not [a for a in intermediate if a in plan], f"{q.id}: the plan names an answer it has not seen"
        review = split.blocks["review"]
        assert all(f'<cite id="{h.doc_id}">' in review for h in q.gold_chain)
    assert set(types) == set(QUESTION_TYPES)


def test_the_react_check_rejects_scaffold_turns_and_the_scaffold_check_accepts_them():
    questions, tools = world_and_tools(1, "corpus", n_questions=10)
    t = run(questions[0], tools)
    assert [r for r, _ in problems(t, questions[0], 1.0, agent="react")] == ["format"]
    kept, rejected = select([(t, questions[0], "oracle")], 1.0, agent="scaffold")
    assert len(kept) == 1 and not rejected


def test_a_broken_review_is_rejected_with_its_reason():
    questions, tools = world_and_tools(1, "corpus", n_questions=10)
    q = questions[0]
    t = run(q, tools)
    last = t.steps[-1]
    uncited = last.raw.replace('<cite id="', '<cite ref="')
    bad = t.model_copy(update={"steps": [*t.steps[:-1], last.model_copy(update={"raw": uncited})]})
    found = [r for r, _ in problems(bad, q, 1.0, agent="scaffold")]
    assert found and found[0] == "citation"
    unseen = last.raw.replace(f'<cite id="{q.gold_chain[0].doc_id}">', '<cite id="d999999">')
    bad = t.model_copy(update={"steps": [*t.steps[:-1], last.model_copy(update={"raw": unseen})]})
    assert "citation" in [r for r, _ in problems(bad, q, 1.0, agent="scaffold")]
    no_review = last.raw[: last.raw.index("<review>")] + last.raw[last.raw.index("<answer>"):]
    bad = t.model_copy(update={"steps": [*t.steps[:-1], last.model_copy(update={"raw": no_review})]})
    _, rejected = select([(bad, q, "teacher")], 1.0, agent="scaffold")
    assert rejected[0].reason == "stage_boundary"


def test_plan_items_name_earlier_items_not_their_answers():
    chain = [SubQuestion(question="Who directed the film The Glass Harbor?", answer="Torvel Ashmere", doc_id="d1"),
             SubQuestion(question="In which city was Torvel Ashmere born?", answer="Corumbre", doc_id="d2")]
    assert planned_need(chain, 0) == "the director of The Glass Harbor"
    assert planned_need(chain, 1) == "the birthplace of the person from item 1"


def test_replies_follow_the_planned_turns_one_to_one():
    questions, tools = world_and_tools(0, "corpus", n_questions=20)
    q: Question = questions[3]
    turns = plan_turns(q, tools.for_question(q), SETTINGS)
    replies = scaffold_replies(q, turns, random.Random(0))
    assert len(replies) == len(turns)
    assert "<structured_plan>" in replies[0] and replies[-1].endswith(f"<answer>{q.answers[0]}</answer>")
    assert all("<state_evaluation>" in r for r in replies[1:])
    assert STAGES == ("plan", "research", "review", "answer")


@pytest.mark.parametrize("history", ["scratchpad", "chat"])
def test_scaffold_sft_rows_train_every_reply_once_and_no_tool_output(history):
    """The sft stage's rows for a scaffold episode, under the scaffold agent's own prompts: each reply is
    trainable exactly once (with the end-of-turn mark), tool outputs and prompts never."""
    from components.methods.rubricem.scaffold_agent import ScaffoldAgent
    from components.training.sft.trajectories import trajectory_rows

    questions, tools = world_and_tools(0, "corpus", n_questions=10)
    q = questions[2]
    t = run(q, tools)

    def render(messages, generation):
        text = "".join(f"<|{m.role}|>{m.content}<|end|>" for m in messages)
        return text + ("<|assistant|>" if generation else "")

    agent = ScaffoldAgent(None, None, SETTINGS.model_copy(update={"history_format": history}), max_tokens=384)
    rows = trajectory_rows(agent, t, q, render)
    assert len(rows) == (1 if history == "chat" else len(t.steps))
    trained = [text for row in rows for text, trainable in row if trainable]
    assert trained == [s.raw.strip() + "<|end|>" for s in t.steps]
    assert not any("<tool_output>" in text for text in trained)
    untrained = "".join(text for row in rows for text, trainable in row if not trainable)
    assert "You work in four stages" in untrained and f"Question: {q.question}" in untrained
