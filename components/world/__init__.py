"""The embedded fictional multi-hop world: seeded entities, encyclopedia-style paragraphs with
distractors, and bridge / comparison / inference / compositional questions with gold chains.

    from components.world import generate_world, title_search, oracle_answer
    world = generate_world(seed=0, n_people=80, n_films=30, n_cities=12, n_companies=10,
                           distractors_per_entity=1, question_mix=None, n_questions=200)

Modules: ``names`` (invented names), ``entities`` (who is related to whom), ``render`` (paragraphs),
``questions`` (templates), ``generate`` (the entry point), ``oracle`` (exact gold next actions).
"""

from components.world.generate import DEFAULT_MIX, World, generate_world, split_questions
from components.world.oracle import (
    OracleError,
    gold_next_query,
    gold_search_queries,
    hop_titles,
    oracle_answer,
    title_search,
)
from components.world.questions import QUESTION_TYPES

__all__ = [
    "DEFAULT_MIX",
    "QUESTION_TYPES",
    "OracleError",
    "World",
    "generate_world",
    "gold_next_query",
    "gold_search_queries",
    "hop_titles",
    "oracle_answer",
    "split_questions",
    "title_search",
]
