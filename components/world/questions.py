"""Question templates over the world's entities: bridge, comparison, inference, compositional.

A template picks entities with a seeded ``random.Random`` and returns a ``Draft``: the question text, the
gold answers (canonical first, then aliases), and the hops. A hop is (sub-question, answer, title of the
paragraph that states the answer); the title looked up at hop k is always named in the question or is an
earlier hop's answer, so the chain can be followed by title lookups alone (see ``oracle``).

Uniqueness rules: "the film directed by X" only for X with exactly one film; comparisons never tie
(distinct years and populations); kinship questions only where every relative on the path exists.
Comparison drafts carry ``compare``: {"op": "min" | "max" | "same", "options": [A, B], "value_hops":
[i, j]}: the answer is the option whose value (answer of hop i or j) is smaller / larger, or yes / no
whether the two values are equal.
"""

from __future__ import annotations

import random
from collections.abc import Callable

from components.world.comparisons import ComparisonTemplates
from components.world.entities import DIRECTOR, Entities, Person
from components.world.hops import Draft, Hop, Hops

QUESTION_TYPES = ("bridge", "comparison", "inference", "compositional")


class Templates(ComparisonTemplates):
    """All templates; ``by_type[t]`` lists (template id, function). A function returns None when the
    world has no entities that fit (e.g. nobody with a known paternal grandfather)."""

    def __init__(self, ents: Entities, rng: random.Random):
        self.e, self.rng, self.h = ents, rng, Hops(ents)
        people = list(ents.people.values())
        self.people = [p.name for p in people]
        self.films, self.cities, self.companies = list(ents.films), list(ents.cities), list(ents.companies)
        self.single_directors = [p.name for p in people if len(p.films) == 1]
        self.employed = [p.name for p in people if p.employer]
        self.married = [p.name for p in people if p.spouse]

        def has(p: Person, *path: str) -> bool:
            for rel in path:
                name = getattr(p, rel)
                if name is None:
                    return False
                p = ents.people[name]
            return True

        self.kin = {
            path: [p.name for p in people if has(p, *path)]
            for path in [
                ("father", "father"),
                ("father", "mother"),
                ("mother", "father"),
                ("mother", "mother"),
                ("spouse", "father"),
                ("spouse", "mother"),
            ]
        }
        self.directed_married = [f for f in self.films if ents.people[ents.films[f].director].spouse]
        self.directed_by_child = [f for f in self.films if ents.people[ents.films[f].director].father]
        self.by_type: dict[str, list[tuple[str, Callable[[], Draft | None]]]] = {
            "bridge": [
                ("director_birth_city", self.director_birth_city),
                ("company_founder", self.company_founder),
                ("birth_country", self.birth_country),
                ("employer_founded", self.employer_founded),
                ("spouse_occupation", self.spouse_occupation),
                ("director_birth_year", self.director_birth_year),
                ("hq_country", self.hq_country),
                ("company_hq", self.company_hq),
            ],
            "comparison": [
                ("film_release", self.film_release),
                ("person_birth", self.person_birth),
                ("city_founded", self.city_founded),
                ("city_population", self.city_population),
                ("company_founded", self.company_founded),
                ("same_birth_country", self.same_birth_country),
                ("same_director", self.same_director),
            ],
            "inference": [(f"kin_{a}_{b}", self._kin(a, b)) for a, b in self.kin],
            "compositional": [
                ("directed_company_founded", self.directed_company_founded),
                ("directed_company_country", self.directed_company_country),
                ("directed_company_founder", self.directed_company_founder),
                ("director_spouse_city", self.director_spouse_city),
                ("founder_birthplace_founded", self.founder_birthplace_founded),
                ("director_father_country", self.director_father_country),
                ("employer_founder_birth", self.employer_founder_birth),
            ],
        }

    def _country_answers(self, name: str) -> list[str]:
        return [name, self.e.countries[name].formal_name]

    # ---- bridge (2 hops) ------------------------------------------------------------------------
    def _chain(
        self, kind: str, tid: str, text: str, hops: list[Hop], answers: list[str] | None = None
    ) -> Draft:
        return Draft(kind, tid, text, answers or [hops[-1][1]], hops)

    def director_birth_city(self) -> Draft:
        f = self.rng.choice(self.films)
        d = self.h.director(f)
        text = self.rng.choice(
            [f"In which city was the director of the film {f} born?", f"Where was the director of {f} born?"]
        )
        return self._chain("bridge", "director_birth_city", text, [d, self.h.birth_city(d[1])])

    def director_birth_year(self) -> Draft:
        f = self.rng.choice(self.films)
        d = self.h.director(f)
        return self._chain(
            "bridge",
            "director_birth_year",
            f"In what year was the director of {f} born?",
            [d, self.h.birth_year(d[1])],
        )

    def company_founder(self) -> Draft:
        f = self.rng.choice(self.films)
        c = self.h.company(f)
        return self._chain(
            "bridge",
            "company_founder",
            f"Who founded the company that produced {f}?",
            [c, self.h.founder(c[1])],
        )

    def company_hq(self) -> Draft:
        f = self.rng.choice(self.films)
        c = self.h.company(f)
        return self._chain(
            "bridge",
            "company_hq",
            f"In which city is the company that produced {f} headquartered?",
            [c, self.h.headquarters(c[1])],
        )

    def birth_country(self) -> Draft:
        p = self.rng.choice(self.people)
        b = self.h.birth_city(p)
        k = self.h.country(b[1])
        return self._chain(
            "bridge", "birth_country", f"In which country was {p} born?", [b, k], self._country_answers(k[1])
        )

    def hq_country(self) -> Draft:
        c = self.rng.choice(self.companies)
        hq = self.h.headquarters(c)
        k = self.h.country(hq[1])
        return self._chain(
            "bridge",
            "hq_country",
            f"In which country is {c} headquartered?",
            [hq, k],
            self._country_answers(k[1]),
        )

    def employer_founded(self) -> Draft | None:
        p = self._pick(self.employed)
        if p is None:
            return None
        emp = self.h.employer(p)
        return self._chain(
            "bridge",
            "employer_founded",
            f"In what year was the company {p} worked for founded?",
            [emp, self.h.founded(emp[1])],
        )

    def spouse_occupation(self) -> Draft | None:
        p = self._pick(self.married)
        if p is None:
            return None
        s = self.h.spouse(p)
        occ = self.h.occupation(s[1])
        answers = [occ[1], "director"] if occ[1] == DIRECTOR else [occ[1]]
        return self._chain(
            "bridge", "spouse_occupation", f"What is the occupation of the spouse of {p}?", [s, occ], answers
        )

    # ---- compositional (3-4 hops, MuSiQue style) ----------------------------------------------------
    def _directed(self) -> tuple[str, Hop, Hop] | None:
        x = self._pick(self.single_directors)
        if x is None:
            return None
        film = self.h.film_of(x)
        return x, film, self.h.company(film[1])

    def directed_company_founded(self) -> Draft | None:
        got = self._directed()
        if got is None:
            return None
        x, film, comp = got
        return self._chain(
            "compositional",
            "directed_company_founded",
            f"In what year was the company that produced the film directed by {x} founded?",
            [film, comp, self.h.founded(comp[1])],
        )

    def directed_company_founder(self) -> Draft | None:
        got = self._directed()
        if got is None:
            return None
        x, film, comp = got
        return self._chain(
            "compositional",
            "directed_company_founder",
            f"Who founded the company that produced the film directed by {x}?",
            [film, comp, self.h.founder(comp[1])],
        )

    def directed_company_country(self) -> Draft | None:
        got = self._directed()
        if got is None:
            return None
        x, film, comp = got
        hq = self.h.headquarters(comp[1])
        k = self.h.country(hq[1])
        return self._chain(
            "compositional",
            "directed_company_country",
            f"In which country is the headquarters of the company that produced the film directed by {x}?",
            [film, comp, hq, k],
            self._country_answers(k[1]),
        )

    def director_spouse_city(self) -> Draft | None:
        f = self._pick(self.directed_married)
        if f is None:
            return None
        d = self.h.director(f)
        s = self.h.spouse(d[1])
        return self._chain(
            "compositional",
            "director_spouse_city",
            f"In which city was the spouse of the director of {f} born?",
            [d, s, self.h.birth_city(s[1])],
        )

    def founder_birthplace_founded(self) -> Draft:
        f = self.rng.choice(self.films)
        comp = self.h.company(f)
        founder = self.h.founder(comp[1])
        city = self.h.birth_city(founder[1])
        return self._chain(
            "compositional",
            "founder_birthplace_founded",
            f"In what year was the birthplace of the founder of the company that produced {f} founded?",
            [comp, founder, city, self.h.city_founded(city[1])],
        )

    def director_father_country(self) -> Draft | None:
        f = self._pick(self.directed_by_child)
        if f is None:
            return None
        d = self.h.director(f)
        father = self.h.father(d[1])
        city = self.h.birth_city(father[1])
        k = self.h.country(city[1])
        return self._chain(
            "compositional",
            "director_father_country",
            f"In which country was the father of the director of {f} born?",
            [d, father, city, k],
            self._country_answers(k[1]),
        )

    def employer_founder_birth(self) -> Draft | None:
        p = self._pick(self.employed)
        if p is None:
            return None
        emp = self.h.employer(p)
        founder = self.h.founder(emp[1])
        return self._chain(
            "compositional",
            "employer_founder_birth",
            f"In what year was the founder of the company {p} worked for born?",
            [emp, founder, self.h.birth_year(founder[1])],
        )


def type_counts(question_mix: dict[str, float], n_questions: int) -> dict[str, int]:
    """Split ``n_questions`` by the mix's fractions (largest remainder, ties in QUESTION_TYPES order)."""
    unknown = sorted(set(question_mix) - set(QUESTION_TYPES))
    if unknown:
        raise ValueError(f"question_mix has unknown types {unknown}; known: {list(QUESTION_TYPES)}")
    for key, value in question_mix.items():
        if not isinstance(value, (int, float)) or value < 0:
            raise ValueError(f"question_mix[{key!r}] must be a number >= 0, got {value!r}")
    total = float(sum(question_mix.values()))
    if total <= 0:
        raise ValueError("question_mix needs at least one positive fraction")
    if not isinstance(n_questions, int) or n_questions < 0:
        raise ValueError(f"n_questions must be an integer >= 0, got {n_questions!r}")
    exact = {t: n_questions * question_mix.get(t, 0.0) / total for t in QUESTION_TYPES}
    counts = {t: int(v) for t, v in exact.items()}
    rest = n_questions - sum(counts.values())
    for t in sorted(QUESTION_TYPES, key=lambda t: (-(exact[t] - counts[t]), QUESTION_TYPES.index(t)))[:rest]:
        counts[t] += 1
    return counts


def make_drafts(ents: Entities, rng: random.Random, counts: dict[str, int]) -> list[Draft]:
    """Distinct drafts, ``counts[t]`` of each type, templates drawn uniformly within a type."""
    templates = Templates(ents, rng)
    seen: set[str] = set()
    drafts: list[Draft] = []
    for kind in QUESTION_TYPES:
        want, made, tries = counts.get(kind, 0), 0, 0
        options = templates.by_type[kind]
        while made < want and tries < 60 * want + 200:
            tries += 1
            draft = rng.choice(options)[1]()
            if draft is None or draft.text in seen:
                continue
            seen.add(draft.text)
            drafts.append(draft)
            made += 1
        if made < want:
            raise ValueError(
                f"could make only {made} distinct {kind} questions of the {want} asked; "
                f"enlarge the world (n_people, n_films, ...) or lower n_questions"
            )
    return drafts
