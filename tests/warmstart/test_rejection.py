"""Rejection sampling on hand-made trajectories: one test per reason, and what a kept episode carries."""

import pytest

from components.agents.parsing import parse_turn
from components.schemas import Question, Step, ToolCall, Trajectory
from components.warmstart.rejection import REASONS, grounded, problems, select

Q = Question(id="q1", question="In which city was the director of Nightfall Harbor born?", answers=["Vantor"],
             source="world")
YESNO = Question(id="q2", question="Were Mara Quill and Ossian Threll born in the same country?", answers=["no"],
                 source="world")
OBS = {
    "Nightfall Harbor": "[1] (d1) Nightfall Harbor: Nightfall Harbor is a 1998 film directed by Mara Quill.",
    "Mara Quill": "[1] (d2) Mara Quill: Mara Quill is a director born in the city of Vantor.",
    "Ossian Threll": "[1] (d3) Ossian Threll: Ossian Threll was born in Kestrow.",
}


def episode(*raws: str, question: Question = Q, finish_reason: str = "answer", **metadata) -> Trajectory:
    """A trajectory as the agent records it: tool turns get their observation, a finish turn ends it."""
    steps, answer = [], None
    for i, raw in enumerate(raws):
        parsed = parse_turn(raw)
        step = Step(index=i, raw=raw, thought=parsed.thought, action=parsed.text, parse_error=parsed.error)
        if parsed.kind == "finish":
            step.final_answer = answer = parsed.argument
        elif parsed.kind == "search":
            text = OBS.get(parsed.argument, f"No results for {parsed.argument!r}. Try other keywords.")
            step.tool_call = ToolCall(name="search", arguments={"query": parsed.argument}, observation=text)
            step.observation = text
        elif parsed.kind == "invalid":
            step.observation = "I could not read an action in your reply."
        steps.append(step)
    if finish_reason != "answer":
        answer = metadata.pop("forced", None)
        metadata = {"forced_answer": True} if answer is not None else metadata
    return Trajectory(question_id=question.id, question=question.question, steps=steps, final_answer=answer,
                      finish_reason=finish_reason, metadata=metadata)


GOOD = ("Thought: I need the director of Nightfall Harbor.\nAction: search[Nightfall Harbor]",
        "Thought: Mara Quill directed it. Where was she born?\nAction: search[Mara Quill]",
        "Thought: She was born in Vantor.\nAction: finish[Vantor]")


def reasons(t: Trajectory, q: Question = Q, min_f1: float = 1.0) -> list[str]:
    return [r for r, _ in problems(t, q, min_f1)]


def test_a_good_episode_is_kept_with_its_source():
    kept, rejected = select([(episode(*GOOD), Q, "teacher")], min_f1=1.0)
    assert rejected == [] and len(kept) == 1
    assert kept[0].metadata == {"source": "teacher", "sample": 0} and kept[0].final_answer == "Vantor"


def test_llm_failure():
    t = episode(GOOD[0], finish_reason="llm_failure", error="server down")
    assert reasons(t)[:2] == ["llm_failure", "no_answer"]


def test_no_answer_after_the_budget():
    t = episode(GOOD[0], GOOD[1], finish_reason="max_turns")
    assert reasons(t) == ["no_answer"]


def test_forced_answer_has_no_finish_turn_to_learn():
    t = episode(GOOD[0], GOOD[1], finish_reason="search_budget", forced="Vantor")
    assert t.final_answer == "Vantor" and reasons(t) == ["forced_answer"]  # correct and grounded, no finish turn


@pytest.mark.parametrize("bad_turn, why", [
    ("I think I should search.\nAction: search[Nightfall Harbor]", "not 'Thought"),        # no Thought: line
    ("Thought: two actions\nAction: search[Nightfall Harbor]\nAction: search[Mara Quill]", "not 'Thought"),
    ('Thought: json\n{"tool": "search", "query": "Nightfall Harbor"}', "not 'Thought"),     # parser accepts it
    ("Thought: \nAction: search[Nightfall Harbor]", "not 'Thought"),                        # empty thought
    ("Thought: what now", "no action found"),                                                # parse error
])
def test_format(bad_turn, why):
    t = episode(bad_turn, *GOOD[1:])
    found = problems(t, Q, 1.0)
    assert found[0][0] == "format" and why in found[0][1] and found[0][1].startswith("step 0")


def test_repeated_identical_call_ignores_case_and_spacing():
    t = episode(GOOD[0], "Thought: again\nAction: search[nightfall   HARBOR]", *GOOD[1:])
    found = problems(t, Q, 1.0)
    assert [r for r, _ in found] == ["repeated_call"] and "step 1 repeats step 0" in found[0][1]


def test_consecutive_tool_errors_are_a_scaffold_rule_not_a_react_one():
    """RubricEM B.2.3 filters its scaffold teacher data for two or more tool errors in a row; the ReAct warm
    start (no paper filters it that way) keeps such an episode when nothing else is wrong with it."""
    t = episode(GOOD[0], "Thought: Try a narrower query.\nAction: search[Nightfall Harbor 1998]",
                "Thought: And another one.\nAction: search[Nightfall Harbor film]", *GOOD[1:])
    for step in t.steps[1:3]:
        step.tool_call.error = "TimeoutError: retriever down"
    assert [s.tool_call is not None and s.tool_call.error is not None for s in t.steps] == [False, True, True,
                                                                                           False, False]
    assert reasons(t) == [] and "tool_errors" in REASONS


def test_wrong_answer_and_the_f1_threshold():
    t = episode(*GOOD[:2], "Thought: born in the city of Vantor.\nAction: finish[city of Vantor]")
    assert reasons(t, min_f1=1.0) == ["wrong_answer"]   # tokens city/of/vantor vs vantor: F1 = 2*(1/3)*1/(4/3) = 0.5
    assert reasons(t, min_f1=0.5) == []
    assert reasons(episode(*GOOD[:2], "Thought: guess\nAction: finish[Kestrow]")) == ["wrong_answer", "ungrounded"]


def test_ungrounded_correct_answer():
    t = episode(GOOD[0], "Thought: I just know it.\nAction: finish[Vantor]")
    assert reasons(t) == ["ungrounded"]


def test_yes_no_answers_need_a_tool_call_instead_of_a_quote():
    answered_blind = episode("Thought: surely not\nAction: finish[no]", question=YESNO)
    assert reasons(answered_blind, YESNO) == ["ungrounded"]
    looked = episode("Thought: first\nAction: search[Mara Quill]", "Thought: then\nAction: search[Ossian Threll]",
                     "Thought: Vantor vs Kestrow: different.\nAction: finish[no]", question=YESNO)
    assert reasons(looked, YESNO) == []


def test_grounding_needs_whole_words():
    t = episode("Thought: look\nAction: search[Mara Quill]", "Thought: hm\nAction: finish[Vant]",
                question=Q.model_copy(update={"answers": ["Vant"]}))
    assert not grounded("Vant", t) and grounded("vantor", t) and grounded("the city of Vantor", t)


def test_duplicates_of_kept_episodes_and_one_record_per_rejection():
    good, dup = episode(*GOOD), episode(*GOOD)
    wrong = episode(GOOD[0], "Thought: guess\nAction: finish[Kestrow]")
    kept, rejected = select([(good, Q, "teacher"), (wrong, Q, "teacher"), (dup, Q, "teacher")], min_f1=1.0)
    assert len(kept) == 1
    assert [(r.sample, r.reason) for r in rejected] == [(1, "wrong_answer"), (2, "duplicate")]
    assert rejected[0].reasons == ["wrong_answer", "ungrounded"] and rejected[0].gold == ["Vantor"]
    assert rejected[0].trajectory == wrong and "Kestrow" in rejected[0].detail
    # an episode equal to one kept earlier (e.g. the oracle's) is a duplicate too
    again, rej = select([(episode(*GOOD), Q, "teacher")], 1.0, kept_before=kept)
    assert again == [] and rej[0].reason == "duplicate"
    assert {r.reason for r in rejected} <= set(REASONS)
