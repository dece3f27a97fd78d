"""Prompt order for training: an endless, seeded, resumable walk over the prompt list.

Each epoch is a fresh permutation drawn from ``(seed, epoch)``, so the position alone (epoch, cursor)
restores the order exactly after a resume; no generator state needs saving.

Usage::

    sampler = PromptSampler(len(prompts), seed=0)
    batch = [prompts[i] for i in sampler.next(4)]
    state = sampler.state_dict()   # store in the checkpoint; sampler.load_state_dict(state) to resume
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

__all__ = ["PromptSampler"]


class PromptSampler:
    """Endless prompt order: a fresh seeded permutation per epoch; ``state_dict`` is the position."""

    def __init__(self, num_prompts: int, seed: int = 0, shuffle: bool = True):
        if num_prompts < 1:
            raise ValueError("no prompts to train on")
        self.num_prompts, self.seed, self.shuffle = num_prompts, seed, shuffle
        self.epoch = 0
        self.cursor = 0

    def _order(self) -> np.ndarray:
        if not self.shuffle:
            return np.arange(self.num_prompts)
        return np.random.default_rng([self.seed, self.epoch]).permutation(self.num_prompts)

    def next(self, k: int) -> list[int]:
        out: list[int] = []
        while len(out) < k:
            order = self._order()
            take = order[self.cursor : self.cursor + k - len(out)]
            out.extend(int(i) for i in take)
            self.cursor += len(take)
            if self.cursor >= self.num_prompts:
                self.epoch, self.cursor = self.epoch + 1, 0
        return out

    def state_dict(self) -> dict[str, int]:
        return {
            "epoch": self.epoch,
            "cursor": self.cursor,
            "seed": self.seed,
            "num_prompts": self.num_prompts,
        }

    def load_state_dict(self, state: Mapping[str, int]) -> None:
        if state["num_prompts"] != self.num_prompts:
            raise ValueError(
                f"checkpoint was made with {state['num_prompts']} prompts, now {self.num_prompts}"
            )
        self.epoch, self.cursor, self.seed = state["epoch"], state["cursor"], state["seed"]
