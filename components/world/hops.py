"""Single-hop sub-questions over the world's entities, and ``Draft``, a question before it becomes a
``Question`` record. A hop is (sub-question, answer, title of the paragraph that states the answer).

    Hops(entities).director("The Glass Harbor")
    # ('Who directed the film The Glass Harbor?', 'Torvel Ashmere', 'The Glass Harbor')
"""

from __future__ import annotations

from dataclasses import dataclass

from components.world.entities import Entities

Hop = tuple[str, str, str]


@dataclass
class Draft:
    """A generated question: type, template id, text, answers, hops, comparison rule (see ``questions``)."""

    type: str
    template: str
    text: str
    answers: list[str]
    hops: list[Hop]
    compare: dict | None = None


class Hops:
    """Single-hop sub-questions, each read from the paragraph of the entity it is about."""

    def __init__(self, ents: Entities):
        self.e = ents

    def director(self, film: str) -> Hop:
        return f"Who directed the film {film}?", self.e.films[film].director, film

    def release(self, film: str) -> Hop:
        return f"In what year was {film} released?", str(self.e.films[film].year), film

    def company(self, film: str) -> Hop:
        return f"Which company produced {film}?", self.e.films[film].company, film

    def film_of(self, person: str) -> Hop:
        return f"Which film did {person} direct?", self.e.people[person].films[0], person

    def birth_city(self, person: str) -> Hop:
        return f"In which city was {person} born?", self.e.people[person].birth_city, person

    def birth_year(self, person: str) -> Hop:
        return f"In what year was {person} born?", str(self.e.people[person].birth_year), person

    def father(self, person: str) -> Hop:
        return f"Who is the father of {person}?", self.e.people[person].father, person

    def mother(self, person: str) -> Hop:
        return f"Who is the mother of {person}?", self.e.people[person].mother, person

    def spouse(self, person: str) -> Hop:
        return f"Who is the spouse of {person}?", self.e.people[person].spouse, person

    def occupation(self, person: str) -> Hop:
        return f"What is the occupation of {person}?", self.e.people[person].occupation, person

    def employer(self, person: str) -> Hop:
        return f"Which company did {person} work for?", self.e.people[person].employer, person

    def country(self, city: str) -> Hop:
        return f"In which country is {city}?", self.e.cities[city].country, city

    def city_founded(self, city: str) -> Hop:
        return f"In what year was {city} founded?", str(self.e.cities[city].founded), city

    def population(self, city: str) -> Hop:
        return f"What is the population of {city}?", f"{self.e.cities[city].population:,}", city

    def founder(self, company: str) -> Hop:
        return f"Who founded {company}?", self.e.companies[company].founder, company

    def founded(self, company: str) -> Hop:
        return f"In what year was {company} founded?", str(self.e.companies[company].founded), company

    def headquarters(self, company: str) -> Hop:
        return f"Where is {company} headquartered?", self.e.companies[company].headquarters, company
