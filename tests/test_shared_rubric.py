"""One rubric type for the four methods (components.schemas.Rubric): Co-ReAct writes it, and ARBOR's memory,
RubricEM's judge buffers and bank, and ARCO's step criteria convert to it; a training run writes the rubrics
its method holds after each step as rubrics/step_N.jsonl in that one type."""

from __future__ import annotations

import types

from components.io import read_jsonl
from components.methods.arbor.memory import RubricMemory
from components.methods.arbor.params import ArborParams
from components.methods.arco.variants import step_rubric
from components.methods.rubricem.bank import RubricBank
from components.methods.rubricem.stagewise_judge import QuestionBuffer, StageRubric
from components.methods.rubricem.variants import RubricEMState
from components.policy_run import write_rubrics
from components.schemas import Criterion, Rubric
from tests.arbor.test_arbor_memory import GOOD, FakeEmbed, drafts_record, rt


def test_a_criterion_without_a_stage_serialises_as_before():
    assert Criterion(text="names the film", weight=2.0).model_dump_json() == \
        '{"text":"names the film","weight":2.0,"kind":""}'
    staged = Criterion(text="plans the hops", stage=0)
    assert Criterion.model_validate_json(staged.model_dump_json()) == staged


def test_arbor_memory_in_the_shared_type():
    memory = RubricMemory(ArborParams(k_consol=100), embed=FakeEmbed())
    memory.consolidate([rt("cites sources")], 1)
    memory.apply_step(2, [], [drafts_record(GOOD, qid="q7")])
    rubrics = memory.rubrics()
    assert [r.id.split(":")[0] for r in rubrics] == ["P", "D"]
    (common,), (draft,) = rubrics[0].criteria, rubrics[1].criteria
    assert common.text == "cites sources: cites sources done well (weak: cites sources done badly)"
    assert common.kind == "process" and draft.text.startswith("draft0:") and "question q7" in rubrics[1].source


def test_rubricem_buffer_keeps_stage_weight_and_polarity():
    buffer = QuestionBuffer(question_id="q3", persistent=[
        StageRubric(id="p1", stage=3, title="Answer", description="token F1", weight=3, persistent=True,
                    kind="answer_f1")])
    buffer.add(1, "Searches each hop", "one entity per search", 2, False, step=4)
    buffer.add(2, "Invents a fact", "claims without a document", 3, True, step=4)
    rubric = buffer.as_rubric()
    assert rubric.id == "q3" and "stagewise judge" in rubric.source
    assert [(c.stage, c.weight, c.kind) for c in rubric.criteria] == [(3, 3.0, "answer_f1"), (1, 2.0, "judge"),
                                                                      (2, 3.0, "negative")]


def test_arco_step_criteria_in_the_shared_type():
    episode = types.SimpleNamespace(prompt=types.SimpleNamespace(id="q9"), group=1, info={})
    rubric = step_rubric(episode, 2, ["searches the director", "reads the bio", "names the city"])
    assert rubric.id == "q9:g1:s2" and rubric.source.startswith("arco mu")
    assert [c.stage for c in rubric.criteria] == [2, 2, 2]
    assert sum(c.weight for c in rubric.criteria) == 1.0


def test_a_run_writes_its_methods_rubrics_each_step(tmp_path):
    state = types.SimpleNamespace(rubrics=lambda: [Rubric(id="r", criteria=[Criterion(text="x", stage=1)])])
    write_rubrics(state, tmp_path / "rubrics", step=3)
    (back,) = read_jsonl(tmp_path / "rubrics" / "step_00003.jsonl", Rubric)
    assert back.criteria[0].stage == 1
    write_rubrics(object(), tmp_path / "none", step=3)  # a method without rubrics writes nothing
    assert not (tmp_path / "none").exists()


def test_rubricem_state_gives_its_bank_reflections_one_criterion_per_line():
    import numpy as np

    bank = RubricBank(embedder=types.SimpleNamespace(encode=lambda texts: np.ones((len(texts), 4), dtype=np.float32)))
    bank.put("Who directed Nightfall Harbor?", rubrics="- names the director\n- cites the film's page\n",
             takeaways="search the film first", step=5, question_id="q1")
    (rubric,) = RubricEMState(bank=bank).rubrics()
    assert rubric.id == "bank:q1" and "step 5" in rubric.source
    assert [c.text for c in rubric.criteria] == ["names the director", "cites the film's page"]
