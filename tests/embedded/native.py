"""Markers for tests that need llama.cpp's native server (built by scripts/setup.sh) and the embedded models."""

import pytest

from components.embedded.native_server import NativeServerMissing, llama_server_binary
from tests.conftest import embedded_available


def native_server_available() -> bool:
    try:
        llama_server_binary()
    except NativeServerMissing:
        return False
    return embedded_available()


requires_native_server = pytest.mark.skipif(
    not native_server_available(), reason="needs .venv/bin/llama-server (bash scripts/setup.sh) and the [embedded] extra"
)
