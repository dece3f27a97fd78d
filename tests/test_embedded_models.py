"""Integrity checks of the embedded GGUF assembly: a wrong sha256 is refused, tampering is noticed."""

import dataclasses
import json
from pathlib import Path

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


@requires_embedded
def test_the_policy_loads_from_its_dequantized_copy_with_the_gguf_s_own_values(repo_root, monkeypatch):
    """load_hf_policy dequantizes the GGUF once into a transformers folder and reads that folder afterwards: its
    matrices equal gguf-py's dequantization of the file (one of each of its four kinds, exactly), the folder
    carries no GGUF marker, and a second load never opens the GGUF through transformers."""
    import gguf
    import torch
    import transformers.modeling_gguf_pytorch_utils as through_gguf

    from components.embedded.gguf_read import GGUFFile
    from components.embedded.models import load_hf_policy

    name, cache = "qwen2.5-coder-0.5b-instruct", repo_root / ".cache"
    load_hf_policy(name, cache)  # builds the folder the first time this cache needs it
    [folder] = (cache / "models").glob(f"{name}-{EMBEDDED_MODELS[name].sha256[:12]}.hf")
    assert "quantization_config" not in json.loads((folder / "config.json").read_text())

    def refuse(*args, **kwargs):
        raise AssertionError("loaded through the GGUF again")

    monkeypatch.setattr(through_gguf, "load_gguf_checkpoint", refuse)
    model, tokenizer = load_hf_policy(name, cache)
    assert tokenizer.apply_chat_template([{"role": "user", "content": "hi"}], tokenize=False).startswith("<|im_start|>")
    tensors = {t.name: t for t in GGUFFile(ensure_gguf(name, cache)).tensors}
    layers = model.model.layers
    pairs = {"token_embd.weight": model.model.embed_tokens.weight, "output.weight": model.lm_head.weight,
             "blk.0.attn_q.weight": layers[0].self_attn.q_proj.weight, "blk.0.attn_q.bias": layers[0].self_attn.q_proj.bias,
             "blk.0.ffn_down.weight": layers[0].mlp.down_proj.weight}
    kinds = {tensors[key].tensor_type.name for key in pairs}
    assert kinds == {"Q5_0", "Q8_0", "Q6_K", "F32"}, kinds
    for key, param in pairs.items():
        t = tensors[key]
        assert param.dtype == torch.float32
        assert torch.equal(param.detach(), torch.tensor(gguf.quants.dequantize(t.data, t.tensor_type))), key


def test_an_exported_folder_records_its_digests_rebuilds_when_stale_and_refuses_a_changed_file(tmp_path):
    """The dequantized and code-built model folders (components/embedded/models.py ``_export_once``): each file's
    sha256 recorded at build; a folder from before the record, or from another source, is rebuilt; a file whose bytes
    changed afterwards is refused with the file named."""
    from components.embedded.models import DIGESTS, _export_once

    builds = []

    def save(tmp):
        builds.append(tmp)
        (Path(tmp) / "config.json").write_text('{"a": 1}')
        (Path(tmp) / "model.safetensors").write_bytes(bytes(range(256)) * 16)

    folder = tmp_path / "m.hf"
    assert _export_once(folder, "model.safetensors", save, source="gguf sha A") == folder
    record = json.loads((folder / DIGESTS).read_text())
    assert record["source"] == "gguf sha A"
    assert record["files"]["model.safetensors"]["sha256"] == sha256_file(folder / "model.safetensors")
    assert sorted(record["files"]) == ["config.json", "model.safetensors"]
    _export_once(folder, "model.safetensors", save, source="gguf sha A")
    assert len(builds) == 1  # built once

    _export_once(folder, "model.safetensors", save, source="gguf sha B")  # another source: stale, rebuilt
    assert len(builds) == 2 and json.loads((folder / DIGESTS).read_text())["source"] == "gguf sha B"
    (folder / DIGESTS).unlink()  # a folder from before digests were recorded: rebuilt, not trusted
    _export_once(folder, "model.safetensors", save, source="gguf sha B")
    assert len(builds) == 3 and (folder / DIGESTS).is_file()

    weights = folder / "model.safetensors"
    original = weights.read_bytes()
    data = bytearray(original)
    data[10] ^= 0xFF
    weights.write_bytes(bytes(data))
    with pytest.raises(ModelIntegrityError, match=r"model.safetensors: sha256 \w+ does not match .* recorded in "
                                                  "digests.json .* refusing to load"):
        _export_once(folder, "model.safetensors", save, source="gguf sha B")
    weights.write_bytes(original)  # the same bytes again (a new mtime): re-hashed and accepted
    _export_once(folder, "model.safetensors", save, source="gguf sha B")
    (folder / "config.json").unlink()
    weights.write_bytes(bytes(range(256)) * 16)
    with pytest.raises(ModelIntegrityError, match="config.json is missing"):
        _export_once(folder, "model.safetensors", save, source="gguf sha B")
    assert len(builds) == 3  # a changed or missing file is refused, never silently rebuilt


def test_setup_builds_the_transformers_copy_of_each_model_the_default_params_train():
    """scripts/setup.sh runs components.embedded.assemble, which dequantizes the models an ``hf`` backend serves."""
    from components.embedded.assemble import trained_in_transformers

    assert trained_in_transformers() == ["qwen2.5-coder-0.5b-instruct"]  # the trainable policy, not the 1.5B judge
