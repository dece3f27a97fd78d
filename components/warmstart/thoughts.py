"""Short thoughts for oracle trajectories, written from a hop's facts in varied wording.

A world hop is a sub-question with its answer ("Who directed the film The Glass Harbor?", "Torvel
Ashmere"). ``fact`` turns it into a statement ("The Glass Harbor was directed by Torvel Ashmere."), ``need``
into what is looked for ("the director of The Glass Harbor"), and ``Thoughts`` joins them into one line
per turn, picking among phrasings with a seeded ``random.Random`` so a model trained on them does not
learn one fixed sentence.

The thoughts count the chain's facts: the first one plans them ("I need 2 facts: 1) the director of The
Glass Harbor; 2) the birthplace of that person."), each later one says which fact it just learned out of
how many ("Fact 1 of 2: ..."), and the last one says all were found. A 0.5B policy trained on thoughts
without that count kept searching after the last hop (60% of world test episodes ended on the search
budget): nothing in its context said the chain was complete.

    t = Thoughts(random.Random("q-1"), question.gold_chain)
    t.first("The Glass Harbor")          # 'I need 2 facts: 1) the director of ...; 2) .... Fact 1 first: ...'
    t.search([hop], next_hop, "Torvel Ashmere")  # 'Fact 1 of 2: The Glass Harbor was directed by ... Next, fact 2: ...'
"""

from __future__ import annotations

import random
import re

from components.schemas import SubQuestion

# sub-question pattern (components.world.hops) -> what it asks for, as a noun phrase; statements of its
# answer ({x} is the entity asked about, {a} the answer); the kind of entity {x} is and the kind {a} is
_HOPS = [
    (r"Who directed the film (?P<x>.+)\?", "the director of {x}",
     ["{x} was directed by {a}.", "The director of {x} is {a}."], "film", "person"),
    (r"In what year was (?P<x>.+) released\?", "the release year of {x}",
     ["{x} came out in {a}.", "{x} was released in {a}."], "film", None),
    (r"Which company produced (?P<x>.+)\?", "the company that produced {x}",
     ["{x} was produced by {a}.", "{a} produced {x}."], "film", "company"),
    (r"Which film did (?P<x>.+) direct\?", "the film {x} directed",
     ["{x} directed {a}.", "The film {x} directed is {a}."], "person", "film"),
    (r"In which city was (?P<x>.+) born\?", "the birthplace of {x}",
     ["{x} was born in {a}.", "{x}'s birthplace is {a}."], "person", "city"),
    (r"In what year was (?P<x>.+) born\?", "the birth year of {x}",
     ["{x} was born in {a}.", "{x}'s birth year is {a}."], "person", None),
    (r"Who is the (?P<rel>father|mother|spouse) of (?P<x>.+)\?", "the {rel} of {x}",
     ["The {rel} of {x} is {a}.", "{x}'s {rel} is {a}."], "person", "person"),
    (r"What is the occupation of (?P<x>.+)\?", "the occupation of {x}",
     ["{x} works as {art} {a}.", "{x}'s occupation is {a}."], "person", None),
    (r"Which company did (?P<x>.+) work for\?", "the employer of {x}",
     ["{x} worked for {a}.", "{x}'s employer was {a}."], "person", "company"),
    (r"In which country is (?P<x>.+)\?", "the country of {x}", ["{x} is in {a}.", "{x} lies in {a}."], "city", None),
    (r"In what year was (?P<x>.+) founded\?", "the founding year of {x}",
     ["{x} was founded in {a}.", "{x} dates from {a}."], None, None),
    (r"What is the population of (?P<x>.+)\?", "the population of {x}",
     ["{x} has {a} inhabitants.", "{x}'s population is {a}."], "city", None),
    (r"Who founded (?P<x>.+)\?", "the founder of {x}", ["{x} was founded by {a}.", "{a} founded {x}."],
     "company", "person"),
    (r"Where is (?P<x>.+) headquartered\?", "the headquarters of {x}",
     ["{x} is headquartered in {a}.", "{x} is based in {a}."], "company", "city"),
]

_PLAN = ["I need {n} facts: {steps}.", "Plan, {n} facts: {steps}.", "This takes {n} facts: {steps}."]
_COMPARE_PLAN = {"same": "then check whether they are the same", "order": "then compare them"}
_LEARNED = ["{Fact} {k} of {n}: {facts}", "Found {fact} {k} of {n}. {facts}", "Now I have {fact} {k} of {n}: {facts}"]
_NEXT_SEARCH = ["Next, fact {k}: {need}. I will search for {title}.", "Now fact {k}, {need}, so I look up {title}.",
                "Fact {k} is {need}. Searching {title}.", "I still need fact {k}, {need}; let me search {title}."]
_FIRST = ["Fact 1 first: I will search for {title}.", "Starting with fact 1, I look up {title}.",
          "For fact 1 I search {title}.", "To begin, fact 1: search {title}."]
_ALL_FOUND = ["All {n} facts are found.", "That was the last of the {n} facts.", "I have all {n} facts now."]
_BROWSE = ["The snippet stops before that, so I will read the whole paragraph.",
           "That is not in the snippet; I will browse the full paragraph.",
           "The snippet is cut short, so I open the paragraph."]
_REFINE = ["These results are about other names like {title}. I will search for the {kind} {title} more precisely.",
           "None of these is the {kind} {title} itself; let me add the word {kind} to the search."]
_BROWSE_SHOWN = ["{title} was already in the results ({doc_id}); I will read it.",
                 "The paragraph on {title} ({doc_id}) appeared earlier; let me browse it."]


def match_hop(hop: SubQuestion):
    """(named groups, need template, statement templates, kind of x, kind of the answer) of a known hop form; None otherwise."""
    for pattern, need, statements, x_kind, a_kind in _HOPS:
        m = re.fullmatch(pattern, hop.question)
        if m:
            return m.groupdict(), need, statements, x_kind, a_kind
    return None


def entity_kind(title: str, chain: list[SubQuestion]) -> str | None:
    """What ``title`` is (film, person, city, company), from the hops that ask about it or answer with it."""
    for hop in chain:
        found = match_hop(hop)
        if found and found[0].get("x") == title and found[3]:
            return found[3]
        if found and hop.answer == title and found[4]:
            return found[4]
    return None


def need(hop: SubQuestion) -> str:
    """What the hop asks for, as a noun phrase ('the director of X'); the sub-question itself if unknown."""
    found = match_hop(hop)
    return found[1].format(**found[0]) if found else f"the answer to '{hop.question}'"


def planned_need(chain: list[SubQuestion], k: int, refer: str = "that {kind}") -> str:
    """What hop ``k`` asks for, as a plan can say it before any lookup: an entity that is an earlier hop's
    answer is not known yet, so it is named by ``refer`` with its kind and the earlier item's number
    ("the birthplace of that person"; the scaffold's plan: "... of the person from item 1")."""
    hop, found = chain[k], match_hop(chain[k])
    earlier = {h.answer: j for j, h in enumerate(chain[:k])}
    if found is None or found[0].get("x") not in earlier:
        return need(hop)
    groups, template, _, x_kind, _ = found
    kind = x_kind or entity_kind(groups["x"], chain) or "entity"
    return template.format(**{**groups, "x": refer.format(kind=kind, item=earlier[groups["x"]] + 1)})


def plan(chain: list[SubQuestion], compare: dict | None, rng: random.Random) -> str:
    """The first thought's plan: the chain's facts numbered, and the comparison if the question makes one."""
    steps = "; ".join(f"{k + 1}) {planned_need(chain, k)}" for k in range(len(chain)))
    if compare:
        steps += "; " + _COMPARE_PLAN["same" if compare.get("op") == "same" else "order"]
    return rng.choice(_PLAN).format(n=len(chain), steps=steps)


def fact(hop: SubQuestion, rng: random.Random) -> str:
    """A statement of the hop's answer; a plain 'Q A.' when the sub-question is of an unknown form."""
    found = match_hop(hop)
    if found is None:
        return f"{hop.question} {hop.answer}."
    art = "an" if hop.answer[:1].lower() in "aeiou" else "a"
    return rng.choice(found[2]).format(a=hop.answer, art=art, **found[0])


class Thoughts:
    """The thoughts of one question's oracle episode over its gold ``chain`` (``compare``: the question's
    comparison, from its metadata, if any)."""

    def __init__(self, rng: random.Random, chain: list[SubQuestion], compare: dict | None = None):
        self.rng, self.chain, self.compare = rng, list(chain), compare

    def _number(self, hop: SubQuestion) -> int:
        return next(k for k, h in enumerate(self.chain) if h is hop) + 1

    def _learned(self, hops: list[SubQuestion]) -> str:
        if not hops:
            return ""
        numbers = [self._number(h) for h in hops]
        k = str(numbers[0]) if len(numbers) == 1 else f"{numbers[0]}-{numbers[-1]}"
        facts = " ".join(fact(h, self.rng) for h in hops)
        word = "fact" if len(numbers) == 1 else "facts"
        return self.rng.choice(_LEARNED).format(k=k, n=len(self.chain), facts=facts, fact=word, Fact=word.capitalize())

    def first(self, title: str) -> str:
        return " ".join((plan(self.chain, self.compare, self.rng), self.rng.choice(_FIRST).format(title=title)))

    def search(self, learned: list[SubQuestion], hop: SubQuestion, title: str) -> str:
        wanted = self.rng.choice(_NEXT_SEARCH).format(k=self._number(hop), need=need(hop), title=title)
        return " ".join(p for p in (self._learned(learned), wanted) if p)

    def browse(self, learned: list[SubQuestion], hop: SubQuestion, title: str, doc_id: str, shown_before: bool) -> str:
        if shown_before:
            why = self.rng.choice(_BROWSE_SHOWN).format(title=title, doc_id=doc_id)
        else:
            why = self.rng.choice(_BROWSE)
        wanted = f"I need fact {self._number(hop)}, {need(hop)}. {why}"
        return " ".join(p for p in (self._learned(learned), wanted) if p)

    def refine(self, title: str, kind: str) -> str:
        return self.rng.choice(_REFINE).format(title=title, kind=kind)

    def finish(self, learned: list[SubQuestion], conclusion: str) -> str:
        done = self.rng.choice(_ALL_FOUND).format(n=len(self.chain))
        return " ".join(p for p in (self._learned(learned), done, conclusion) if p)


def conclusion(answers: list[str], compare: dict | None, answer: str, rng: random.Random) -> str:
    """The last sentence before finishing: the comparison made explicit, or the answer stated."""
    if not compare:
        return rng.choice(["So the answer is {a}.", "That answers the question: {a}.", "The answer is {a}."]).format(a=answer)
    i, j = compare["value_hops"]
    va, vb = answers[i], answers[j]
    if compare["op"] == "same":
        relation = "the same" if va == vb else "different"
        return f"{va} and {vb} are {relation}, so the answer is {answer}."
    a, b = compare["options"]
    return rng.choice([
        "{a}: {va}; {b}: {vb}. So the answer is {ans}.",
        "Comparing {va} ({a}) with {vb} ({b}), the answer is {ans}.",
    ]).format(a=a, b=b, va=va, vb=vb, ans=answer)
