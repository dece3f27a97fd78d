"""Encyclopedia-style paragraphs for the world's entities, and distractor paragraphs.

Each entity becomes one paragraph titled with its name; sentence templates are drawn from a seeded
``random.Random`` so paragraphs vary in wording. Every attribute and relation the question generator
asks about is stated in the paragraph of the entity it belongs to (a person's paragraph names the
parents, spouse, children, employer, the films directed and the company founded; a film's paragraph
names its director, release year, genre and producing company; and so on).

Distractors look like real entities (a similar name: one vowel changed, a "Return to ..." sequel, a
"New ..." city, a sister company) with different attributes. They never take part in a relation that a
question reads backwards (they direct no real person's films, marry nobody real, found no real company),
so every question stays uniquely answerable. ``build_paragraphs`` returns (title, text, is_distractor).
"""

from __future__ import annotations

import random

from components.world.entities import GENRES, OCCUPATIONS, City, Company, Entities, Film, Person
from components.world.names import NameMaker


def _an(word: str) -> str:
    return ("an " if word[0].lower() in "aeiou" else "a ") + word


def _year_article(year: int) -> str:
    return "an" if str(year).startswith(("8", "11", "18")) else "a"


def _join(items: list[str]) -> str:
    return items[0] if len(items) == 1 else ", ".join(items[:-1]) + " and " + items[-1]


def _population(n: int) -> str:
    return f"{n:,}"


def person_text(p: Person, ents: Entities, rng: random.Random) -> str:
    he, his = ("he", "his") if p.gender == "m" else ("she", "her")
    He, His = he.capitalize(), his.capitalize()
    # the older generations are written about in the past tense
    be, are = ("was", "were") if p.birth_year < 1930 else ("is", "are")
    demonym = ents.nationality(p).demonym
    job = f"{demonym} {p.occupation}"
    out = [
        rng.choice(
            [
                f"{p.name} (born {p.birth_year}) {be} {_an(job)}.",
                f"{p.name} {be} {_an(job)}, born in {p.birth_year}.",
                f"Born in {p.birth_year}, {p.name} {be} {_an(job)}.",
            ]
        )
    ]
    out.append(
        rng.choice(
            [
                f"{He} was born in {p.birth_city}.",
                f"{p.name}'s birthplace {be} {p.birth_city}.",
                f"{He} grew up in {p.birth_city}, the city where {he} was born.",
            ]
        )
    )
    if p.father and p.mother:
        child = "son" if p.gender == "m" else "daughter"
        out.append(
            rng.choice(
                [
                    f"{He} {be} the {child} of {p.father} and his wife {p.mother}.",
                    f"{His} father {be} {p.father} and {his} mother {be} {p.mother}.",
                    f"{p.name}'s parents {are} {p.father}, {his} father, and {p.mother}, {his} mother.",
                ]
            )
        )
    if p.spouse:
        partner = "wife" if p.gender == "m" else "husband"
        out.append(
            rng.choice(
                [
                    f"{He} {be} married to {p.spouse}.",
                    f"{His} {partner} {be} {p.spouse}.",
                    f"{He} married {p.spouse}.",
                ]
            )
        )
    if p.children:
        kids = _join(p.children)
        out.append(
            rng.choice(
                [
                    f"{His} child {be} {kids}." if len(p.children) == 1 else f"{His} children {are} {kids}.",
                    f"{He} {be} the parent of {kids}.",
                ]
            )
        )
    if p.employer:
        out.append(
            rng.choice(
                [
                    f"{He} worked for {p.employer}.",
                    f"For most of {his} career {he} was employed by {p.employer}.",
                    f"{p.name} joined {p.employer} as {_an(p.occupation)}.",
                ]
            )
        )
    if p.films:
        films = _join([f"{t} ({ents.films[t].year})" for t in p.films])
        out.append(
            rng.choice(
                [
                    f"{He} directed {films}.",
                    f"As a director, {he} made {films}.",
                    f"{p.name}'s films as director {are} {films}.",
                ]
            )
        )
    if p.founded:
        out.append(
            rng.choice(
                [
                    f"{He} founded {p.founded}.",
                    f"{p.name} {be} the founder of {p.founded}.",
                ]
            )
        )
    return " ".join(out)


def film_text(f: Film, rng: random.Random) -> str:
    title, year, genre, director, company = f.title, f.year, f.genre, f.director, f.company
    return rng.choice(
        [
            f"{title} is {_year_article(year)} {year} {genre} film directed by {director}. "
            + f"It was produced by {company}.",
            f"{title} is {_an(genre)} film released in {year}. "
            + f"Directed by {director}, it was produced by {company}.",
            f"Directed by {director} and produced by {company}, "
            + f"{title} is {_an(genre)} film that was released in {year}.",
        ]
    )


def city_text(c: City, ents: Entities, rng: random.Random) -> str:
    formal, pop = ents.countries[c.country].formal_name, _population(c.population)
    text = rng.choice(
        [
            f"{c.name} is a city in {c.country}. It was founded in {c.founded} and has {pop} inhabitants.",
            f"{c.name}, founded in {c.founded}, is a city of {pop} inhabitants in the {formal}.",
            f"Founded in {c.founded}, {c.name} is a city in the {formal}; its population is {pop}.",
        ]
    )
    if ents.countries[c.country].capital == c.name:
        text += f" It is the capital of {c.country}."
    return text


def company_text(c: Company, rng: random.Random) -> str:
    name, year, founder, hq = c.name, c.founded, c.founder, c.headquarters
    return rng.choice(
        [
            f"{name} is a film production company founded in {year} by {founder}. It is based in {hq}.",
            f"{name} was founded by {founder} in {year}; its headquarters are in {hq}.",
            f"Headquartered in {hq}, {name} is a production company that {founder} founded in {year}.",
        ]
    )


def country_text(name: str, ents: Entities, rng: random.Random) -> str:
    c = ents.countries[name]
    return rng.choice(
        [
            f"{c.name}, officially the {c.formal_name}, is a country. "
            + f"Its capital is {c.capital}. Its people are called {c.demonym}s.",
            f"The {c.formal_name}, usually called {c.name}, is a country whose capital is {c.capital}. "
            + f"The adjective for its people is {c.demonym}.",
        ]
    )


# ---- distractors --------------------------------------------------------------------------------------
def _other_year(rng: random.Random, year: int, lo: int, hi: int) -> int:
    choices = [y for y in range(max(lo, year - 15), min(hi, year + 15) + 1) if y != year]
    return rng.choice(choices)


def _distractor_person(p: Person, ents: Entities, names: NameMaker, rng: random.Random) -> Person:
    d = Person(
        names.variant(p.name, "person", p.gender),
        p.gender,
        _other_year(rng, p.birth_year, 1840, 2000),
        rng.choice(list(ents.cities)),
        rng.choice(OCCUPATIONS),
    )
    if rng.random() < 0.6:
        d.father, d.mother = names.person("m"), names.person("f")
    if rng.random() < 0.6:
        d.spouse = names.person("f" if p.gender == "m" else "m")
    if ents.companies and rng.random() < 0.5:
        d.employer = rng.choice(list(ents.companies))
    return d


def _distractor_film(f: Film, ents: Entities, names: NameMaker, rng: random.Random) -> Film:
    director = names.variant(f.director, "person", ents.people[f.director].gender)
    return Film(
        names.variant(f.title, "film"),
        director,
        _other_year(rng, f.year, 1880, 2024),
        rng.choice(GENRES),
        rng.choice(list(ents.companies)),
    )


def _distractor_city(c: City, ents: Entities, names: NameMaker, rng: random.Random) -> City:
    return City(
        names.variant(c.name, "city"),
        rng.choice(list(ents.countries)),
        _other_year(rng, c.founded, 600, 1990),
        rng.randint(30, 30000) * 100,
    )


def _distractor_company(c: Company, ents: Entities, names: NameMaker, rng: random.Random) -> Company:
    founder = names.variant(c.founder, "person", ents.people[c.founder].gender)
    return Company(
        names.variant(c.name, "company"),
        founder,
        rng.choice(list(ents.cities)),
        _other_year(rng, c.founded, 1850, 2020),
    )


def build_paragraphs(
    ents: Entities, names: NameMaker, rng: random.Random, distractors_per_entity: int
) -> list[tuple[str, str, bool]]:
    """All paragraphs of the world: (title, text, is_distractor), real ones first, in a fixed order."""
    if not isinstance(distractors_per_entity, int) or distractors_per_entity < 0:
        raise ValueError(f"distractors_per_entity must be an integer >= 0, got {distractors_per_entity!r}")
    out: list[tuple[str, str, bool]] = []
    out += [(c, country_text(c, ents, rng), False) for c in ents.countries]
    out += [(c.name, city_text(c, ents, rng), False) for c in ents.cities.values()]
    out += [(p.name, person_text(p, ents, rng), False) for p in ents.people.values()]
    out += [(f.title, film_text(f, rng), False) for f in ents.films.values()]
    out += [(c.name, company_text(c, rng), False) for c in ents.companies.values()]
    for _ in range(distractors_per_entity):
        for c in ents.cities.values():
            d = _distractor_city(c, ents, names, rng)
            out.append((d.name, city_text(d, ents, rng), True))
        for p in ents.people.values():
            d = _distractor_person(p, ents, names, rng)
            out.append((d.name, person_text(d, ents, rng), True))
        for f in ents.films.values():
            d = _distractor_film(f, ents, names, rng)
            out.append((d.title, film_text(d, rng), True))
        for c in ents.companies.values():
            d = _distractor_company(c, ents, names, rng)
            out.append((d.name, company_text(d, rng), True))
    return out


def distractor_sources(ents: Entities, distractors_per_entity: int) -> list[str]:
    """The title each distractor of ``build_paragraphs`` imitates, in the order it appends them (its
    look-alike: "Return to The Glass Harbor" imitates "The Glass Harbor")."""
    one_round = [c.name for c in ents.cities.values()] + [p.name for p in ents.people.values()]
    one_round += [f.title for f in ents.films.values()] + [c.name for c in ents.companies.values()]
    return one_round * distractors_per_entity
