"""How many tensors autograd keeps for backward inside a block: a layer that recomputes its activations keeps
only its inputs, so the count tells recomputation apart from kept activations."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch


@contextmanager
def saved_tensor_count() -> Iterator[list[int]]:
    """``with saved_tensor_count() as saved: ...``; afterwards ``saved[0]`` is the count."""
    saved = [0]

    def pack(tensor):
        saved[0] += 1
        return tensor

    with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
        yield saved
