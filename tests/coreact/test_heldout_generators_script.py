"""scripts/heldout_rubric_generators.py picks held-out points by question: only usable points (kept, a slate, a
consensus that is not flat) of questions the adapters' collect does not hold; ``--adapter`` wants NAME=PATH."""

import argparse
import importlib.util
from pathlib import Path

import pytest

from components.schemas import BranchingPoint, Candidate

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "heldout_rubric_generators.py"
spec = importlib.util.spec_from_file_location("heldout_rubric_generators", SCRIPT)
script = importlib.util.module_from_spec(spec)
spec.loader.exec_module(script)


def point(qid, depth=0, borda=(3.0, 2.0, 1.0, 0.0), kept=True):
    return BranchingPoint(question_id=qid, question="?", depth=depth, kept=kept,
                          candidates=[Candidate(action=f"search[{i}]", model="m", temperature=0.4) for i in range(4)],
                          slate=[0, 1, 2, 3], borda_scores=list(borda), consensus=[0, 1, 2, 3])


def test_held_out_points_are_the_usable_points_of_unseen_questions():
    old = [point("q1"), point("q2", kept=False)]
    new = [*old, point("q3"), point("q3", depth=1, borda=(1.0, 1.0, 1.0, 1.0)), point("q4", kept=False),
           point("q4", depth=2)]
    held = script.held_out_points(new, old)
    assert [(p.question_id, p.depth) for p in held] == [("q3", 0), ("q4", 2)]
    # a question the smaller collect only dropped is still one it holds
    assert all(p.question_id != "q2" for p in script.held_out_points([point("q2")], old))


def test_adapter_argument_names_an_existing_folder(tmp_path):
    assert script.adapter_arg(f"crit={tmp_path}") == ("crit", tmp_path)
    with pytest.raises(argparse.ArgumentTypeError, match="NAME=PATH"):
        script.adapter_arg(str(tmp_path))
    with pytest.raises(argparse.ArgumentTypeError, match="not a peft adapter folder"):
        script.adapter_arg(f"x={tmp_path / 'missing'}")


def test_the_table_prints_sampled_figures_as_dashes_when_none_were_drawn():
    change = {"delta_mean": 0.1, "delta_ci_low": -0.2, "delta_ci_high": 0.3, "wilcoxon_p": 0.5, "points_up": 2.0,
              "points_down": 1.0, "points_same": 0.0}
    greedy = {"parse_rate": 1.0, "spearman": 0.25, "spearman_with_unparsed": 0.2, "flat_rate": 0.1}
    result = {"generators": {"untrained": {"summary": greedy},
                             "trained": {"summary": {**greedy, "sampled_parse_rate": 0.5, "sampled_spearman": -0.1,
                                                     "sampled_spearman_with_unparsed": -0.05}}},
              "change": {"trained": change}, "change_unparsed_as_chance": {"trained": change}}
    text = script.table(result)
    assert "| untrained | 1.00 / - | +0.250 / - | +0.200 / - | 0.10 |" in text
    assert "| trained | 1.00 / 0.50 | +0.250 / -0.100 | +0.200 / -0.050 | 0.10 |" in text
    assert "| trained | change | +0.100 [-0.20, +0.30] | 0.50 | 2 / 1 / 0 |" in text
