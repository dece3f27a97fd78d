"""Comparison and inference question templates (a mixin of ``questions.Templates``).

Comparison: two entities of a kind named in the question, one hop each for the compared value (or two
hops each, e.g. person -> birth city -> country); never a tie. ``Draft.compare`` records how the answer
follows from the hop answers. Inference: 2Wiki-style kinship (grandparents, parents-in-law) through two
"father / mother / spouse" hops, only where both relatives exist.
"""

from __future__ import annotations

import random
from collections.abc import Callable
from typing import ClassVar

from components.world.entities import Entities
from components.world.hops import Draft, Hop, Hops


class ComparisonTemplates:
    e: Entities
    rng: random.Random
    h: Hops
    people: list[str]
    films: list[str]
    cities: list[str]
    companies: list[str]
    kin: dict[tuple[str, str], list[str]]

    def _pick(self, pool: list[str]) -> str | None:
        return self.rng.choice(pool) if pool else None

    # ---- comparison ------------------------------------------------------------------------------
    def _compare(
        self,
        tid: str,
        pool: list[str],
        hop: Callable[[str], Hop],
        value: Callable[[str], int],
        wording: list[tuple[str, str]],
    ) -> Draft | None:
        if len(pool) < 2:
            return None
        a, b = self.rng.sample(pool, 2)
        if value(a) == value(b):
            return None
        text, op = self.rng.choice(wording)
        winner = min((a, b), key=value) if op == "min" else max((a, b), key=value)
        return Draft(
            "comparison",
            tid,
            text.format(a=a, b=b),
            [winner],
            [hop(a), hop(b)],
            {"op": op, "options": [a, b], "value_hops": [0, 1]},
        )

    def film_release(self) -> Draft | None:
        return self._compare(
            "film_release",
            self.films,
            self.h.release,
            lambda f: self.e.films[f].year,
            [
                ("Which film was released first, {a} or {b}?", "min"),
                ("Which film came out later, {a} or {b}?", "max"),
            ],
        )

    def person_birth(self) -> Draft | None:
        return self._compare(
            "person_birth",
            self.people,
            self.h.birth_year,
            lambda p: self.e.people[p].birth_year,
            [("Who was born first, {a} or {b}?", "min"), ("Who is younger, {a} or {b}?", "max")],
        )

    def city_founded(self) -> Draft | None:
        return self._compare(
            "city_founded",
            self.cities,
            self.h.city_founded,
            lambda c: self.e.cities[c].founded,
            [
                ("Which city was founded earlier, {a} or {b}?", "min"),
                ("Which city is more recent, {a} or {b}?", "max"),
            ],
        )

    def city_population(self) -> Draft | None:
        return self._compare(
            "city_population",
            self.cities,
            self.h.population,
            lambda c: self.e.cities[c].population,
            [
                ("Which city has the larger population, {a} or {b}?", "max"),
                ("Which city has fewer inhabitants, {a} or {b}?", "min"),
            ],
        )

    def company_founded(self) -> Draft | None:
        return self._compare(
            "company_founded",
            self.companies,
            self.h.founded,
            lambda c: self.e.companies[c].founded,
            [
                ("Which company was founded first, {a} or {b}?", "min"),
                ("Which company is younger, {a} or {b}?", "max"),
            ],
        )

    def _pair(self, pool: list[str], key: Callable[[str], str]) -> tuple[str, str, bool] | None:
        """Two distinct items, aiming at equal keys half of the time (so yes and no are balanced)."""
        if len(pool) < 2:
            return None
        want_same = self.rng.random() < 0.5
        a = self.rng.choice(pool)
        options = [b for b in pool if b != a and (key(b) == key(a)) == want_same]
        if not options:
            return None
        b = self.rng.choice(options)
        return a, b, want_same

    def same_birth_country(self) -> Draft | None:
        pair = self._pair(self.people, lambda p: self.e.nationality(self.e.people[p]).name)
        if pair is None:
            return None
        a, b, same = pair
        ca, cb = self.h.birth_city(a), self.h.birth_city(b)
        hops = [ca, self.h.country(ca[1]), cb, self.h.country(cb[1])]
        return Draft(
            "comparison",
            "same_birth_country",
            f"Were {a} and {b} born in the same country?",
            ["yes" if same else "no"],
            hops,
            {"op": "same", "options": [a, b], "value_hops": [1, 3]},
        )

    def same_director(self) -> Draft | None:
        pair = self._pair(self.films, lambda f: self.e.films[f].director)
        if pair is None:
            return None
        a, b, same = pair
        return Draft(
            "comparison",
            "same_director",
            f"Were {a} and {b} directed by the same person?",
            ["yes" if same else "no"],
            [self.h.director(a), self.h.director(b)],
            {"op": "same", "options": [a, b], "value_hops": [0, 1]},
        )

    # ---- inference (2Wiki style kinship, 2 hops) --------------------------------------------------
    _KIN_NAMES: ClassVar[dict[tuple[str, str], str]] = {
        ("father", "father"): "paternal grandfather",
        ("father", "mother"): "paternal grandmother",
        ("mother", "father"): "maternal grandfather",
        ("mother", "mother"): "maternal grandmother",
        ("spouse", "father"): "father-in-law",
        ("spouse", "mother"): "mother-in-law",
    }

    def _kin(self, first: str, second: str) -> Callable[[], Draft | None]:
        def make() -> Draft | None:
            p = self._pick(self.kin[(first, second)])
            if p is None:
                return None
            h1 = getattr(self.h, first)(p)
            h2 = getattr(self.h, second)(h1[1])
            return Draft(
                "inference",
                f"kin_{first}_{second}",
                f"Who is the {self._KIN_NAMES[(first, second)]} of {p}?",
                [h2[1]],
                [h1, h2],
            )

        return make
