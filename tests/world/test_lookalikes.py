"""``World.lookalikes``: every distractor paragraph is filed under the one real paragraph it imitates."""

import difflib

import pytest

from components.world import generate_world


@pytest.mark.parametrize("per_entity", [0, 1, 2])
def test_each_distractor_imitates_one_real_paragraph(per_entity):
    world = generate_world(seed=3, n_people=40, n_films=15, n_cities=8, n_companies=6,
                           distractors_per_entity=per_entity, question_mix=None, n_questions=20)
    by_id = {d.id: d for d in world.documents}
    filed = [d for ids in world.lookalikes.values() for d in ids]
    assert sorted(filed) == sorted(world.distractor_ids) and len(filed) == len(set(filed))
    assert not set(world.lookalikes) & set(world.distractor_ids)
    assert all(len(ids) == per_entity for ids in world.lookalikes.values())
    ents = world.entities
    assert len(world.lookalikes) == (len(ents.people) + len(ents.films) + len(ents.cities) + len(ents.companies)
                                     if per_entity else 0)
    kinds = {**{p: "person" for p in ents.people}, **{f: "film" for f in ents.films},
             **{c: "city" for c in ents.cities}, **{c: "company" for c in ents.companies}}
    for real, fakes in world.lookalikes.items():
        a = by_id[real].title
        for fake in fakes:
            b = by_id[fake].title
            shared = (set(a.split()) & set(b.split())) - {"The", "the", "of", "to"}
            # a variant keeps a name word (first or last name, a film's or company's core) or changes one vowel
            assert shared or difflib.SequenceMatcher(None, a, b).ratio() > 0.8, (a, b)
            assert kind_of(by_id[fake].text) == kind_of(by_id[real].text) == kinds[a], (a, b)


def kind_of(text: str) -> str:
    """The kind of entity a paragraph describes, from words only its templates use (see world.render)."""
    if "inhabitants" in text or "population" in text:
        return "city"
    if "irected by" in text:
        return "film"
    return "company" if "company" in text or "eadquarter" in text else "person"
