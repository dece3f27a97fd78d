"""Oracle trajectories over generated worlds: every question of every type becomes a valid, grounded,
correct episode through the real tools, in the agent's own format, in both retrieval scopes."""

import asyncio
import collections

import pytest

from components.agents.params import AgentParams
from components.agents.parsing import parse_turn
from components.evaluation.metrics import exact_match, normalize_answer
from components.retrieval.bm25 import BM25Index
from components.retrieval.scope import world_question_paragraphs
from components.retrieval.tools import make_toolbox
from components.warmstart.oracle import OracleEpisodeError, oracle_trajectory
from components.warmstart.rejection import problems
from components.world import QUESTION_TYPES, generate_world

SETTINGS = AgentParams(max_turns=6, max_search_calls=5, observation_max_chars=1200)  # params.yaml's budgets


def world_and_tools(seed: int, scope: str, snippet_chars: int = 300, n_questions: int = 80):
    world = generate_world(seed=seed, n_people=80, n_films=30, n_cities=20, n_companies=15, distractors_per_entity=1,
                           question_mix=None, n_questions=n_questions)
    tools = make_toolbox(BM25Index(world.documents), world.documents, snippet_chars=snippet_chars, scope=scope)
    return world_question_paragraphs(world), tools


def run(question, tools, settings=SETTINGS):
    return asyncio.run(oracle_trajectory(question, tools.for_question(question), settings))


@pytest.mark.parametrize("scope", ["corpus", "question"])
@pytest.mark.parametrize("seed", [0, 1])
def test_every_question_yields_a_valid_grounded_correct_episode(seed, scope):
    questions, tools = world_and_tools(seed, scope)
    types = collections.Counter()
    for q in questions:
        t = run(q, tools)
        types[q.type] += 1
        assert t.finish_reason == "answer" and exact_match(t.final_answer, q.answers) == 1.0
        assert problems(t, q, min_f1=1.0) == []
        for step in t.steps:  # every raw turn is the taught format and parses to the recorded action
            parsed = parse_turn(step.raw)
            assert step.raw.startswith("Thought: ") and "\nAction: " in step.raw and parsed.thought
            assert parsed.text == step.action and step.parse_error is None
        assert t.steps[-1].final_answer == q.answers[0] and all(s.tool_call for s in t.steps[:-1])
        assert t.n_tool_calls <= SETTINGS.max_search_calls and len(t.steps) <= SETTINGS.max_turns
        # the observations are the real tools' output, and every hop's answer is read in one of them
        seen = " ".join(s.observation for s in t.steps)
        for s in t.steps[:-1]:
            again = tools.for_question(q).call(s.tool_call.name, next(iter(s.tool_call.arguments.values())))
            assert s.observation == again.observation[: len(s.observation)] and s.tool_call.error is None
        assert all(hop.answer in seen for hop in q.gold_chain)
        if normalize_answer(q.answers[0]) not in ("yes", "no"):
            assert normalize_answer(q.answers[0]) in normalize_answer(seen)
        if scope == "question":
            assert set(t.docs_seen) <= set(q.metadata["paragraph_ids"])
    assert set(types) == set(QUESTION_TYPES)


def test_short_snippets_make_the_oracle_browse_exactly_when_the_fact_is_cut():
    questions, tools = world_and_tools(2, "corpus", snippet_chars=60, n_questions=40)
    roomy = AgentParams(max_turns=12, max_search_calls=10, observation_max_chars=1200)
    browses = 0
    for q in questions:
        t = run(q, tools, roomy)
        assert exact_match(t.final_answer, q.answers) == 1.0 and problems(t, q, 1.0) == []
        for prev, step in zip(t.steps, t.steps[1:]):
            if step.action.startswith("browse["):
                browses += 1
                doc_id = step.tool_call.arguments["doc_id"]
                assert doc_id in " ".join(s.observation for s in t.steps[: step.index])  # an id it was shown
                hop = next(h for h in q.gold_chain if h.doc_id == doc_id and h.answer in step.observation)
                shown = [line for s in t.steps[: step.index] if s.action.startswith("search[")
                         for line in s.observation.splitlines() if f"({doc_id})" in line]
                assert shown and not any(hop.answer in line for line in shown)  # the snippet was cut before it
    assert browses >= len(questions) // 2


def test_thoughts_are_written_from_the_facts_in_varied_wording():
    questions, tools = world_and_tools(3, "corpus", n_questions=60)
    openings, facts_stated = set(), 0
    for q in questions:
        t = run(q, tools)
        openings.add(t.steps[0].thought.split(" ")[0])
        later = " ".join(s.thought for s in t.steps[1:])
        facts_stated += all(h.answer in later for h in q.gold_chain)
    assert len(openings) >= 3                     # several phrasings of the first thought
    assert facts_stated == len(questions)         # every hop's answer is stated in a later thought


def test_a_budget_too_small_is_refused_not_truncated():
    questions, tools = world_and_tools(0, "corpus", n_questions=40)
    tight = AgentParams(max_turns=6, max_search_calls=1, observation_max_chars=1200)
    kinds = collections.Counter()
    for q in questions:
        try:
            run(q, tools, tight)
        except OracleEpisodeError as exc:
            kinds[exc.kind] += 1
    assert kinds["over_budget"] >= 10 and set(kinds) == {"over_budget"}


def test_a_search_outranked_by_look_alikes_is_refined_with_the_kind_of_entity():
    # seed 1: "Corumbre Pictures" and "Corumbre Productions" outrank the city Corumbre for search[Corumbre]
    questions, tools = world_and_tools(1, "corpus")
    refined = []
    for q in questions:
        t = run(q, tools)
        for prev, step in zip(t.steps, t.steps[1:]):
            query = prev.tool_call.arguments.get("query") if prev.tool_call else None
            if query and step.action in (f"search[{query} {kind}]" for kind in ("city", "film", "company")):
                gold = {h.doc_id for h in q.gold_chain}
                assert not gold & set(prev.tool_call.doc_ids) and gold & set(step.tool_call.doc_ids)
                refined.append(step.action)
    assert "search[Corumbre city]" in refined


def test_thoughts_plan_the_chain_count_its_facts_and_never_name_an_answer_before_it_is_found():
    questions, tools = world_and_tools(3, "corpus", n_questions=60)
    for q in questions:
        t = run(q, tools)
        n = len(q.gold_chain)
        first, last = t.steps[0].thought, t.steps[-1].thought
        assert f" {n} facts" in first and f"{n}) " in first and f"{n + 1}) " not in first
        hidden = {h.answer for h in q.gold_chain} - {w for w in q.answers if w in q.question}
        assert not any(a in first for a in hidden if a not in q.question)  # the plan writes "that person"
        assert f" {n} facts" in last and f"of {n}" in last  # the last fact counted, all found
        for step in t.steps[1:-1]:
            assert f"all {n} facts" not in step.thought.lower() and "last of the" not in step.thought
