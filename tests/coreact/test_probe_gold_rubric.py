"""The gold-chain rubric of scripts/probe_rubric_evaluator.py (the ceiling of the rubric reward): it names the
first hop whose answer the history has not shown, and the final answer once every hop's answer has been shown."""

import importlib.util
import json
from pathlib import Path

from components.schemas import BranchingPoint, Question, Step, SubQuestion

SCRIPT = Path(__file__).resolve().parents[2] / "scripts" / "probe_rubric_evaluator.py"
spec = importlib.util.spec_from_file_location("probe_rubric_evaluator", SCRIPT)
probe = importlib.util.module_from_spec(spec)
spec.loader.exec_module(probe)

QUESTION = Question(id="q1", question="Where was the director of Nightfall Harbor born?", answers=["Velmoor"],
                    source="world", gold_chain=[SubQuestion(question="Who directed Nightfall Harbor?", answer="Ossian Threll"),
                                                SubQuestion(question="Where was Ossian Threll born?", answer="Velmoor")])


def criteria(*observations):
    prefix = [Step(index=i, action=f"search[x{i}]", observation=o) for i, o in enumerate(observations)]
    point = BranchingPoint(question_id="q1", question=QUESTION.question, depth=len(prefix), prefix=prefix)
    return [c["criterion"] for c in json.loads(probe.gold_rubric(point, QUESTION))["criteria"]]


def test_gold_rubric_follows_the_hops_the_history_has_shown():
    assert criteria() == ["Looks up the fact: Who directed Nightfall Harbor?", "Does not give a final answer yet"]
    assert criteria("Nightfall Harbor is a film by OSSIAN THRELL.") == [
        "Looks up the fact: Where was Ossian Threll born?", "Does not give a final answer yet"]
    assert criteria("... Ossian Threll ...", "He was born in Velmoor.") == ["Gives the final answer Velmoor"]
