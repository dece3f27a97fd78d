"""Generate the embedded fictional multi-hop world: paragraphs (Documents) and questions (Questions).

    from components.world import generate_world
    world = generate_world(seed=0, n_people=80, n_films=30, n_cities=12, n_companies=10,
                           distractors_per_entity=1, n_questions=200,
                           question_mix={"bridge": 0.3, "comparison": 0.25, "inference": 0.2,
                                         "compositional": 0.25})
    splits = world.split(train=120, dev=40, test=40)   # {"train": [...], "dev": [...], "test": [...]}

The same arguments give the same world (documents, questions, ids), whatever PYTHONHASHSEED is: every
random draw comes from ``random.Random`` seeded with a string derived from ``seed`` (one stream per
part, so e.g. asking for more questions leaves the documents unchanged). Document ids are ``wd-NNNNN``
in a seeded shuffled order (real and distractor paragraphs interleaved); question ids are ``wq-NNNNN``.
Each question's ``metadata`` holds ``template``, ``hop_titles`` (the paragraph title read at each hop,
see ``oracle.gold_search_queries``) and, for comparisons, ``compare`` (see ``questions``).
"""

from __future__ import annotations

import random
from dataclasses import dataclass, field

from components.schemas import Document, Question, SubQuestion
from components.world.entities import Entities, build_entities
from components.world.names import NameMaker
from components.world.questions import QUESTION_TYPES, make_drafts, type_counts
from components.world.render import build_paragraphs, distractor_sources

SOURCE = "world"
DEFAULT_MIX = {"bridge": 0.3, "comparison": 0.25, "inference": 0.2, "compositional": 0.25}


@dataclass
class World:
    """A generated world. ``entities`` is the ground truth behind the paragraphs (for tests/analysis)."""

    seed: int
    documents: list[Document]
    questions: list[Question]
    entities: Entities
    distractor_ids: list[str] = field(default_factory=list)
    lookalikes: dict[str, list[str]] = field(default_factory=dict)
    """Id of a real paragraph -> ids of the distractor paragraphs that imitate it."""

    def by_title(self) -> dict[str, Document]:
        return {d.title: d for d in self.documents}

    def split(self, train: int, dev: int, test: int) -> dict[str, list[Question]]:
        """See ``split_questions``."""
        return split_questions(self.questions, train=train, dev=dev, test=test)


def split_questions(questions: list[Question], train: int, dev: int, test: int) -> dict[str, list[Question]]:
    """Deterministic train/dev/test split by counts: consecutive slices of ``questions`` (already in a
    seeded random order), each returned as copies with ``split`` set. Counts must fit the list."""
    counts = {"train": train, "dev": dev, "test": test}
    for name, n in counts.items():
        if not isinstance(n, int) or n < 0:
            raise ValueError(f"{name} must be an integer >= 0, got {n!r}")
    if sum(counts.values()) > len(questions):
        raise ValueError(f"train+dev+test = {sum(counts.values())} exceeds the {len(questions)} questions")
    out, start = {}, 0
    for name, n in counts.items():
        out[name] = [q.model_copy(update={"split": name}, deep=True) for q in questions[start : start + n]]
        start += n
    return out


def _rng(seed: int, part: str) -> random.Random:
    return random.Random(f"rubricflow-world:{seed}:{part}")


def generate_world(
    seed: int,
    n_people: int,
    n_films: int,
    n_cities: int,
    n_companies: int,
    distractors_per_entity: int,
    question_mix: dict[str, float] | None,
    n_questions: int,
) -> World:
    """Build entities, render paragraphs with distractors, and draw ``n_questions`` questions whose
    types follow ``question_mix`` (fractions over bridge / comparison / inference / compositional;
    None means ``DEFAULT_MIX``). Raises ValueError naming the argument when a size is invalid or the
    world is too small for the questions asked."""
    names = NameMaker(_rng(seed, "names"))
    ents = build_entities(_rng(seed, "entities"), names, n_people, n_films, n_cities, n_companies)
    paragraphs = build_paragraphs(ents, names, _rng(seed, "text"), distractors_per_entity)
    order = list(range(len(paragraphs)))
    _rng(seed, "order").shuffle(order)
    documents, distractor_ids, title_to_id = [], [], {}
    for i, k in enumerate(order):
        title, text, is_distractor = paragraphs[k]
        doc = Document(id=f"wd-{i:05d}", title=title, text=text, source=SOURCE)
        documents.append(doc)
        if title in title_to_id:
            raise AssertionError(f"duplicate title {title!r}")  # NameMaker hands out unique names
        title_to_id[title] = doc.id
        if is_distractor:
            distractor_ids.append(doc.id)

    imitated = iter(distractor_sources(ents, distractors_per_entity))
    lookalikes: dict[str, list[str]] = {}
    for title, _, is_distractor in paragraphs:
        if is_distractor:
            lookalikes.setdefault(title_to_id[next(imitated)], []).append(title_to_id[title])

    counts = type_counts(question_mix if question_mix is not None else DEFAULT_MIX, n_questions)
    q_rng = _rng(seed, "questions")
    drafts = make_drafts(ents, q_rng, counts)
    q_rng.shuffle(drafts)
    questions = []
    for i, d in enumerate(drafts):
        chain = [SubQuestion(question=q, answer=a, doc_id=title_to_id[t]) for q, a, t in d.hops]
        support = list(dict.fromkeys(s.doc_id for s in chain))
        metadata = {"template": d.template, "hops": len(chain), "hop_titles": [t for _, _, t in d.hops]}
        if d.compare:
            metadata["compare"] = d.compare
        questions.append(
            Question(
                id=f"wq-{i:05d}",
                question=d.text,
                answers=d.answers,
                type=d.type,
                source=SOURCE,
                split="dev",
                supporting_doc_ids=support,
                gold_chain=chain,
                metadata=metadata,
            )
        )
    assert {q.type for q in questions} <= set(QUESTION_TYPES)
    return World(
        seed=seed, documents=documents, questions=questions, entities=ents, distractor_ids=distractor_ids,
        lookalikes=lookalikes,
    )
