"""Orders in which a judge is shown several candidates at once, balanced so its position bias cancels.

A small judge that sees a slate of actions or a group of attempts side by side tends to score by position (the
1.5B answered ``[2, 1, 0, 0]`` for every rubric, whatever it was shown). Shown once in one drawn order, that
bias becomes a random reward. :func:`balanced_orders` gives the cyclic shifts of one drawn order: every candidate
is shown exactly once at every position, so averaging the calls leaves a pure position bias flat and keeps what
the judge says about the candidates themselves.

    orders = balanced_orders(f"{seed}:{step}:{question.id}", 4)   # 4 orders (position -> candidate)
"""

from __future__ import annotations

import random

__all__ = ["balanced_orders", "drawn_order", "letter"]


def drawn_order(key: str, n: int) -> list[int]:
    """A permutation of ``range(n)`` drawn from ``key`` (the same key gives the same order)."""
    order = list(range(n))
    random.Random(key).shuffle(order)
    return order


def balanced_orders(key: str, n: int) -> list[list[int]]:
    """The ``n`` cyclic shifts of :func:`drawn_order`: a Latin square, each candidate once at each position."""
    base = drawn_order(key, n)
    return [[base[(p + j) % n] for p in range(n)] for j in range(n)]


def letter(position: int) -> str:
    """The label of a shown position: A, B, ..."""
    return chr(ord("A") + position)
