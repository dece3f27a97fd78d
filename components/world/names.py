"""Invented names for the embedded world, built from syllable lists with a seeded ``random.Random``.

Every name handed out is unique across kinds (a person never shares a name with a city, a film or a
company), so a title lookup always finds one paragraph. ``variant`` makes a *similar* but distinct name
for distractor paragraphs (one letter changed, a prefix added, a suffix swapped).

    import random
    names = NameMaker(random.Random(0))
    names.person("m")        # 'Torvel Ashmere' style
    names.film_title()       # 'The Glass Harbor of Veyla' style
    names.variant("Torvel Ashmere", "person")
"""

from __future__ import annotations

import random
import re

_ONSETS = [
    "al",
    "bra",
    "cal",
    "dor",
    "el",
    "fen",
    "gal",
    "hal",
    "is",
    "jor",
    "kel",
    "lor",
    "mar",
    "nor",
    "or",
    "per",
    "quen",
    "ros",
    "sel",
    "tor",
    "ul",
    "var",
    "wen",
    "yor",
    "zan",
    "bel",
    "cor",
    "dra",
    "ev",
    "fal",
    "gor",
    "hel",
    "ith",
    "kas",
    "lin",
    "mor",
    "ner",
    "os",
    "ral",
    "syl",
    "tam",
    "vel",
]
_MIDDLES = ["a", "e", "i", "o", "an", "en", "in", "ar", "er", "or", "el", "il", "ad", "ev", "om"]
_MALE_ENDS = ["ric", "an", "en", "ius", "or", "us", "el", "in", "as", "ard", "mund", "ath", "ven", "dor"]
_FEMALE_ENDS = ["a", "ina", "elle", "ia", "ette", "wyn", "ara", "ine", "is", "ona", "ira", "eth", "ys"]
_SURNAME_ENDS = [
    "moor",
    "wick",
    "dale",
    "ford",
    "ton",
    "holt",
    "mere",
    "ridge",
    "vane",
    "stead",
    "worth",
    "ley",
    "croft",
    "hurst",
    "brook",
    "field",
    "gard",
    "wyn",
    "marsh",
    "cott",
]
_CITY_ENDS = [
    "ora",
    "eth",
    "grad",
    "holm",
    "mar",
    "vale",
    "burg",
    "port",
    "ara",
    "ent",
    "haven",
    "stad",
    "ice",
    "oss",
    "ay",
    "umbre",
]
_COUNTRY_ENDS = [
    ("ia", "ian"),
    ("ovia", "ovian"),
    ("onia", "onian"),
    ("ara", "aran"),
    ("esh", "eshi"),
    ("land", "lander"),
    ("mark", "markish"),
    ("istan", "istani"),
]
_COUNTRY_FORMS = [
    "Republic of {}",
    "Kingdom of {}",
    "Federation of {}",
    "Grand Duchy of {}",
    "Commonwealth of {}",
    "United Provinces of {}",
]
_ADJECTIVES = [
    "Silent",
    "Glass",
    "Crimson",
    "Hollow",
    "Iron",
    "Winter",
    "Golden",
    "Paper",
    "Distant",
    "Broken",
    "Quiet",
    "Burning",
    "Pale",
    "Velvet",
    "Northern",
    "Last",
    "Hidden",
    "Amber",
    "Salt",
    "Copper",
    "Wandering",
    "Bitter",
    "Restless",
    "Lonely",
]
_NOUNS = [
    "Harbor",
    "Orchard",
    "Lantern",
    "River",
    "Garden",
    "Tower",
    "Voyage",
    "Letter",
    "Mirror",
    "Bridge",
    "Meadow",
    "Carnival",
    "Shadow",
    "Station",
    "Crown",
    "Frontier",
    "Lighthouse",
    "Horizon",
    "Cathedral",
    "Compass",
    "Tide",
    "Masquerade",
    "Canyon",
    "Archive",
]
_COMPANY_SUFFIXES = ["Pictures", "Studios", "Films", "Media", "Entertainment", "Productions"]
_VOWELS = "aeiou"
_STUTTER = re.compile(r"(.{2,3})\1")


class NameMaker:
    """Hands out unique invented names; ``used`` holds every name given so far (all kinds)."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.used: set[str] = set()

    def _claim(self, make, what: str) -> str:
        for _ in range(500):
            name = make()
            if name not in self.used:
                self.used.add(name)
                return name
        raise RuntimeError(f"could not invent a fresh {what} name after 500 tries")

    def _word(self, ends: list[str], parts: int | None = None) -> str:
        rng = self.rng
        parts = parts if parts is not None else rng.choice([1, 1, 2])
        stem = rng.choice(_ONSETS) + "".join(rng.choice(_MIDDLES) for _ in range(parts - 1))
        word = stem + rng.choice(ends)
        while _STUTTER.search(word):  # "Elelelle": drop a repeated chunk
            word = _STUTTER.sub(r"\1", word, count=1)
        return word[0].upper() + word[1:]

    def first_name(self, gender: str) -> str:
        return self._word(_MALE_ENDS if gender == "m" else _FEMALE_ENDS)

    def surname(self) -> str:
        return self._word(_SURNAME_ENDS)

    def person(self, gender: str, surname: str | None = None) -> str:
        return self._claim(lambda: f"{self.first_name(gender)} {surname or self.surname()}", "person")

    def city(self) -> str:
        return self._claim(lambda: self._word(_CITY_ENDS), "city")

    def country(self) -> tuple[str, str, str]:
        """(short name, formal name, demonym), e.g. ('Valdoria', 'Republic of Valdoria', 'Valdorian')."""
        rng = self.rng
        for _ in range(500):
            end, demonym_end = rng.choice(_COUNTRY_ENDS)
            stem = rng.choice(_ONSETS) + rng.choice(_MIDDLES) + rng.choice(["d", "r", "l", "v", "n", "st"])
            short = (stem + end)[0].upper() + (stem + end)[1:]
            formal = rng.choice(_COUNTRY_FORMS).format(short)
            if short not in self.used and formal not in self.used:
                self.used.update((short, formal))
                return short, formal, short[: len(short) - len(end)] + demonym_end
        raise RuntimeError("could not invent a fresh country name after 500 tries")

    def film_title(self) -> str:
        rng = self.rng

        def make() -> str:
            adj, noun = rng.choice(_ADJECTIVES), rng.choice(_NOUNS)
            place = self._word(_CITY_ENDS, 1)
            pattern = rng.randrange(5)
            if pattern == 0:
                return f"The {adj} {noun}"
            if pattern == 1:
                return f"The {noun} of {place}"
            if pattern == 2:
                return f"{adj} {noun} of {place}"
            if pattern == 3:
                return f"{place} {noun}"
            return f"The {adj} {noun} at {place}"

        return self._claim(make, "film")

    def company(self) -> str:
        return self._claim(
            lambda: f"{self._word(_CITY_ENDS, 1)} {self.rng.choice(_COMPANY_SUFFIXES)}", "company"
        )

    # ---- distractor names -------------------------------------------------------------------------
    def _swap_vowel(self, word: str) -> str:
        positions = [i for i, ch in enumerate(word) if ch.lower() in _VOWELS]
        if not positions:
            return word + "e"
        i = self.rng.choice(positions)
        new = self.rng.choice([v for v in _VOWELS if v != word[i].lower()])
        return word[:i] + (new.upper() if word[i].isupper() else new) + word[i + 1 :]

    def variant(self, name: str, kind: str, gender: str = "m") -> str:
        """A fresh name that looks like ``name`` (for a distractor of the same kind)."""
        rng = self.rng

        def make() -> str:
            if kind == "person":
                first, _, last = name.partition(" ")
                choice = rng.randrange(3)
                if choice == 0:
                    return f"{first} {self._swap_vowel(last)}"
                if choice == 1:
                    return f"{self.first_name(gender)} {last}"
                return f"{self._swap_vowel(first)} {last}"
            if kind == "film":
                bare = name.removeprefix("The ")
                inner = "the " + bare if name.startswith("The ") else name
                return rng.choice(
                    [
                        f"Return to {inner}",
                        f"{bare} II",
                        f"Beyond {inner}",
                        f"{name} Returns",
                        f"Children of {inner}",
                        name[: len(name) - len(bare)] + self._swap_vowel(bare),
                    ]
                )
            if kind == "city":
                return rng.choice(
                    [
                        f"New {name}",
                        f"{name} Heights",
                        f"Port {name}",
                        f"Upper {name}",
                        self._swap_vowel(name),
                    ]
                )
            if kind == "company":
                stem, _, _suffix = name.rpartition(" ")
                return rng.choice(
                    [
                        f"{stem} {rng.choice(_COMPANY_SUFFIXES)}",
                        f"{stem} International",
                        f"{self._swap_vowel(stem)} {_suffix}",
                    ]
                )
            raise ValueError(f"unknown name kind {kind!r}")

        return self._claim(make, f"{kind} variant")
