"""peft LoRA adapter -> llama.cpp LoRA GGUF: names, shapes, alpha and values survive, and the file equals the
one llama.cpp's own converter (vendored in the pinned sdist, kept by scripts/setup.sh) writes; unsupported
adapters are refused with the file and field named. Runs on a tiny random Qwen2 (no model files needed)."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch

from components.embedded.lora_gguf import LoraConversionError, ensure_lora_gguf, peft_to_gguf, read_lora_gguf
from components.training.model import LoRASettings, build_policy
from components.training.tiny import tiny_qwen2

VENDORED = Path(__file__).resolve().parents[2] / ".cache" / "llama.cpp-src"


@pytest.fixture
def adapter_dir(tmp_path):
    model = tiny_qwen2(16, num_layers=2, seed=0)
    model.config.architectures = ["Qwen2ForCausalLM"]
    model.config.save_pretrained(str(tmp_path / "base"))  # all the vendored converter needs of the base
    policy = build_policy(model, lora=LoRASettings(r=4, alpha=8))
    with torch.no_grad():  # peft starts B at zero; give every matrix distinct values
        for i, p in enumerate(p for n, p in policy.model.named_parameters() if "lora_" in n):
            p.copy_(torch.randn(p.shape, generator=torch.Generator().manual_seed(i)))
    path = tmp_path / "adapter"
    policy.model.save_pretrained(str(path))
    return path, {n: p.detach().clone() for n, p in policy.model.named_parameters() if "lora_" in n}


def test_round_trip_keeps_names_shapes_alpha_and_values(adapter_dir, tmp_path):
    path, params = adapter_dir
    meta, tensors = read_lora_gguf(peft_to_gguf(path, tmp_path / "a.gguf"))
    assert meta["general.type"] == "adapter"
    assert meta["general.architecture"] == "qwen2"
    assert meta["adapter.type"] == "lora"
    assert meta["adapter.lora.alpha"] == pytest.approx(8.0)
    assert len(tensors) == 2 * 7 * 2  # (A, B) x 7 modules x 2 layers
    a = tensors["blk.1.attn_output.weight.lora_a"]
    b = tensors["blk.1.ffn_down.weight.lora_b"]
    assert a.shape == (4, 32) and b.shape == (32, 4)  # [r, in] and [out, r], as llama.cpp's loader expects
    assert tensors["blk.0.ffn_gate.weight.lora_b"].shape == (64, 4)
    want_a = params["base_model.model.model.layers.1.self_attn.o_proj.lora_A.default.weight"].numpy()
    want_b = params["base_model.model.model.layers.1.mlp.down_proj.lora_B.default.weight"].numpy()
    np.testing.assert_array_equal(a, want_a)
    np.testing.assert_array_equal(b, want_b)


def test_same_file_as_the_vendored_converter(adapter_dir, tmp_path):
    scripts = sorted(VENDORED.glob("llama_cpp_python-*/vendor/llama.cpp/convert_lora_to_gguf.py"))
    if not scripts:
        pytest.skip(f"no llama.cpp source under {VENDORED} (scripts/setup.sh keeps it there)")
    path, _ = adapter_dir
    theirs = tmp_path / "vendored.gguf"
    subprocess.run([sys.executable, str(scripts[-1]), "--base", str(tmp_path / "base"), "--outtype", "f32",
                    "--outfile", str(theirs), str(path)], check=True, capture_output=True)
    meta_v, tensors_v = read_lora_gguf(theirs)
    meta, tensors = read_lora_gguf(peft_to_gguf(path, tmp_path / "ours.gguf"))
    assert {k: meta_v[k] for k in meta} == meta
    assert sorted(tensors_v) == sorted(tensors)
    for name, value in tensors.items():
        np.testing.assert_array_equal(tensors_v[name], value, err_msg=name)


def test_rslora_alpha_is_rescaled_for_llamacpp(adapter_dir, tmp_path):
    path, _ = adapter_dir
    config = json.loads((path / "adapter_config.json").read_text())
    config["use_rslora"] = True
    (path / "adapter_config.json").write_text(json.dumps(config))
    meta, _ = read_lora_gguf(peft_to_gguf(path, tmp_path / "a.gguf"))
    assert meta["adapter.lora.alpha"] == pytest.approx(8.0 * 2.0)  # alpha / sqrt(4) == (alpha * 2) / 4


@pytest.mark.parametrize("field,value", [("use_dora", True), ("bias", "all"), ("modules_to_save", ["lm_head"])])
def test_unsupported_adapters_are_refused_naming_the_field(adapter_dir, tmp_path, field, value):
    path, _ = adapter_dir
    config = json.loads((path / "adapter_config.json").read_text())
    config[field] = value
    (path / "adapter_config.json").write_text(json.dumps(config))
    with pytest.raises(LoraConversionError, match=f"adapter_config.json: field '{field}'"):
        peft_to_gguf(path, tmp_path / "a.gguf")


def test_ensure_converts_once_and_passes_gguf_through(adapter_dir, tmp_path):
    path, _ = adapter_dir
    first = ensure_lora_gguf(path, tmp_path / "cache")
    assert first.parent == tmp_path / "cache" / "lora"
    mtime = first.stat().st_mtime_ns
    assert ensure_lora_gguf(path, tmp_path / "cache") == first and first.stat().st_mtime_ns == mtime
    assert ensure_lora_gguf(first, tmp_path / "elsewhere") == first
    with pytest.raises(LoraConversionError, match="neither a .gguf file nor a peft adapter folder"):
        ensure_lora_gguf(tmp_path / "missing", tmp_path / "cache")
