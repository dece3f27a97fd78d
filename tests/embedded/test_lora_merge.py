"""LoRA adapters folded into a GGUF model: the merged weight is W + (alpha / r) B A up to Q8_0 rounding, two
adapters add, every other tensor and the metadata are copied byte for byte, and an adapter that does not
fit the base is refused with the file and tensor named. Runs on a tiny hand-written GGUF (no model files)."""

import asyncio
import json

import httpx
import numpy as np
import pytest

from components.embedded.lora_gguf import peft_to_gguf, random_lora_gguf
from components.embedded.lora_merge import LoraMergeError, ensure_merged_gguf, merge_lora_into_gguf
from components.embedded.models import ensure_gguf
from components.embedded.native_server import NativeLlamaServer
from components.llm.base import Sampling, user
from components.llm.factory import LLMPool
from components.params_load import load_params
from components.params_section import ParamsError
from tests.embedded.native import requires_native_server
from tests.side_by_side import run_side_by_side

gguf = pytest.importorskip("gguf")

N_IN, N_OUT, R, ALPHA = 64, 96, 4, 8


def _base(path, rng):
    weights = {"blk.0.attn_q.weight": rng.standard_normal((N_OUT, N_IN)).astype(np.float32),
               "blk.0.ffn_up.weight": rng.standard_normal((N_OUT, N_IN)).astype(np.float32)}
    writer = gguf.GGUFWriter(str(path), arch="qwen2")
    writer.add_string("general.name", "tiny")
    writer.add_block_count(1)
    writer.add_array("tokenizer.ggml.tokens", ["a", "b", "c"])
    embd = gguf.quants.quantize(rng.standard_normal((8, N_IN)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("token_embd.weight", embd, raw_shape=embd.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    for name, w in weights.items():
        writer.add_tensor(name, w)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    return weights


def _adapter(folder, rng, n_in=N_IN, modules=("q_proj",)):
    from safetensors.numpy import save_file

    tensors = {}
    for module in modules:
        block = "self_attn" if module == "q_proj" else "mlp"
        key = f"base_model.model.model.layers.0.{block}.{module}"
        tensors[f"{key}.lora_A.weight"] = rng.standard_normal((R, n_in)).astype(np.float32)
        tensors[f"{key}.lora_B.weight"] = rng.standard_normal((N_OUT, R)).astype(np.float32)
    folder.mkdir()
    save_file(tensors, str(folder / "adapter_model.safetensors"))
    (folder / "adapter_config.json").write_text(json.dumps({"r": R, "lora_alpha": ALPHA, "bias": "none"}))
    return peft_to_gguf(folder, folder / "adapter.gguf"), tensors


def _tensors(path):
    reader = gguf.GGUFReader(str(path))
    return reader, {t.name: t for t in reader.tensors}


def _delta(tensors, module, block="self_attn"):
    key = f"base_model.model.model.layers.0.{block}.{module}"
    return ALPHA / R * tensors[f"{key}.lora_B.weight"] @ tensors[f"{key}.lora_A.weight"]


def test_merged_weight_is_base_plus_scaled_product(tmp_path):
    rng = np.random.default_rng(0)
    weights = _base(tmp_path / "base.gguf", rng)
    adapter, lora = _adapter(tmp_path / "a", rng)
    merged = merge_lora_into_gguf(tmp_path / "base.gguf", [adapter], tmp_path / "merged.gguf")

    reader, tensors = _tensors(merged)
    q = tensors["blk.0.attn_q.weight"]
    assert q.tensor_type == gguf.GGMLQuantizationType.Q8_0
    got = gguf.quants.dequantize(q.data, q.tensor_type)
    want = weights["blk.0.attn_q.weight"] + _delta(lora, "q_proj")
    # Q8_0 rounds each block of 32 to steps of its max / 127 (half a step), with the step stored as f16
    # (relative error 2^-11, times at most 127 steps: another 0.062 step)
    step = np.abs(want.reshape(N_OUT, -1, 32)).max(axis=-1, keepdims=True) / 127
    assert np.all(np.abs(got - want).reshape(N_OUT, -1, 32) <= 0.57 * step)
    assert np.abs(_delta(lora, "q_proj")).max() > 10 * step.max()  # the delta is far above the rounding

    _, base_tensors = _tensors(tmp_path / "base.gguf")
    for name in ("token_embd.weight", "blk.0.ffn_up.weight"):  # not adapted: copied as they were
        assert tensors[name].tensor_type == base_tensors[name].tensor_type
        assert np.array_equal(np.asarray(tensors[name].data), np.asarray(base_tensors[name].data))
    assert reader.fields["general.name"].contents() == "tiny"
    assert reader.fields["general.architecture"].contents() == "qwen2"
    assert reader.fields["tokenizer.ggml.tokens"].contents() == ["a", "b", "c"]
    assert reader.fields["qwen2.block_count"].contents() == 1


def test_two_adapters_add(tmp_path):
    rng = np.random.default_rng(1)
    weights = _base(tmp_path / "base.gguf", rng)
    first, lora1 = _adapter(tmp_path / "a", rng)
    second, lora2 = _adapter(tmp_path / "b", rng, modules=("q_proj", "up_proj"))
    merged = merge_lora_into_gguf(tmp_path / "base.gguf", [first, second], tmp_path / "merged.gguf")
    _, tensors = _tensors(merged)
    for name, want in (
        ("blk.0.attn_q.weight", weights["blk.0.attn_q.weight"] + _delta(lora1, "q_proj") + _delta(lora2, "q_proj")),
        ("blk.0.ffn_up.weight", weights["blk.0.ffn_up.weight"] + _delta(lora2, "up_proj", "mlp")),
    ):
        got = gguf.quants.dequantize(tensors[name].data, tensors[name].tensor_type)
        np.testing.assert_allclose(got, want, atol=np.abs(want).max() / 127)


def test_adapter_that_does_not_fit_is_refused_and_nothing_is_written(tmp_path):
    rng = np.random.default_rng(2)
    _base(tmp_path / "base.gguf", rng)
    adapter, _ = _adapter(tmp_path / "a", rng, n_in=32)
    with pytest.raises(LoraMergeError, match=r"blk\.0\.attn_q\.weight.*does not fit"):
        merge_lora_into_gguf(tmp_path / "base.gguf", [adapter], tmp_path / "merged.gguf")
    assert not (tmp_path / "merged.gguf").exists()


def test_merged_model_is_cached_per_adapter_content(tmp_path):
    rng = np.random.default_rng(3)
    _base(tmp_path / "base.gguf", rng)
    first, _ = _adapter(tmp_path / "a", rng)
    second, _ = _adapter(tmp_path / "b", rng)
    one = ensure_merged_gguf(tmp_path / "base.gguf", [first], tmp_path / "cache")
    assert ensure_merged_gguf(tmp_path / "base.gguf", [first], tmp_path / "cache") == one
    assert ensure_merged_gguf(tmp_path / "base.gguf", [second], tmp_path / "cache") != one


def _merge_when_told(start, base, adapter, cache):
    start.wait()
    ensure_merged_gguf(base, [adapter], cache)


def test_processes_that_need_one_merged_model_at_once_all_get_it(tmp_path):
    """Two evaluations started side by side once crashed here: both wrote the same `.partial` name and the
    second rename found it gone."""
    rng = np.random.default_rng(4)
    _base(tmp_path / "base.gguf", rng)
    adapter, _ = _adapter(tmp_path / "a", rng)
    assert run_side_by_side(_merge_when_told, tmp_path / "base.gguf", adapter, tmp_path / "cache") == [0, 0, 0]
    merged = ensure_merged_gguf(tmp_path / "base.gguf", [adapter], tmp_path / "cache")
    direct = merge_lora_into_gguf(tmp_path / "base.gguf", [adapter], tmp_path / "direct.gguf")
    assert merged.read_bytes() == direct.read_bytes()
    assert [p.name for p in merged.parent.iterdir() if "partial" in p.name] == []


def test_merge_lora_without_an_adapter_is_a_params_error(repo_root):
    with pytest.raises(ParamsError, match="merge_lora needs an adapter"):
        load_params(repo_root / "params.yaml", overrides=["llm.backends.embedded-0_5b.merge_lora=true"])


def _greedy(root_url: str, prompt: str, n: int = 24) -> tuple[list, list[float]]:
    body = {"prompt": prompt, "n_predict": n, "temperature": 0.0, "ignore_eos": True, "cache_prompt": False,
            "n_probs": 1}
    reply = httpx.post(f"{root_url}/completion", json=body, timeout=300).json()["completion_probabilities"]
    return [p["id"] for p in reply], [p["logprob"] for p in reply]


@pytest.fixture(scope="module")
def served(repo_root, tmp_path_factory):
    """(base GGUF, a cache folder that sees it, a random r=8 adapter on every matrix (the SFT warm start's size)
    as a peft folder, that adapter merged into the base through the cache): built once for the tests below."""
    base = ensure_gguf("qwen2.5-coder-0.5b-instruct", repo_root / ".cache")
    root = tmp_path_factory.mktemp("served")
    (root / "cache").mkdir()
    (root / "cache" / "models").symlink_to(base.parent)  # merged models go to this cache, the base is shared
    adapter = random_lora_gguf(base, root / "adapter", seed=7)
    return base, root / "cache", adapter.parent, ensure_merged_gguf(base, [adapter], root / "cache")


@pytest.mark.embedded
@requires_native_server
def test_the_merged_model_serves_what_the_runtime_adapter_serves(repo_root, served, tmp_path):
    """The real 0.5B with a random adapter, served merged and served with --lora: greedy continuations agree
    and the log-probs of the chosen tokens differ far less than the adapter itself moves them (the base
    model's are the yardstick)."""
    base, cache, adapter_dir, merged = served
    adapter = adapter_dir / "adapter.gguf"
    prompts = ["The capital of France is", "def fibonacci(n):", "Search results: [1] The film was directed by"]
    runs = {}
    for name, (model, lora) in {"runtime": (base, adapter), "merged": (merged, None), "base": (base, None)}.items():
        with NativeLlamaServer(model, n_ctx=256, parallel=1, lora=lora) as server:
            runs[name] = [_greedy(server.root_url, p) for p in prompts]

    def gap(a, b):
        same = [(la, lb) for (ta, las), (tb, lbs) in zip(a, b) for x, y, la, lb in zip(ta, tb, las, lbs) if x == y]
        return sum(abs(la - lb) for la, lb in same) / max(len(same), 1)

    agreed = sum(ta == tb for (ta, _), (tb, _) in zip(runs["runtime"], runs["merged"]))
    assert agreed >= 2, (runs["runtime"], runs["merged"])
    assert runs["runtime"] != runs["base"]  # the adapter changes what is served
    assert gap(runs["runtime"], runs["merged"]) < gap(runs["runtime"], runs["base"]) / 4

    # the backend option serves the merged file, under another cache identity than the runtime adapter
    params = load_params(repo_root / "params.yaml", overrides=[
        f"llm.backends.embedded-0_5b-sft.lora={adapter_dir}", "llm.roles.policy=embedded-0_5b-sft"])
    params.run.cache_dir = str(cache)
    identities = {}
    for merge in (False, True):
        params.llm.backends["embedded-0_5b-sft"].merge_lora = merge
        with LLMPool(params, cache_path=tmp_path / f"responses-{merge}.sqlite") as pool:
            policy = pool.role("policy")
            assert asyncio.run(policy.chat([user(prompts[0])], Sampling(temperature=0.0, max_tokens=4))).ok
            server = pool._servers[0]
            assert (server.loras == ()) is merge
            assert (server.model_path == merged) is merge  # the adapter's content names it: merged once
            identities[merge] = policy.cache_identity()
    assert identities[True] != identities[False]


@pytest.mark.embedded
@requires_native_server
def test_rl_engine_serves_the_warm_start_merged_and_swaps_only_the_trained_adapter(repo_root, served, tmp_path):
    from components.run_spec import run_spec
    from components.training.engines.llamacpp import engine_for_policy

    base, cache, warm, merged = served
    params = load_params(repo_root / "params.yaml")
    params.run.cache_dir = str(cache)
    engine = engine_for_policy(run_spec(params), None, None, base_adapters=[warm])
    try:
        assert engine.server.loras == ()
        assert engine.server.model_path == merged
        rl = random_lora_gguf(base, tmp_path / "rl", seed=4)
        engine.load_adapter(rl)
        assert engine.server.loras == (rl,)  # the trained adapter alone rides on the merged warm start
    finally:
        engine.close()
