"""Training worlds for the warm start: fictional worlds generated with other seeds than the evaluation
world, each with its own corpus, index and toolbox, so no fact of an evaluation question is seen in
training.

Seeds are ``seed + 1 .. seed + n_worlds`` (``training_seeds``); question ids get the seed as a prefix
(``s1235-wq-00003``), since every world numbers its questions from 0. Invented names can recur across seeds
(with other facts); a training question whose chain or answer names an entity titled in the evaluation
corpus is dropped (``TrainingWorld.dropped_overlap`` counts them), so a name the policy is evaluated on
never comes with a trained fact.

    worlds = [build_training_world(s, params.world, 60, out / f"seed-{s}", build, eval_titles,
                                   toolbox_options) for s in training_seeds(params.seed, 4)]
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

from components.io import write_jsonl
from components.retrieval.scope import world_question_paragraphs
from components.retrieval.tools import Toolbox, make_toolbox
from components.schemas import Document, Question
from components.world import generate_world
from components.world.params import WorldParams

IndexBuilder = Callable[[list[Document], Path], object]


def training_seeds(seed: int, n_worlds: int) -> list[int]:
    return [seed + i for i in range(1, n_worlds + 1)]


@dataclass
class TrainingWorld:
    seed: int
    questions: list[Question]
    documents: list[Document]
    toolbox: Toolbox
    dropped_overlap: int = 0
    folder: Path = field(default_factory=Path)


def names_of(question: Question) -> set[str]:
    """Every entity a question's chain looks up or answers with, and its gold answers."""
    out = set(question.answers) | {h.answer for h in question.gold_chain}
    out |= set(question.metadata.get("hop_titles") or [])
    return out


def build_training_world(
    seed: int, world: WorldParams, n_questions: int, folder: str | Path, build_index: IndexBuilder,
    eval_titles: set[str], toolbox_options: dict,
) -> TrainingWorld:
    """Generate the world of ``seed`` with ``n_questions`` questions (paragraph sets recorded for the
    question scope), write its corpus and questions under ``folder``, build its index in
    ``folder/index`` and return it with a toolbox made with ``toolbox_options`` (make_toolbox's)."""
    folder = Path(folder)
    w = generate_world(seed=seed, n_people=world.n_people, n_films=world.n_films, n_cities=world.n_cities,
                       n_companies=world.n_companies, distractors_per_entity=world.distractors_per_entity,
                       question_mix=world.question_mix, n_questions=n_questions)
    questions = [q.model_copy(update={"id": f"s{seed}-{q.id}", "split": "train",
                                      "metadata": {**q.metadata, "world_seed": seed}})
                 for q in world_question_paragraphs(w)]
    kept = [q for q in questions if not names_of(q) & eval_titles]
    write_jsonl(folder / "corpus.jsonl", w.documents)
    write_jsonl(folder / "questions.jsonl", kept)
    index = build_index(w.documents, folder / "index")
    toolbox = make_toolbox(index, w.documents, **toolbox_options)
    return TrainingWorld(seed, kept, w.documents, toolbox, len(questions) - len(kept), folder)
