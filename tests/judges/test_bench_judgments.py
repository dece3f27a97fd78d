"""The judge bench's registry and the judgments the methods register on it: each one's units built from a small
trajectory set, its prompts (reference shown only in the reference mode), and its scoring against the oracle,
with scripted judges (no real model)."""

from __future__ import annotations

import dataclasses
import json
import re

import pytest

from components.judges.bench import metrics
from components.judges.bench.registry import BENCH, BenchJudgment, load_gaps
from components.llm.backends.scripted import ScriptedChatModel
from components.registry import RegistryError
from tests.judges.conftest import run


def test_each_method_registers_its_judgments_with_its_modes(judgments):
    assert set(judgments) >= {"answer_judge", "arbor_pairwise", "arbor_pairwise_verdicts", "arbor_rar",
                              "coreact_council", "coreact_rubric_evaluator", "coreact_verifier",
                              "coreact_verifier_checklist", "rubricem_stage_scores"}
    asked = ["text", "probability", "reference"]
    assert judgments["arbor_pairwise"].modes(asked) == asked
    assert judgments["coreact_council"].modes(asked) == ["text", "reference"]
    assert judgments["coreact_rubric_evaluator"].modes(asked) == ["text", "probability"]
    assert judgments["arbor_rar"].modes(asked) == ["text"]
    assert judgments["answer_judge"].modes(["probability"]) == ["probability"]
    narrowed = dataclasses.replace(judgments["arbor_pairwise"], only_modes=("reference",))
    assert narrowed.modes(asked) == ["reference"] and narrowed.modes(["text"]) == []
    with pytest.raises(ValueError, match="unknown bench mode 'logits'"):
        judgments["answer_judge"].modes(["logits"])
    other = BenchJudgment(name="arbor_pairwise", method="x", role=str, units=list, ask=None, summary=dict)
    with pytest.raises(RegistryError, match="already registered"):
        other.register()
    assert all(j.reference_note for j in judgments.values())
    assert BENCH.get("arbor_pairwise").method == "arbor"


def test_a_scoring_key_names_the_params_field_that_the_method_reads(judgments):
    """The bench's recommended setting names these keys; each must be a real field that takes text/probability."""
    from components.params_load import load_params
    params = load_params()
    keyed = {n: j.scoring_key for n, j in judgments.items() if j.scoring_key}
    assert keyed["arbor_pairwise"] == "arbor.judge_scoring"
    assert keyed["coreact_rubric_evaluator"] == "rubric_generator.evaluator_scoring"
    for name, key in keyed.items():
        section, field = key.split(".")
        assert judgments[name].choice, name   # only a choice judgment has a probability mode
        assert field in type(getattr(params, section)).model_fields
        assert getattr(getattr(params, section), field) in ("text", "probability", None)


def test_the_judgments_not_on_the_bench_say_why():
    gaps = {g.name: g for g in load_gaps()}
    assert set(gaps) >= {"rubricem_reflection", "arco_criteria", "arbor_induction"}
    assert not {"rubricem_stage_scores", "coreact_verifier"} & set(gaps)   # both are on the bench now
    assert {gaps["rubricem_reflection"].method, gaps["arco_criteria"].method} == {"rubricem", "arco"}
    assert "reflection" in gaps["rubricem_reflection"].reason and "mu" in gaps["arco_criteria"].reason


def test_pairwise_units_and_reference_only_in_reference_mode(items, params, judgments):
    j = judgments["arbor_pairwise"]
    units = j.units(items, params)
    assert len(units) == 2 * (len(items) - 3)
    by = {u.id: u for u in units}
    for u in units:
        if u.label["order"] == "AB":
            twin = by[u.id[:-2] + "BA"]
            assert (u.data["a"], u.data["b"]) == (twin.data["b"], twin.data["a"])
            assert twin.label["preferred"] == {"A": "B", "B": "A", None: None}[u.label["preferred"]]
    judge = ScriptedChatModel(lambda messages, sampling: '{"winner": "A"}')
    rows = run(j, judge, units[:2], params)
    assert [r["winner"] for r in rows] == ["A", "A"] and rows[0]["expected"] == 1.0
    text_prompt = judge.requests[0][0][1].content
    run(j, judge, units[:1], params, mode="reference")
    ref_prompt = judge.requests[-1][0][1].content
    gold = units[0].data["question"].answers[0]
    assert "Reference notes" not in text_prompt and "Reference notes" in ref_prompt
    assert f"Correct answer: {gold}" in ref_prompt
    assert ref_prompt.startswith(text_prompt.split("Criterion:")[0])  # the attempts come first in both


def _label_ranking(messages, by_score):
    """A council reply ranking the shown candidates by ``by_score(action text)``, best first."""
    shown = re.findall(r"^\[([A-Z])\] (.*)$", messages[1].content, re.MULTILINE)
    order = sorted(shown, key=lambda s: -by_score(s[1]))
    return '{"rationale": "r", "ranking": [' + ", ".join(f'"{lab}"' for lab, _ in order) + "]}"


def test_council_slates_are_balanced_and_scored_against_the_oracle(items, params, judgments):
    j = judgments["coreact_council"]
    units = j.units(items, params)
    for qid in {u.slate for u in units}:
        mine = [u for u in units if u.slate == qid]
        k = len(mine[0].label["positions"])
        assert len(mine) == k
        for variant in mine[0].label["positions"]:
            assert sorted(u.label["positions"][variant] for u in mine) == list(range(k))
    # an oracle-like judge: answered (no "stops without answering") first, then more searches, then by the text
    # (so that it never ties and never looks at positions)
    oracle_like = ScriptedChatModel(lambda m, s: _label_ranking(
        m, lambda a: 10 * ("stops without" not in a) + a.count("search[") + sum(map(ord, a)) % 97 / 100))
    s = metrics.slate_summary(run(j, oracle_like, units, params), seed=0)
    assert s["failure_rate"] == 0 and s["kendall"] > 0.3 and s["auc"] > 0.6
    assert s["attempt_effect"] > s["position_effect"] == pytest.approx(0.0)
    # a judge that ranks by position alone: its whole effect is position, none is attempt
    by_position = ScriptedChatModel(lambda m, s: _label_ranking(m, lambda a: 0))
    s = metrics.slate_summary(run(j, by_position, units, params), seed=0)
    assert s["position_effect"] == pytest.approx(1.0) and s["attempt_effect"] == pytest.approx(0.0)
    assert abs(s["auc"] - 0.5) < 0.1   # cyclic shifts balance positions, not every pair's relative order
    # a reply that is not a ranking is a failure, not a score
    rows = run(j, ScriptedChatModel(lambda m, s: "no idea"), units[:1], params)
    assert rows[0]["failure"] and all(v is None for v in rows[0]["scores"].values())
    run(j, oracle_like, units[:1], params, mode="reference")
    assert "The correct answer is" in oracle_like.requests[-1][0][1].content
    assert "The correct answer is" not in oracle_like.requests[0][0][1].content


def test_rubric_evaluator_scores_each_last_action_by_criterion(items, params, judgments):
    j = judgments["coreact_rubric_evaluator"]
    units = j.units(items, params)
    assert len(units) == len(items)

    def reply(messages, sampling):  # yes to "is a final answer" only for finish actions, yes to the rest always
        text = messages[1].content
        action = text.split("Proposed next action: ")[1].split("\n")[0]
        if "is a final answer" in text:
            return "yes" if action.startswith("finish[") else "no"
        return "yes"

    judge = ScriptedChatModel(reply)
    rows = run(j, judge, units, params)
    assert len(judge.requests) == 3 * len(units)
    for r, u in zip(rows, units, strict=True):
        [(_variant, score)] = r["scores"].items()
        assert score == pytest.approx(1.0 if u.data["action"].startswith("finish[") else 2 / 3)
    s = metrics.slate_summary(rows, seed=0)
    assert s["position_effect"] is None and s["failure_rate"] == 0
    truncated = metrics.slate_pairs(rows, "truncated")
    assert truncated and all(p == 1.0 for p in truncated)       # gold answers, the truncated one does not
    assert all(p == 0.5 for p in metrics.slate_pairs(rows, "wrong_answer"))   # this judge cannot tell them apart
    bad = run(j, ScriptedChatModel(lambda m, s: "perhaps"), units[:1], params)
    assert list(bad[0]["scores"].values()) == [None] and "yes or no" in bad[0]["failure"]


def test_rar_writes_one_checklist_per_question_and_rates_each_trajectory(items, params, judgments):
    j = judgments["arbor_rar"]
    units = j.units(items, params)

    def reply(messages, sampling):
        if "checklist" in messages[0].content and "write" in messages[0].content.lower():
            return '{"items": ["finds the mother", "finds her father", "answers"]}'
        return '{"rating": 10}' if "Final answer" in messages[1].content else '{"rating": 1}'

    judge = ScriptedChatModel(reply)
    rows = run(j, judge, units, params)
    checklists = [m for m, _ in judge.requests if "Reference answer" in m[1].content]
    assert len(checklists) == 3 and len(judge.requests) == 3 + len(units)
    for r, u in zip(rows, units, strict=True):
        answered = u.data["text"].rstrip().splitlines()[-1].startswith("Final answer")
        assert list(r["scores"].values()) == [1.0 if answered else 0.0]
    assert all(p == 1.0 for p in metrics.slate_pairs(rows, "truncated"))
    failed = run(j, ScriptedChatModel(lambda m, s: "sorry"), units[:1], params)
    assert failed[0]["failure"] == "no checklist" and list(failed[0]["scores"].values()) == [None]


def test_slate_metrics_match_hand_computed_values():
    oracle = {"gold": 4.0, "skip": 2.0, "cut": 1.0}
    rows = [  # two views of one slate, shown in two orders
        {"slate": "q", "view": 0, "scores": {"gold": 2.0, "skip": 1.0, "cut": 0.0}, "oracle": oracle,
         "positions": {"gold": 0, "skip": 1, "cut": 2}},
        {"slate": "q", "view": 1, "scores": {"gold": 1.0, "skip": 1.0, "cut": 2.0}, "oracle": oracle,
         "positions": {"gold": 2, "skip": 0, "cut": 1}},
    ]
    s = metrics.slate_summary(rows, seed=0)
    # view 0: 3 concordant pairs; view 1: gold=skip (equal), gold<cut and skip<cut (discordant)
    assert s["accuracy"] == pytest.approx(3 / 6) and s["flat_rate"] == pytest.approx(1 / 6)
    assert s["auc"] == pytest.approx(3.5 / 6)
    assert s["kendall"] == pytest.approx((1.0 + (-0.8164965809)) / 2)
    # mean points by position: 0 -> 1.5, 1 -> 1.5, 2 -> 0.5; by trajectory: gold 1.5, skip 1.0, cut 1.0; range 2
    assert s["position_effect"] == pytest.approx(0.5) and s["attempt_effect"] == pytest.approx(0.25)
    assert metrics.oracle_key({"hops_found": 2, "em": 0.0}) > metrics.oracle_key({"hops_found": 1, "em": 1.0})


def test_pairwise_attempt_effect():
    rows = [{"pair": "p", "order": "AB", "preferred": "A", "winner": "A", "expected": 1.0},
            {"pair": "p", "order": "BA", "preferred": "B", "winner": "B", "expected": 0.0},
            {"pair": "q", "order": "AB", "preferred": "A", "winner": "A", "expected": 1.0},
            {"pair": "q", "order": "BA", "preferred": "B", "winner": "A", "expected": 1.0}]
    s = metrics.pairwise_summary(rows)
    assert s["attempt_effect"] == 0.5 and s["position_effect"] == 0.5


def _any_judge(messages, sampling):
    """One scripted reply for every bench prompt: A wins, the first label ranks first, yes, 7/10, right."""
    system, text = messages[0].content, messages[-1].content
    if '"verdicts"' in system:
        n = int(re.search(r"Checklist \((\d+) criteria\)", text).group(1))
        return json.dumps({"verdicts": [{"satisfied": True, "reason": "r"}] * n})
    if "You write grading rubrics" in system:
        return json.dumps({f"stage_{k}": {"positive_rubrics": [{"title": "t", "description": "d", "weight": 2}],
                                          "negative_rubrics": []} for k in range(1, 5)})
    if "You grade several attempts" in system:
        rubrics = re.findall(r"^\d+\. \[", text, re.MULTILINE)
        return json.dumps({"scores": [[2] * text.count("=== Attempt ")] * len(rubrics)})
    if '"winner"' in system:
        return '{"winner": "A"}'
    if "rank all" in text.lower():
        labels = re.findall(r"^\[([A-Z])\]", text, re.MULTILINE)
        return '{"rationale": "r", "ranking": [' + ", ".join(f'"{lab}"' for lab in labels) + "]}"
    if "yes or no" in system:
        return "yes"
    if '"items"' in system:
        return '{"items": ["a", "b"]}'
    if '"rating"' in system:
        return '{"rating": 7}'
    return '{"correct": true}'


class _Pool:
    """The two LLMPools the runner opens, each handing out one scripted judge."""

    def __init__(self, params, overrides=None, cache_path=None):
        self.model = ScriptedChatModel(_any_judge)

    def role(self, role):
        return self.model

    def roles(self, role):
        return [self.model]

    def backend(self, name):
        return self.model

    def close(self):
        pass


def test_the_runner_asks_every_judgment_in_its_modes_and_writes_the_page(tmp_path, monkeypatch):
    import importlib.util
    import json
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("judge_bench_script", root / "scripts" / "judge_bench.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "LLMPool", _Pool)
    page = tmp_path / "page.md"
    monkeypatch.setattr(sys, "argv", ["judge_bench.py", "--questions", "2", "--out", str(tmp_path / "out"),
                                      "--results-page", str(page), "--judgments", "all",
                                      "--modes", "text", "probability", "reference"])
    script.main()
    summary = json.loads((tmp_path / "out" / "summary.json").read_text())
    asked = {(s["judgment"], s["mode"]) for s in summary["summaries"]}
    assert asked == {("answer_judge", "text"), ("answer_judge", "probability"), ("arbor_pairwise", "text"),
                     ("arbor_pairwise", "probability"), ("arbor_pairwise", "reference"), ("arbor_rar", "text"),
                     ("arbor_pairwise_verdicts", "text"), ("arbor_pairwise_verdicts", "probability"),
                     ("arbor_pairwise_verdicts", "reference"), ("arbor_pairwise_single", "text"),
                     ("arbor_pairwise_single", "probability"), ("arbor_pairwise_single", "reference"),
                     ("coreact_council", "text"), ("coreact_council", "reference"),
                     ("coreact_rubric_evaluator", "text"), ("coreact_rubric_evaluator", "probability"),
                     ("coreact_verifier", "text"), ("coreact_verifier", "probability"),
                     ("coreact_verifier_checklist", "text"), ("rubricem_stage_scores", "text"),
                     ("rubricem_stage_scores", "probability")}
    by = {(s["judgment"], s["mode"]): s for s in summary["summaries"]}
    assert by[("arbor_pairwise", "text")]["position_effect"] == 1.0       # "A" every time
    assert by[("arbor_pairwise_verdicts", "text")]["flat_rate"] == 1.0    # yes to both attempts: a tie
    assert by[("coreact_council", "text")]["position_effect"] == 1.0      # the first label every time
    assert by[("coreact_rubric_evaluator", "text")]["flat_rate"] == 1.0   # yes to everything
    for form in ("coreact_verifier", "coreact_verifier_checklist"):      # accepts every action
        assert by[(form, "text")]["accept_rate"] == 1.0 and by[(form, "text")]["failure_rate"] == 0
    stages = by[("rubricem_stage_scores", "text")]                       # 2 for every stage of every attempt
    assert stages["failure_rate"] == 0 and stages["flat_rate"] == 1.0 and stages["position_effect"] == 0.0
    text = page.read_text()
    assert "## Who may see the reference" in text and "coreact_rubric_evaluator (coreact): never" in text
    assert "## Judgments not on the bench" in text and "- arco_criteria (arco):" in text
    assert "Not run" not in text and summary["meta"]["judgments_done"] == summary["meta"]["judgments_asked"]
    # the figures committed beside the page are the bench's summary, the page names them and is rebuilt from them
    assert json.loads((tmp_path / "page.json").read_text()) == summary and "[`page.json`](page.json)" in text
    import shutil

    shutil.rmtree(tmp_path / "out")
    page.write_text("")
    monkeypatch.setattr(sys, "argv", ["judge_bench.py", "--out", str(tmp_path / "out"), "--results-page", str(page),
                                      "--rewrite-page"])
    script.main()
    assert page.read_text() == text


def test_the_probability_note_counts_calls_not_units():
    from components.judges.bench import report
    s = {"judgment": "arbor_pairwise_single", "mode": "probability", "rows": 28, "calls_per_judgment": 18 / 28,
         "scored_from_probability": 18, "failed_calls": 0}
    assert report.probability_notes([s]) == []          # 28 units, 18 calls (the rest reused a verdict)
    assert "17 of 18 judged calls" in report.probability_notes([{**s, "scored_from_probability": 17}])[0]


def test_a_judgment_asked_in_none_of_its_modes_is_refused_before_any_model_runs(tmp_path, monkeypatch, capsys):
    import importlib.util
    import sys
    from pathlib import Path

    root = Path(__file__).resolve().parents[2]
    spec = importlib.util.spec_from_file_location("judge_bench_script", root / "scripts" / "judge_bench.py")
    script = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(script)
    monkeypatch.setattr(script, "LLMPool", _Pool)
    monkeypatch.setattr(sys, "argv", ["judge_bench.py", "--questions", "2", "--out", str(tmp_path / "out"),
                                      "--results-page", "", "--judgments", "arbor_rar",
                                      "--modes", "probability"])
    with pytest.raises(SystemExit) as exit_info:
        script.main()
    assert exit_info.value.code == 2
    assert "arbor_rar: none of --modes probability applies to it (it is asked in: text)" in (
        capsys.readouterr().err)
    assert not (tmp_path / "out").exists()
