"""Integrity checks of the embedded GGUF assembly: a wrong sha256 is refused, tampering is noticed."""

import dataclasses

import pytest

from components.embedded.models import EMBEDDED_MODELS, ModelIntegrityError, ensure_gguf, sha256_file, verify
from tests.conftest import requires_embedded


def test_verify_accepts_the_right_hash_and_refuses_a_tampered_file(tmp_path):
    path = tmp_path / "m.gguf"
    path.write_bytes(b"GGUF" + bytes(range(256)) * 64)
    good = sha256_file(path)
    verify(path, good)  # writes a stamp
    with pytest.raises(ModelIntegrityError, match="refusing to load"):
        verify(path, "0" * 64)
    data = bytearray(path.read_bytes())
    data[100] ^= 0xFF
    path.write_bytes(bytes(data))
    with pytest.raises(ModelIntegrityError):
        verify(path, good)  # the stamp no longer matches the file, so it is re-hashed


@requires_embedded
def test_assembly_with_a_wrong_pinned_hash_refuses_and_leaves_nothing(tmp_path):
    spec = dataclasses.replace(EMBEDDED_MODELS["qwen2.5-coder-0.5b-instruct"], sha256="f" * 64)
    with pytest.raises(ModelIntegrityError, match="does not match the pinned"):
        ensure_gguf(spec.name, tmp_path, spec=spec)
    assert [p.name for p in (tmp_path / "models").iterdir() if p.suffix != ".lock"] == []  # no half-written model


@requires_embedded
def test_real_assembly_matches_the_pinned_hash(tmp_path):
    path = ensure_gguf("qwen2.5-coder-0.5b-instruct", tmp_path)
    assert path.read_bytes()[:4] == b"GGUF"
    assert sha256_file(path) == EMBEDDED_MODELS["qwen2.5-coder-0.5b-instruct"].sha256
