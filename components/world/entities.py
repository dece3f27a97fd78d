"""Entities of the embedded world and their seeded construction (no text here; see ``render``).

Relations are stored by name (names are unique across the world, see ``names.NameMaker``), so an entity
is plain data and ``Entities`` is a set of dicts keyed by name.

    import random
    from components.world.names import NameMaker
    ents = build_entities(random.Random(0), NameMaker(random.Random(1)), n_people=80, n_films=30,
                          n_cities=12, n_companies=10)
    ents.people["Torvel Ashmere"].birth_city

Construction order: countries, cities, people in families (root couples, their children, married-in
spouses, up to three generations), company founders, film directors and films, employers. Invariants the
question generator relies on: each person founds at most one company; every film has one director
and one producing company founded no later than the film's release; every child has both parents in the
world; a married-in spouse has no parents in the world; city founding years and populations are distinct.
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from components.world.names import NameMaker

OCCUPATIONS = [
    "architect",
    "painter",
    "engineer",
    "novelist",
    "composer",
    "physician",
    "economist",
    "photographer",
    "actor",
    "journalist",
    "botanist",
    "sculptor",
    "chemist",
    "diplomat",
]
DIRECTOR = "film director"
GENRES = [
    "drama",
    "comedy",
    "thriller",
    "western",
    "musical",
    "science fiction",
    "horror",
    "romance",
    "war",
    "documentary",
    "crime",
    "adventure",
]
LAST_YEAR = 2024


@dataclass
class Country:
    name: str
    formal_name: str
    demonym: str
    capital: str | None = None


@dataclass
class City:
    name: str
    country: str
    founded: int
    population: int


@dataclass
class Person:
    name: str
    gender: str  # "m" or "f"
    birth_year: int
    birth_city: str
    occupation: str
    father: str | None = None
    mother: str | None = None
    spouse: str | None = None
    children: list[str] = field(default_factory=list)
    employer: str | None = None
    films: list[str] = field(default_factory=list)  # titles directed, in release order
    founded: str | None = None  # company founded


@dataclass
class Film:
    title: str
    director: str
    year: int
    genre: str
    company: str


@dataclass
class Company:
    name: str
    founder: str
    headquarters: str
    founded: int


@dataclass
class Entities:
    countries: dict[str, Country] = field(default_factory=dict)
    cities: dict[str, City] = field(default_factory=dict)
    people: dict[str, Person] = field(default_factory=dict)
    films: dict[str, Film] = field(default_factory=dict)
    companies: dict[str, Company] = field(default_factory=dict)

    def country_of_city(self, city: str) -> Country:
        return self.countries[self.cities[city].country]

    def nationality(self, person: Person) -> Country:
        """A person's nationality is the country of their birth city."""
        return self.country_of_city(person.birth_city)


def _distinct_ints(rng: random.Random, n: int, lo: int, hi: int, step: int = 1) -> list[int]:
    return [lo + step * k for k in rng.sample(range((hi - lo) // step + 1), n)]


def _build_places(rng: random.Random, names: NameMaker, ents: Entities, n_cities: int) -> None:
    n_countries = max(2, min(8, n_cities // 3 + 1))
    for _ in range(n_countries):
        short, formal, demonym = names.country()
        ents.countries[short] = Country(short, formal, demonym)
    countries = list(ents.countries)
    founded = _distinct_ints(rng, n_cities, 700, 1950)
    populations = _distinct_ints(rng, n_cities, 30, 30000, 1)  # hundreds of inhabitants: 3,000 .. 3,000,000
    for i in range(n_cities):
        country = countries[i] if i < len(countries) else rng.choice(countries)
        name = names.city()
        ents.cities[name] = City(name, country, founded[i], populations[i] * 100)
        if ents.countries[country].capital is None:
            ents.countries[country].capital = name


def _build_people(rng: random.Random, names: NameMaker, ents: Entities, n_people: int) -> None:
    cities = list(ents.cities)

    def add(gender: str, year: int, city: str, surname: str | None = None) -> Person:
        person = Person(names.person(gender, surname), gender, year, city, rng.choice(OCCUPATIONS))
        ents.people[person.name] = person
        return person

    pending: list[tuple[Person, Person, int]] = []  # (father, mother, generation) awaiting children
    while len(ents.people) < n_people:
        if not pending:
            year = rng.randint(1850, 1905)
            father = add("m", year, rng.choice(cities))
            if len(ents.people) >= n_people:
                break
            mother = add("f", year + rng.randint(-6, 6), rng.choice(cities))
            father.spouse, mother.spouse = mother.name, father.name
            pending.append((father, mother, 0))
            continue
        father, mother, generation = pending.pop(0)
        year = max(father.birth_year, mother.birth_year) + rng.randint(21, 30)
        for _ in range(rng.randint(1, 3)):
            if len(ents.people) >= n_people or year > LAST_YEAR - 18:
                break
            home = rng.choice([father.birth_city, mother.birth_city, rng.choice(cities)])
            child = add(rng.choice("mf"), year, home, father.name.split(" ", 1)[1])
            child.father, child.mother = father.name, mother.name
            father.children.append(child.name)
            mother.children.append(child.name)
            year += rng.randint(2, 6)
            if generation < 2 and len(ents.people) < n_people and rng.random() < 0.8:
                other = "f" if child.gender == "m" else "m"
                partner = add(other, child.birth_year + rng.randint(-5, 5), rng.choice(cities))
                child.spouse, partner.spouse = partner.name, child.name
                couple = (child, partner) if child.gender == "m" else (partner, child)
                pending.append((*couple, generation + 1))


def _build_companies(rng: random.Random, names: NameMaker, ents: Entities, n_companies: int) -> None:
    people = [p for p in ents.people.values() if p.birth_year <= LAST_YEAR - 30]
    if len(people) < n_companies:
        raise ValueError(
            f"n_companies={n_companies} needs at least as many adults; the world has {len(people)}"
        )
    cities = list(ents.cities)
    for founder in rng.sample(people, n_companies):
        name = names.company()
        year = min(founder.birth_year + rng.randint(25, 45), LAST_YEAR - 5)
        ents.companies[name] = Company(name, founder.name, rng.choice(cities), year)
        founder.founded = name


def _build_films(rng: random.Random, names: NameMaker, ents: Entities, n_films: int) -> None:
    eligible = [p for p in ents.people.values() if p.birth_year <= LAST_YEAR - 25]
    if not eligible:
        raise ValueError("no person is old enough to direct a film; raise n_people")
    n_directors = max(1, min(len(eligible), round(n_films * 0.7)))
    directors = rng.sample(eligible, n_directors)
    assignment = directors[:n_films] + [rng.choice(directors) for _ in range(n_films - len(directors))]
    companies = sorted(ents.companies.values(), key=lambda c: c.founded)
    for director in assignment:
        director.occupation = DIRECTOR
        lo, hi = director.birth_year + 23, min(director.birth_year + 70, LAST_YEAR)
        open_by_hi = [c for c in companies if c.founded <= hi] or companies[:1]
        company = rng.choice(open_by_hi)
        year = rng.randint(max(lo, company.founded), max(hi, company.founded))
        film = Film(names.film_title(), director.name, min(year, LAST_YEAR), rng.choice(GENRES), company.name)
        ents.films[film.title] = film
        director.films.append(film.title)
    for person in ents.people.values():
        person.films.sort(key=lambda t: ents.films[t].year)


def _assign_employers(rng: random.Random, ents: Entities) -> None:
    companies = list(ents.companies.values())
    for person in ents.people.values():
        if person.founded or rng.random() < 0.4:
            continue
        options = [c for c in companies if c.founded <= person.birth_year + 45]
        if options:
            person.employer = rng.choice(options).name


def build_entities(
    rng: random.Random, names: NameMaker, n_people: int, n_films: int, n_cities: int, n_companies: int
) -> Entities:
    """Build the real (non-distractor) entities of a world."""
    for key, value, least in (
        ("n_people", n_people, 4),
        ("n_films", n_films, 1),
        ("n_cities", n_cities, 2),
        ("n_companies", n_companies, 1),
    ):
        if not isinstance(value, int) or value < least:
            raise ValueError(f"{key} must be an integer >= {least}, got {value!r}")
    if n_cities > 1000:
        raise ValueError(f"n_cities must be <= 1000 (distinct founding years), got {n_cities}")
    ents = Entities()
    _build_places(rng, names, ents, n_cities)
    _build_people(rng, names, ents, n_people)
    _build_companies(rng, names, ents, n_companies)
    if not ents.companies:
        raise ValueError("the world needs at least one company")
    _build_films(rng, names, ents, n_films)
    _assign_employers(rng, ents)
    return ents
