"""Fixtures shared by the training tests."""

import pytest
import torch


@pytest.fixture
def one_thread():
    """Tiny-model tests run on one torch thread: tiny matmuls on 2 shared cores are much slower (and
    jittery) with intra-op threads. Opt in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)
