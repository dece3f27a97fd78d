"""Gold-chain rubrics (components/methods/coreact/oracle_rubrics.py): the ceiling of the rubric reward and the target of the
generator's oracle warm start. The rubric names the first hop whose answer the history has not shown, and the final
answer once every hop's answer has been shown; the warm start's rows are the generator's own prompt and that rubric."""

import json

from components.methods.coreact.oracle_rubrics import oracle_rubric, trajectory_points, warm_start_rows
from components.methods.coreact.rubric_generator import parse_rubric
from components.schemas import BranchingPoint, Question, Step, SubQuestion, ToolCall, Trajectory

QUESTION = Question(id="q1", question="Where was the director of Nightfall Harbor born?", answers=["Velmoor"],
                    source="world", gold_chain=[SubQuestion(question="Who directed Nightfall Harbor?", answer="Ossian Threll"),
                                                SubQuestion(question="Where was Ossian Threll born?", answer="Velmoor")])


def point(*observations, question_id="q1"):
    prefix = [Step(index=i, action=f"search[x{i}]", observation=o,
                   tool_call=ToolCall(name="search", arguments={"query": f"x{i}"}, observation=o))
              for i, o in enumerate(observations)]
    return BranchingPoint(question_id=question_id, question=QUESTION.question, depth=len(prefix), prefix=prefix)


def criteria(*observations):
    return [c["criterion"] for c in json.loads(oracle_rubric(point(*observations), QUESTION))["criteria"]]


def test_oracle_rubric_follows_the_hops_the_history_has_shown():
    assert criteria() == ["Looks up the fact: Who directed Nightfall Harbor?", "Does not give a final answer yet"]
    assert criteria("Nightfall Harbor is a film by OSSIAN THRELL.") == [
        "Looks up the fact: Where was Ossian Threll born?", "Does not give a final answer yet"]
    assert criteria("... Ossian Threll ...", "He was born in Velmoor.") == ["Gives the final answer Velmoor"]


def render(messages, add_generation_prompt):
    text = "".join(f"<{m.role}>{m.content}</{m.role}>" for m in messages)
    return text + "<assistant>" if add_generation_prompt else text


def test_warm_start_rows_pair_the_generators_prompt_with_the_oracle_rubric():
    long_hop = QUESTION.model_copy(update={"id": "q-long", "gold_chain": [
        SubQuestion(question="Which " + "very " * 40 + "long question?", answer="x")]})
    no_chain = QUESTION.model_copy(update={"id": "q-none", "gold_chain": []})
    questions = {q.id: q for q in (QUESTION, long_hop, no_chain)}
    points = [point(), point("Nightfall Harbor is a film by Ossian Threll."), point(),  # the third repeats the first
              point(question_id="q-long"), point(question_id="q-none"), point(question_id="q-unknown")]
    rows, skipped = warm_start_rows(points, questions, render, max_criteria=4, max_chars=160)
    assert skipped == {"duplicate": 1, "rubric_too_long": 1, "no_gold_chain": 2}
    assert len(rows) == 2
    for row, p in zip(rows, points[:2]):
        (prompt, trained_prompt), (reply, trained_reply) = row
        assert not trained_prompt and trained_reply
        assert prompt.startswith("<system>") and prompt.endswith("<assistant>") and QUESTION.question in prompt
        assert reply == oracle_rubric(p, QUESTION) + "</assistant>"  # the template's closing: the model learns to stop
        assert parse_rubric(reply.removesuffix("</assistant>"), 4, max_chars=160).exact
    assert "Who directed" in rows[0][1][0] and "Where was Ossian Threll born" in rows[1][1][0]
    assert "Ossian Threll" in rows[1][0][0]  # the history the generator reads the next hop from


def test_a_trajectory_gives_one_point_per_action_choice():
    hops = point("Nightfall Harbor is a film by Ossian Threll.", "Ossian Threll was born in Velmoor.").prefix
    episode = Trajectory(question_id="q1", question=QUESTION.question,
                         steps=[*hops, Step(index=2, action="finish[Velmoor]", final_answer="Velmoor")])
    points = trajectory_points(episode)
    assert [p.depth for p in points] == [0, 1, 2] and [len(p.prefix) for p in points] == [0, 1, 2]
    rubrics = [json.loads(oracle_rubric(p, QUESTION))["criteria"][0]["criterion"] for p in points]
    assert rubrics == ["Looks up the fact: Who directed Nightfall Harbor?",
                       "Looks up the fact: Where was Ossian Threll born?", "Gives the final answer Velmoor"]
