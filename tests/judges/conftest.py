"""Fixtures of the judge bench's tests: a small world trajectory set, the params, the registered judgments, and
``run``, which asks a judgment's units of a (scripted) model as scripts/judge_bench.py does."""

from __future__ import annotations

import asyncio

import pytest

from components.agents.params import AgentParams
from components.judges.bench.registry import Context, load_judgments
from components.judges.bench.trajectories import build_set
from components.judges.call import Tally
from components.params_load import load_params
from components.retrieval.bm25 import BM25Index
from components.retrieval.scope import world_question_paragraphs
from components.retrieval.tools import make_toolbox
from components.world import generate_world

SETTINGS = AgentParams(max_turns=6, max_search_calls=5, observation_max_chars=1200)


def small_world():
    """(questions with their gold paragraphs, a BM25 toolbox, the corpus titles) of a 16-question world."""
    world = generate_world(seed=3, n_people=40, n_films=15, n_cities=10, n_companies=8, distractors_per_entity=1,
                           question_mix=None, n_questions=16)
    questions = world_question_paragraphs(world)
    toolbox = make_toolbox(BM25Index(world.documents), world.documents, snippet_chars=300, scope="corpus")
    return questions, toolbox, sorted({d.title for d in world.documents})


@pytest.fixture(scope="module")
def items():
    questions, toolbox, titles = small_world()
    return build_set(questions, toolbox, SETTINGS, titles, n_questions=3, seed=5)


@pytest.fixture(scope="module")
def params():
    return load_params()


@pytest.fixture(scope="module")
def judgments():
    return {j.name: j for j in load_judgments()}


def run(judgment, model, units, params, mode="text"):
    """One row per unit: its slate, its oracle label, the judgment's verdict fields and the calls it made."""
    cache: dict = {}
    rows = []
    for u in units:
        tally = Tally()
        fields = asyncio.run(judgment.ask(model, u, Context(mode == "reference", tally, params, cache)))
        rows.append({"slate": u.slate, **u.label, **fields, "calls": tally.calls})
    return rows
