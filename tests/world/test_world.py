"""The embedded world: determinism, answerability of every gold chain from paragraphs (oracle EM 1.0),
unambiguous questions, distractors, splits and speed."""

import collections
import re
import time

import pytest

from components.evaluation.metrics import exact_match
from components.world import (
    QUESTION_TYPES,
    OracleError,
    generate_world,
    gold_next_query,
    gold_search_queries,
    oracle_answer,
    title_search,
)
from components.world.questions import type_counts

SMALL = {
    "n_people": 80,
    "n_films": 30,
    "n_cities": 12,
    "n_companies": 10,
    "distractors_per_entity": 1,
    "question_mix": {"bridge": 0.3, "comparison": 0.25, "inference": 0.2, "compositional": 0.25},
    "n_questions": 200,
}


@pytest.fixture(scope="module")
def world():
    return generate_world(seed=7, **SMALL)


def test_same_seed_same_world_and_different_seed_differs():
    a, b = generate_world(seed=3, **SMALL), generate_world(seed=3, **SMALL)
    assert [d.model_dump() for d in a.documents] == [d.model_dump() for d in b.documents]
    assert [q.model_dump() for q in a.questions] == [q.model_dump() for q in b.questions]
    c = generate_world(seed=4, **SMALL)
    assert [d.text for d in a.documents] != [d.text for d in c.documents]


def test_more_questions_leave_documents_unchanged():
    a = generate_world(seed=3, **SMALL)
    b = generate_world(seed=3, **{**SMALL, "n_questions": 50})
    assert a.documents == b.documents


def test_generation_is_fast():
    start = time.perf_counter()
    generate_world(seed=11, **SMALL)
    assert time.perf_counter() - start < 1.0


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize(
    "size",
    [
        SMALL,
        dict(
            SMALL,
            n_people=200,
            n_films=80,
            n_cities=30,
            n_companies=25,
            distractors_per_entity=2,
            n_questions=600,
        ),
    ],
)
def test_oracle_answers_every_question_from_paragraphs(seed, size):
    w = generate_world(seed=seed, **size)
    search = title_search(w.documents)
    em = [exact_match(oracle_answer(q, search), q.answers) for q in w.questions]
    assert len(em) == size["n_questions"]
    assert sum(em) / len(em) == 1.0


def test_oracle_rejects_a_chain_the_paragraphs_do_not_support(world):
    search = title_search(world.documents)
    q = next(q for q in world.questions if q.type == "bridge")
    broken = q.model_copy(deep=True)
    broken.gold_chain[0].answer = "Nobody Inparticular"
    with pytest.raises(OracleError, match="is not in paragraph"):
        oracle_answer(broken, search)
    skipped = q.model_copy(deep=True)
    skipped.metadata["hop_titles"] = [q.metadata["hop_titles"][1], q.metadata["hop_titles"][1]]
    with pytest.raises(OracleError, match="not known yet"):
        oracle_answer(skipped, search)


def test_records_are_well_formed(world):
    docs = {d.id: d for d in world.documents}
    assert len(docs) == len(world.documents)
    assert len({d.title for d in world.documents}) == len(world.documents)
    assert len({q.id for q in world.questions}) == len(world.questions)
    assert len({q.question for q in world.questions}) == len(world.questions)
    assert collections.Counter(q.type for q in world.questions) == {
        t: n for t, n in type_counts(SMALL["question_mix"], SMALL["n_questions"]).items() if n
    }
    for q in world.questions:
        assert q.source == "world" and q.answers and all(a.strip() for a in q.answers)
        assert q.supporting_doc_ids == list(dict.fromkeys(h.doc_id for h in q.gold_chain))
        assert all(i in docs for i in q.supporting_doc_ids)
        assert q.metadata["hop_titles"][0] in q.question
        hops = len(q.gold_chain)
        assert {
            "bridge": hops == 2,
            "inference": hops == 2,
            "compositional": hops in (3, 4),
            "comparison": hops in (2, 4),
        }[q.type], (q.type, hops)
        if q.type == "comparison":
            compare = q.metadata["compare"]
            assert compare["op"] in ("min", "max", "same")
            assert q.answers[0] in (["yes", "no"] if compare["op"] == "same" else compare["options"])


def test_all_templates_appear_and_yes_no_are_both_used():
    w = generate_world(
        seed=5, **dict(SMALL, n_people=200, n_films=80, n_cities=30, n_companies=25, n_questions=800)
    )
    templates = {q.metadata["template"] for q in w.questions}
    assert len(templates) >= 27
    answers = collections.Counter(q.answers[0] for q in w.questions)
    assert answers["yes"] > 0 and answers["no"] > 0


def test_the_film_directed_by_x_is_unique_among_all_paragraphs(world):
    """Over real and distractor paragraphs alike, X directed exactly one film."""
    directed = [q for q in world.questions if q.metadata["template"].startswith("directed_company")]
    assert directed
    for q in directed:
        person = q.metadata["hop_titles"][0]
        films = [d for d in world.documents if re.search(rf"[Dd]irected by {re.escape(person)}\b", d.text)]
        assert len(films) == 1 and films[0].title == q.gold_chain[0].answer


def test_questions_agree_with_the_ground_truth_entities(world):
    ents = world.entities
    for q in world.questions:
        t, first = q.metadata["template"], q.metadata["hop_titles"][0]
        if t == "kin_father_father":
            assert q.answers[0] == ents.people[ents.people[first].father].father
        elif t == "kin_spouse_mother":
            assert q.answers[0] == ents.people[ents.people[first].spouse].mother
        elif t == "director_birth_city":
            assert q.answers[0] == ents.people[ents.films[first].director].birth_city
        elif t == "directed_company_founded":
            (film,) = ents.people[first].films
            assert q.answers[0] == str(ents.companies[ents.films[film].company].founded)


def test_distractors_are_similar_but_distinct(world):
    n_entities = sum(SMALL[k] for k in ("n_people", "n_films", "n_cities", "n_companies"))
    assert len(world.distractor_ids) == SMALL["distractors_per_entity"] * n_entities
    real_titles = {d.title for d in world.documents if d.id not in set(world.distractor_ids)}
    real_words = {w for title in real_titles for w in title.split()}
    by_id = {d.id: d for d in world.documents}
    near = 0
    for i in world.distractor_ids:
        title = by_id[i].title
        assert title not in real_titles
        near += any(w in real_words for w in title.split())
    assert near / len(world.distractor_ids) > 0.5  # most share a name part with a real entity
    none = generate_world(seed=7, **dict(SMALL, distractors_per_entity=0))
    assert none.distractor_ids == [] and len(none.documents) == len(world.documents) - len(
        world.distractor_ids
    )


def test_gold_search_queries_and_next_query(world):
    q = next(q for q in world.questions if q.metadata["template"] == "same_birth_country")
    queries = gold_search_queries(q)
    assert queries == list(dict.fromkeys(q.metadata["hop_titles"]))
    assert gold_next_query(q, []) == queries[0]
    assert gold_next_query(q, [queries[0].upper()]) == queries[1]
    assert gold_next_query(q, queries) is None


def test_split_is_deterministic_disjoint_and_sets_split(world):
    parts = world.split(train=120, dev=40, test=40)
    assert {k: len(v) for k, v in parts.items()} == {"train": 120, "dev": 40, "test": 40}
    ids = [q.id for part in parts.values() for q in part]
    assert len(set(ids)) == 200
    assert all(q.split == name for name, part in parts.items() for q in part)
    assert world.split(train=120, dev=40, test=40) == parts
    assert world.questions[0].split == "dev"  # the world's own list is not modified
    with pytest.raises(ValueError, match="exceeds"):
        world.split(train=150, dev=40, test=40)


def test_bad_arguments_name_the_argument():
    with pytest.raises(ValueError, match="unknown types"):
        generate_world(seed=0, **dict(SMALL, question_mix={"bridge": 1.0, "trivia": 1.0}))
    with pytest.raises(ValueError, match="n_people"):
        generate_world(seed=0, **dict(SMALL, n_people=0))
    with pytest.raises(ValueError, match="distractors_per_entity"):
        generate_world(seed=0, **dict(SMALL, distractors_per_entity=-1))
    with pytest.raises(ValueError, match="could make only"):
        generate_world(
            seed=0, **dict(SMALL, n_people=6, n_films=2, n_cities=2, n_companies=1, n_questions=300)
        )


def test_type_counts_largest_remainder():
    assert type_counts({"bridge": 1, "comparison": 1, "inference": 1}, 10) == {
        "bridge": 4,
        "comparison": 3,
        "inference": 3,
        "compositional": 0,
    }
    assert sum(type_counts({t: 0.25 for t in QUESTION_TYPES}, 7).values()) == 7
