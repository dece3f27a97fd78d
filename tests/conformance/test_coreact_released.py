"""Co-ReAct's rubric-generator reward under the paper profile beside the released code's, on the same rubrics and
rankings: the rank term, the weights, the judge's atomicity, the count-and-weights format, the 4-gram gate on the
whole reply, the rule for fewer than 2 criteria, the combined reward, and the sample std of the GRPO advantages.

The released reward is not a package: it is re-derived here from ZBWpro/Co-ReAct at ff5540a6
(``rubric_rl/reward_fn.py``, ``rubric_rl/rubric_judge.py``; lines cited at each function), and verl's GRPO
advantage from volcengine/verl at b178a3cd (``verl/trainer/ppo/core_algos.py``). The released generator writes
numbered lines (``1. [0.4] ...``) where ours writes JSON: each code is handed the same rubric (criteria and weights
as written) in its own format, and the judge's ranking is the order our evaluator's scores induce, ties shared.
Every check is float arithmetic on both sides (tolerance 1e-12); the named options that depart on purpose (the
embedded profile's) are recorded with ``conformance.differs``.

    .venv/bin/python -m pytest -q tests/conformance/test_coreact_released.py
"""

from __future__ import annotations

import asyncio
import json
import math
import re
import warnings
from collections import defaultdict

import pytest
import torch
from scipy.stats import spearmanr

from components.llm.backends.scripted import ScriptedChatModel
from components.methods.coreact.generator_reward import (
    RubricReward,
    format_term,
    listwise_rank_reward,
    repetition_rate,
)
from components.methods.coreact.rubric_generator import parse_rubric
from components.methods.coreact.rubric_training import generator_config
from components.params_load import load_params
from components.schemas import BranchingPoint, Candidate
from components.training.grpo.advantages import group_advantages

REPO = "ZBWpro/Co-ReAct@ff5540a6"
REWARD_FN = f"{REPO}:rubric_rl/reward_fn.py"
JUDGE = f"{REPO}:rubric_rl/rubric_judge.py"
VERL = "volcengine/verl@b178a3cd:verl/trainer/ppo/core_algos.py"
TOL = 1e-12

# ------------------------------------------------------------------------- the released code, re-derived

RELEASED_LINE = re.compile(r"\d+\.\s*\[([-\d.]+)\]\s*(.+)")  # reward_fn.py:47
RELEASED_WEIGHTS = {"rank": 0.75, "atomicity": 0.15, "format": 0.10}  # reward_fn.py:210-212 (THINK, FOCUS 0: 213-214)


def released_parse(text: str) -> list[tuple[float, str]]:  # reward_fn.py:50-60
    items = []
    for match in RELEASED_LINE.finditer(text):
        try:
            items.append((float(match.group(1)), match.group(2).strip()))
        except ValueError:
            continue
    return items


def released_format(text: str) -> float:  # reward_fn.py:75-95
    items = released_parse(text)
    if not items:
        return 0.0
    score = 0.5 if 3 <= len(items) <= 5 else 0.0
    if abs(sum(w for w, _ in items if w > 0) - 1.0) < 0.15:
        score += 0.5
    return score


def released_repeat_rate(text: str, n: int = 4) -> float:  # reward_fn.py:120-131, the rate is_repetitive compares
    words = re.findall(r"\w+", text.lower())
    if len(words) < n + 1:
        return 0.0
    grams = [tuple(words[i:i + n]) for i in range(len(words) - n + 1)]
    return 1.0 - len(set(grams)) / len(grams)


def released_is_repetitive(text: str) -> bool:  # reward_fn.py:120-132 (n=4, threshold 0.40)
    return released_repeat_rate(text) > 0.40


def released_atomicity(atomic_count: int | None, total: int) -> float:  # reward_fn.py:135-145
    if atomic_count is None or total <= 0:
        return 0.0
    return max(0, min(atomic_count, total)) / total


def released_borda_ranks(borda: dict[str, float]) -> list[float]:  # reward_fn.py:179-203 (lower Borda = better)
    labels = sorted(borda)
    scores = sorted(((borda[label], label) for label in labels), key=lambda x: x[0])
    ranks, i = {}, 0
    while i < len(scores):
        j = i
        while j < len(scores) and scores[j][0] == scores[i][0]:
            j += 1
        for k in range(i, j):
            ranks[scores[k][1]] = (i + 1 + j) / 2.0
        i = j
    return [ranks[label] for label in labels]


def released_judge_ranks(reply: str, n: int) -> list[float]:  # rubric_judge.py:157-178 (ties share the mean rank)
    items = json.loads(reply)["ranking"]
    ranks, current = [0.0] * n, 1
    for item in items:
        group = [str(x).strip().upper() for x in (item if isinstance(item, list) else [item])]
        for label in group:
            ranks[ord(label) - ord("A")] = current + (len(group) - 1) / 2.0
        current += len(group)
    return ranks


def released_rank_term(judge_ranks: list[float], borda: dict[str, float]) -> float:  # reward_fn.py:294-300
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # a tied ranking: scipy warns and returns NaN, which :297-300 handle
        rho, _ = spearmanr(judge_ranks, released_borda_ranks(borda))
    return 0.5 if math.isnan(rho) else (rho + 1.0) / 2.0  # :297 tests rho == rho


def released_score(solution: str, judge_reply: str | None, borda: dict[str, float]) -> float:
    """compute_score (reward_fn.py:221-316) with the judge's reply given; the think and focus terms weigh 0."""
    if released_is_repetitive(solution):  # :240
        return 0.0
    rubric_text = re.sub(r"</think>", "", re.sub(r"<think>.*?</think>", "", solution, flags=re.DOTALL)).strip()
    fmt = released_format(rubric_text)  # :258
    total_criteria = len(released_parse(rubric_text))  # :264-265
    rank = atom = 0.0
    if total_criteria >= 2 and judge_reply is not None:  # :271
        rank = released_rank_term(released_judge_ranks(judge_reply, len(borda)), borda)
        atom = released_atomicity(json.loads(judge_reply).get("atomic_count"), total_criteria)  # :287, :303
    w = RELEASED_WEIGHTS
    return w["rank"] * rank + w["atomicity"] * atom + w["format"] * fmt  # :310-316


def verl_grpo_advantages(scores: torch.Tensor, index: list[int], epsilon: float = 1e-6) -> torch.Tensor:
    """compute_grpo_outcome_advantage with norm_adv_by_std_in_grpo (core_algos.py:303-330; train_grpo.sh:88)."""
    by_group = defaultdict(list)
    for i, g in enumerate(index):
        by_group[g].append(scores[i])
    mean, std = {}, {}
    for g, values in by_group.items():
        if len(values) == 1:
            mean[g], std[g] = torch.tensor(0.0, dtype=scores.dtype), torch.tensor(1.0, dtype=scores.dtype)
        else:
            stacked = torch.stack(values)
            mean[g], std[g] = torch.mean(stacked), torch.std(stacked)  # :319-320, Bessel-corrected
    return torch.stack([(scores[i] - mean[g]) / (std[g] + epsilon) for i, g in enumerate(index)])  # :325


# ------------------------------------------------------------------------- the same inputs for both

ACTIONS = ["search[Nightfall Harbor]", "search[Ossian Threll]", "browse[d9]", "finish[Lisbon]"]
LABELS = "ABCD"
BORDA = [9.0, 6.0, 6.0, 3.0]  # ours: higher is better, a tie in the middle


def point() -> BranchingPoint:
    return BranchingPoint(question_id="q1", question="Where was the director of Nightfall Harbor born?", depth=1,
                          candidates=[Candidate(action=a, model="m", temperature=0.4) for a in ACTIONS],
                          slate=[0, 1, 2, 3], borda_scores=BORDA, consensus=[0, 1, 2, 3])


def released_borda() -> dict[str, float]:
    """The same consensus as the released code stores it: lower is better."""
    return {label: max(BORDA) - b for label, b in zip(LABELS, BORDA)}


def ours_json(criteria: list[str], weights: list[float]) -> str:
    return json.dumps({"criteria": [{"criterion": c, "weight": w} for c, w in zip(criteria, weights)]})


def released_lines(criteria: list[str], weights: list[float]) -> str:
    return "\n".join(f"{i}. [{w:g}] {c}" for i, (c, w) in enumerate(zip(criteria, weights), start=1))


def judge_reply(scores: list[float], atomic_count: int) -> str:
    """The released judge's reply that ranks the slate as ``scores`` do (best first, equal scores tied)."""
    order = sorted(set(scores), reverse=True)
    groups = [[LABELS[i] for i, s in enumerate(scores) if s == level] for level in order]
    return json.dumps({"ranking": [g[0] if len(g) == 1 else g for g in groups], "atomic_count": atomic_count})


def weighted(weights: list[float], satisfied: list[bool]) -> float:
    return sum(w for w, ok in zip(weights, satisfied) if ok) / sum(weights)


def evaluator(verdicts: list[list[bool]], atomic_count: int) -> ScriptedChatModel:
    """Our evaluator in the paper's action mode: each action's verdicts, every call carrying the same count."""
    def respond(messages, sampling):
        action = re.search(r"Proposed next action:\n(.+)", messages[1].content).group(1)
        return json.dumps({"satisfied": verdicts[ACTIONS.index(action)], "atomic_count": atomic_count})

    return ScriptedChatModel(respond)


@pytest.fixture(scope="module")
def paper(repo_root):
    return load_params(repo_root / "params.yaml", "paper")


def ours_reward(settings, reply: str, verdicts: list[list[bool]], atomic_count: int):
    return asyncio.run(RubricReward(evaluator(verdicts, atomic_count), settings).score(point(), reply))


CHECKS = ["Searches for the director of Nightfall Harbor", "Names the film in its search words",
          "Does not repeat an earlier search", "Does not answer before the birthplace is known",
          "Uses a search action"]
IN_ORDER = [[True] * 5, [True, True, False, True, False], [True, False, True, False, False], [False] * 5]

# (criteria, weights as written, each action's verdicts, the judge's atomic count)
CASES = [
    (CHECKS[:3], [0.5, 0.3, 0.2], [v[:3] for v in IN_ORDER], 3),
    (CHECKS[:4], [3, 2, 1, 1], [v[:4] for v in reversed(IN_ORDER)], 2),
    (CHECKS[:2], [0.6, 0.4], [[True, False]] * 4, 1),  # every action alike: rho undefined, chance
    (CHECKS, [0.3, 0.2, 0.2, 0.2, 0.1], [IN_ORDER[0], IN_ORDER[2], IN_ORDER[1], IN_ORDER[3]], 5),
    (CHECKS[:3], [0.4, 0.4, 0.4], [[True, True, False], [True, False, True], [False, True, True], [True] * 3], 0),
    (CHECKS[:1], [1.0], [[True], [False], [False], [True]], 1),  # one criterion: not judged
]


# ------------------------------------------------------------------------- the checks


def test_rank_term_is_the_released_spearman_of_the_induced_and_expert_rankings(conformance):
    score_sets = [[1.0, 0.6, 0.3, 0.0], [0.0, 0.3, 0.6, 1.0], [0.5, 0.5, 0.5, 0.5], [1.0, 0.5, 0.5, 0.0],
                  [0.2, 0.9, 0.9, 0.1], [0.7, 0.1, 0.4, 0.4]]
    ours = [listwise_rank_reward(s, BORDA) for s in score_sets]
    theirs = [released_rank_term(released_judge_ranks(judge_reply(s, 0), 4), released_borda()) for s in score_sets]
    conformance.check("Co-ReAct rank term (rho + 1) / 2", f"{REWARD_FN}:294-300, {JUDGE}:157-178", ours, theirs,
                      tol=TOL, note="ties on both sides share average ranks; an undefined rho is chance, 0.5")


def test_reward_weights_are_the_released_ones(conformance, paper):
    w = paper.rubric_generator.reward_weights
    conformance.check("Co-ReAct reward weights", f"{REWARD_FN}:210-214", [w["rank"], w["atomicity"], w["format"]],
                      [RELEASED_WEIGHTS["rank"], RELEASED_WEIGHTS["atomicity"], RELEASED_WEIGHTS["format"]], tol=0.0)


def test_atomicity_is_the_judges_count_over_the_criteria(conformance, paper):
    settings = paper.rubric_generator
    assert settings.atomicity == "judge"
    ours, theirs, rule = [], [], []
    for criteria, weights, verdicts, count in CASES[:5]:
        ours.append(ours_reward(settings, ours_json(criteria, weights), verdicts, count).atomicity)
        theirs.append(released_atomicity(count, len(criteria)))
        rule.append(ours_reward(settings.model_copy(update={"atomicity": "rule"}), ours_json(criteria, weights),
                                verdicts, count).atomicity)
    conformance.check("Co-ReAct atomicity (judge's count)", f"{REWARD_FN}:135-145, 287, 303; {JUDGE}:25-27, 51",
                      ours, theirs, tol=TOL, note="ours: the count is in the reply's schema; a reply without it is "
                      "a failed call (the rubric unscored), where the released code scores 0")
    conformance.differs("Co-ReAct atomicity: rule (embedded)", f"{REWARD_FN}:135-145", rule, theirs, at_least=0.5,
                        note="named option atomicity: rule, a word-count and joiner rule with no judge call")


def test_format_is_three_to_five_criteria_and_weights_summing_to_one(conformance, paper):
    settings = paper.rubric_generator
    assert settings.format_reward == "count_weights"
    rubrics = [(c, w) for c, w, *_ in CASES] + [(CHECKS[:2], [2, 1]), (CHECKS[:4], [0.3, 0.3, 0.2, 0.1]),
                                                (CHECKS[:3], [0.28, 0.28, 0.28])]
    ours, theirs, schema = [], [], []
    for criteria, weights in rubrics:
        parsed = parse_rubric(ours_json(criteria, weights), settings.max_criteria, max_chars=settings.max_criterion_chars)
        ours.append(format_term(parsed, settings.format_reward))
        theirs.append(released_format(released_lines(criteria, weights)))
        schema.append(format_term(parsed, "schema"))
    assert sorted(set(theirs)) == [0.0, 0.5, 1.0]  # every value of the term is among the cases
    conformance.check("Co-ReAct format term (count and weights)", f"{REWARD_FN}:75-95", ours, theirs, tol=0.0)
    conformance.differs("Co-ReAct format term: schema (embedded)", f"{REWARD_FN}:75-95", schema, theirs,
                        at_least=0.5, note="named option format_reward: schema, 1 / 0.5 / 0 for the JSON (paper 3.2.1)")


def test_repetition_gate_reads_the_whole_reply(conformance, paper):
    settings = paper.rubric_generator
    assert settings.repetition_scope == "reply"
    loop = "Search for the director of the film"
    replies = [ours_json(c, w) for c, w, *_ in CASES] + [
        ours_json([loop] * 3, [1, 1, 1]),
        ours_json(CHECKS[:2], [2, 1]) + "\nThe rubric above checks the search. " * 3,
        ours_json([loop, loop + " first", "Reads the paragraph about the director of the film"], [0.4, 0.3, 0.3]),
        "<think>the director, the director, the director</think>" + ours_json(CHECKS[:3], [0.5, 0.3, 0.2]),
    ]
    ours = [repetition_rate(r, settings.repetition_ngram) for r in replies]
    theirs = [released_repeat_rate(r) for r in replies]
    conformance.check("Co-ReAct 4-gram repetition rate (whole reply)", f"{REWARD_FN}:120-132, 240", ours, theirs,
                      tol=TOL)
    gated, criteria_scope = [], []
    for r in replies:
        criteria = parse_rubric(r, settings.max_criteria, max_chars=settings.max_criterion_chars).rubric.criteria
        parts = ours_reward(settings, r, [[True] * len(criteria)] * 4, len(criteria))
        gated.append(float(parts.gated and parts.total == 0.0))
        criteria_scope.append(repetition_rate("\n".join(c.text for c in criteria), settings.repetition_ngram))
    released_gated = [float(released_is_repetitive(r)) for r in replies]
    assert 0 < sum(released_gated) < len(replies)  # the gate opens and closes among the cases
    conformance.check("Co-ReAct repetition gate (> 0.4 zeroes the reward)", f"{REWARD_FN}:132, 240-248", gated,
                      released_gated, tol=0.0)
    conformance.differs("Co-ReAct repetition gate: criteria (paper A)", f"{REWARD_FN}:240", criteria_scope, theirs,
                        at_least=0.05, note="named option repetition_scope: criteria, the parsed criteria alone "
                        "(paper A: 'the 4-gram repetition rate of the rubric')")


def test_fewer_than_two_criteria_earn_only_the_format_term(conformance, paper):
    settings = paper.rubric_generator
    assert settings.min_criteria == 2
    singles = [([CHECKS[0]], [1.0]), ([CHECKS[1]], [0.5]), ([CHECKS[4]], [3])]
    verdicts = [[True], [False], [False], [True]]
    ours = [ours_reward(settings, ours_json(c, w), verdicts, 1).total for c, w in singles]
    theirs = [released_score(released_lines(c, w), judge_reply([1.0, 0.0, 0.0, 1.0], 1), released_borda())
              for c, w in singles]
    conformance.check("Co-ReAct rubric with fewer than 2 criteria", f"{REWARD_FN}:271", ours, theirs, tol=TOL,
                      note="rank and atomicity 0, the format term kept; the evaluator is not called")
    scored = settings.model_copy(update={"min_criteria": 1})
    embedded = [ours_reward(scored, ours_json(c, w), verdicts, 1).total for c, w in singles]
    conformance.differs("Co-ReAct fewer than 2 criteria: scored (embedded)", f"{REWARD_FN}:271", embedded, theirs,
                        at_least=0.3, note="named option min_criteria: 1 (the warm start's answer-step rubric has one)")


def test_combined_reward_on_a_handful_of_replies(conformance, paper):
    settings = paper.rubric_generator
    loop = ["Search for the director of the film now"] * 4
    ours, theirs = [], []
    for criteria, weights, verdicts, count in [*CASES, (loop, [0.25] * 4, [[True] * 4] * 4, 4)]:
        scores = [weighted(weights, v) for v in verdicts]
        reply = judge_reply(scores, count)
        assert released_is_repetitive(released_lines(criteria, weights)) == \
            (repetition_rate(ours_json(criteria, weights)) > settings.repetition_max_rate)  # the same gate decision
        ours.append(ours_reward(settings, ours_json(criteria, weights), verdicts, count).total)
        theirs.append(released_score(released_lines(criteria, weights), reply, released_borda()))
    ours.append(ours_reward(settings, "I cannot write a rubric for this step.", [[True]] * 4, 0).total)
    theirs.append(released_score("I cannot write a rubric for this step.", None, released_borda()))
    assert len(set(theirs)) >= 6  # the cases reach different rewards
    conformance.check("Co-ReAct combined generator reward", f"{REWARD_FN}:221-316", ours, theirs, tol=TOL,
                      note="paper profile; the gate, format, <2 rule, judge rank and count on the same rubrics")


def test_generator_advantages_use_verls_sample_std(conformance, paper):
    config = generator_config(paper.grpo, paper.rubric_generator, n_train_points=8)
    rewards = torch.tensor([1.0, 0.25, 0.25, 0.0, 0.75, 0.75, 0.5, 0.1, 0.9, 0.3, 0.3, 0.3], dtype=torch.float64)
    groups = [0] * 8 + [1] * 4
    ours = group_advantages(rewards, groups, normalize_std=config.std_normalize, eps=config.adv_eps,
                            unbiased_std=config.adv_std == "sample")
    theirs = verl_grpo_advantages(rewards, groups, epsilon=config.adv_eps)
    conformance.check("Co-ReAct generator GRPO advantages (sample std)", f"{VERL}:303-330; "
                      f"{REPO}:rubric_rl/train_grpo.sh:88", ours, theirs, tol=TOL)
    population = group_advantages(rewards, groups, eps=config.adv_eps, unbiased_std=False)
    conformance.differs("Co-ReAct generator advantages: population std", f"{VERL}:320", population, theirs,
                        at_least=0.05, note="named option rubric_generator.adv_std: population (x1.069 at G=8)")
