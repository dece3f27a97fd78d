"""The judge bench's Co-ReAct verifier (both forms) and RubricEM stage judge: their units from a small trajectory
set, their asks through each method's own prompts and parsers, and their summaries against the oracle, with
scripted judges that answer right, or the opposite (no real model). Run:

    .venv/bin/python -m pytest -q tests/judges/test_bench_verifier_stages.py
"""

from __future__ import annotations

import json
import re

import pytest

from components.judges.render import scaffold_text
from components.llm.backends.scripted import ScriptedChatModel
from components.methods.coreact.bench import VERIFIER_CHECKLIST
from components.methods.rubricem.bench import stage_comparisons
from components.methods.rubricem.scaffold_episode import scaffold_episode
from components.methods.rubricem.scaffold_format import STAGES, split_stages
from components.methods.rubricem.stagewise_judge import STAGE_NAMES, render_attempt
from tests.judges.conftest import run

# ------------------------------------------------------------------------------------------------ verifier


def test_verifier_units_are_the_distinct_tool_actions_labelled_by_a_new_gold_fact(items, params, judgments):
    units = judgments["coreact_verifier"].units(items, params)
    assert all(u.data["action"].startswith(("search[", "browse[")) for u in units)   # never a finish
    keys = [(u.slate, u.data["prefix"], u.data["action"]) for u in units]
    assert len(keys) == len(set(keys))
    for u in units:   # an irrelevant search is the only action of the set that finds no gold fact
        assert u.label["label"] == (u.label["variant"] != "irrelevant_search")
    assert sum(not u.label["label"] for u in units) == sum(i.variant == "irrelevant_search" for i in items)
    modes = ["text", "probability", "reference"]
    assert judgments["coreact_verifier"].modes(modes) == ["text", "probability"]
    assert judgments["coreact_verifier_checklist"].modes(modes) == ["text"]


def _detours(units) -> set[str]:
    return {u.data["action"] for u in units if not u.label["label"]}


@pytest.mark.parametrize("form", ["coreact_verifier", "coreact_verifier_checklist"])
@pytest.mark.parametrize("right", [True, False])
def test_verifier_asks_the_verifiers_own_prompt_and_scores_it(items, params, judgments, form, right):
    j = judgments[form]
    units = j.units(items, params)
    detours = _detours(units)

    def reply(messages, sampling):
        text = messages[-1].content
        marker = "Proposed next action: " if form == "coreact_verifier" else "Proposed action: "
        action = text.split(marker)[1].split("\n")[0]
        meets = (action not in detours) == right
        if form == "coreact_verifier":
            return "yes" if meets else "no"
        return json.dumps({"verdicts": [{"satisfied": meets, "reason": "r"}] * len(VERIFIER_CHECKLIST.criteria)})

    rows = run(j, ScriptedChatModel(reply), units, params)
    calls = len(VERIFIER_CHECKLIST.criteria) if form == "coreact_verifier" else 1
    assert all(r["calls"] == calls for r in rows)   # the verification's calls reach the bench's tally
    s = j.summary(rows, 0)
    assert s["failure_rate"] == 0 and s["accuracy_n"] == len(units)
    if right:
        assert s["accuracy"] == 1.0 and s["auc"] == 1.0
    else:
        assert s["accuracy"] == 0.0 and s["auc"] == 0.0
    cells = j.per_variant(rows)
    assert cells["irrelevant_search"].startswith(f"accepts {0 if right else 3}/3")


def test_a_verifier_reply_that_is_no_verdict_is_a_failure_not_a_rejection(items, params, judgments):
    j = judgments["coreact_verifier_checklist"]
    units = j.units(items, params)[:2]
    rows = run(j, ScriptedChatModel(lambda m, s: "the action looks fine"), units, params)
    assert all(r["verdict"] is None and r["accepted"] is None and r["failure"] for r in rows)
    s = j.summary(rows, 0)
    assert s["failure_rate"] == 1.0 and s["accuracy"] is None and s["accuracy_n"] == 0


# ------------------------------------------------------------------------------------------------ stage judge


def test_scaffold_episodes_change_only_the_stages_a_perturbation_touches(items):
    touched = {"wrong_answer": {"review", "answer"}, "skip_hop": {"research", "review"},
               "irrelevant_search": {"research"}}
    gold = {i.question.id: split_stages(scaffold_text(scaffold_episode(i.question, i.trajectory,
                                                                       i.labels["hop_steps"]))).blocks
            for i in items if i.variant == "gold"}
    assert all(b[s] is not None for b in gold.values() for s in STAGES)
    for i in items:
        episode = scaffold_episode(i.question, i.trajectory, i.labels["hop_steps"])
        assert [s.observation for s in episode.steps] == [s.observation for s in i.trajectory.steps]
        blocks, g = split_stages(scaffold_text(episode)).blocks, gold[i.question.id]
        if i.variant == "truncated":
            assert blocks["review"] is None and blocks["answer"] is None
            continue
        differ = {s for s in STAGES if blocks[s] != g[s]}
        assert differ == touched.get(i.variant, set()), i.variant
        if i.variant == "wrong_answer":
            assert f"<answer>{i.trajectory.final_answer}</answer>" in blocks["answer"]
        if i.variant == "skip_hop":
            assert "not found in what I read" in blocks["review"]


def _stage_judge(gold_texts: set[str], right: bool):
    """Writes one positive rubric per stage; scores an attempt's stage 2 when its text is a gold episode's (0
    otherwise), or the opposite when not ``right``."""
    def stage_of(block_text: str) -> dict[int, str]:
        parts = re.split(r"^\[Stage (\d): \w+\]\n", block_text, flags=re.MULTILINE)
        return {int(parts[n]) - 1: parts[n + 1].strip() for n in range(1, len(parts), 2)}

    def score(attempt: str, stage: int) -> int:
        good = stage_of(attempt)[stage] in gold_texts
        return 2 if good == right else 0

    def reply(messages, sampling):
        system, text = messages[0].content, messages[-1].content
        if "You write grading rubrics" in system:
            return json.dumps({f"stage_{k + 1}": {"positive_rubrics": [{"title": f"good {name}", "description": "d",
                                                                        "weight": 2}], "negative_rubrics": []}
                               for k, name in enumerate(STAGE_NAMES)})
        rubric_stages = [int(s) - 1 for s in re.findall(r"^\d+\. \[POSITIVE, stage (\d)", text, re.MULTILINE)]
        attempts = re.split(r"^=== Attempt [A-Z] ===\n", text.split("\n\nRubrics:")[0], flags=re.MULTILINE)[1:]
        if "You grade several attempts" in system:
            return json.dumps({"scores": [[score(a, k) for a in attempts] for k in rubric_stages]})
        attempt = text.split("The attempt, by stage:\n")[1].split("\n\nRubrics:")[0]
        return json.dumps({"scores": [{"index": n, "justification": "j", "score": score(attempt, k)}
                                      for n, k in enumerate(rubric_stages)]})

    return reply


@pytest.mark.parametrize("scoring", ["group", "trajectory"])
@pytest.mark.parametrize("right", [True, False])
def test_stage_judge_scores_gold_above_its_twin_on_the_touched_stages(items, params, judgments, scoring, right):
    j = judgments["rubricem_stage_scores"]
    params = params.model_copy(update={"rubricem": params.rubricem.model_copy(update={"judge_scoring": scoring})})
    units = j.units(items, params)
    assert len(units) == sum(i.variant != "gold" for i in items)
    assert {u.label["gold_first"] for u in units} == {True, False}   # the generation call sees both orders
    by_variant = {u.label["variant"]: u.label for u in units}
    assert [STAGES[k] for k in by_variant["wrong_answer"]["expected"]] == ["review", "answer"]
    assert [STAGES[k] for k in by_variant["irrelevant_search"]["expected"]] == ["research"]
    gold_texts = set()
    for i in items:
        if i.variant == "gold":
            rendered = render_attempt(split_stages(scaffold_text(scaffold_episode(
                i.question, i.trajectory, i.labels["hop_steps"]))).blocks, params.rubricem.stage_chars)
            gold_texts |= {t.strip() for t in re.split(r"^\[Stage \d: \w+\]\n", rendered, flags=re.MULTILINE)[1:]}
    rows = run(j, ScriptedChatModel(_stage_judge(gold_texts, right)), units, params)
    assert all(r["failure"] is None for r in rows)
    assert all(r["calls"] == 3 for r in rows)   # generation, then 2 orders (group) or 2 attempts (trajectory)
    s = j.summary(rows, 0)
    n = sum(len(u.label["expected"]) for u in units)
    assert s["accuracy_n"] == n and s["failure_rate"] == 0
    assert (s["accuracy"], s["auc"]) == ((1.0, 1.0) if right else (0.0, 0.0))
    assert s["unchanged_equal"] == 1.0                     # identical stage text, identical scores
    if scoring == "group":   # it tracks the attempts, never the position it is shown at
        assert s["position_effect"] == pytest.approx(0.0) and s["attempt_effect"] > 0.25
    else:
        assert s["position_effect"] is None
    cell = j.per_variant(rows)["wrong_answer"]
    assert cell.startswith("gold above: review 1.00" if right else "gold above: review 0.00")
    # the method's own answer stage carries the token-F1 rubric (weight 3, F1 1 for gold); the compared scores
    # leave it out: gold's answer rubric (weight 2) scored 0 by the opposite judge is 0, with the F1 it is 0.6
    wrong = next(r for r in rows if r["variant"] == "wrong_answer")
    assert (wrong["stage_scores"]["gold"][3], wrong["method_scores"]["gold"][3]) == \
        ((1.0, 1.0) if right else (0.0, pytest.approx(0.6)))


def test_a_failed_stage_judgment_is_a_failure_and_not_compared(items, params, judgments):
    j = judgments["rubricem_stage_scores"]
    units = j.units(items, params)[:2]
    rows = run(j, ScriptedChatModel(lambda m, s: "I cannot grade this"), units, params)
    assert all(r["failure"] and r["failure"].startswith("rubric generation failed") for r in rows)
    assert stage_comparisons(rows) == [] and j.summary(rows, 0)["failure_rate"] == 1.0
