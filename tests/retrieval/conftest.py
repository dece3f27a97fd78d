"""Fixtures for the retrieval tests: a hand-made five-paragraph corpus and a deterministic fake
embedder whose vectors are written out by hand, so dense scores can be checked by arithmetic."""

from __future__ import annotations

import numpy as np
import pytest

from components.schemas import Document

DOCS = [
    Document(id="d1", title="Nightfall Harbor",
             text="Nightfall Harbor is a 1998 drama film directed by Mara Quill. It was shot in Port Elsby."),
    Document(id="d2", title="Mara Quill",
             text="Mara Quill is a film director born in the city of Vantor. She directed Nightfall Harbor "
                  "and Glass Orchard."),
    Document(id="d3", title="Vantor",
             text="Vantor is a coastal city known for its shipyards and a lantern festival held in spring."),
    Document(id="d4", title="Glass Orchard",
             text="Glass Orchard is a 2003 mystery film directed by Mara Quill, set in a greenhouse."),
    Document(id="d5", title="Port Elsby",
             text="Port Elsby is a fishing town where several films, including Nightfall Harbor, were shot."),
]

# vectors by title (documents are embedded as "<title>: <text>") or by exact query text
VECTORS = {
    "Nightfall Harbor": [1.0, 0.0, 0.0],
    "Mara Quill": [0.0, 2.0, 0.0],       # not unit length: the index must normalise
    "Vantor": [0.0, 0.0, 1.0],
    "Glass Orchard": [1.0, 1.0, 0.0],
    "Port Elsby": [0.0, 0.0, -1.0],
    "qfilm": [1.0, 0.2, 0.0],
    "qplace": [0.0, 0.0, 3.0],
}


class FakeEmbedder:
    """``encode`` looks a text up by its title prefix (or whole text) in ``VECTORS``; [1, 1, 1] if absent."""

    def __init__(self):
        self.calls = 0

    def encode(self, sentences):
        self.calls += 1
        return np.array([VECTORS.get(s.split(":")[0], [1.0, 1.0, 1.0]) for s in sentences], dtype=np.float32)


@pytest.fixture
def docs() -> list[Document]:
    return [d.model_copy() for d in DOCS]


@pytest.fixture
def fake_embedder() -> FakeEmbedder:
    return FakeEmbedder()
