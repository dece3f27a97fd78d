"""LlamaCppRolloutEngine: log-prob bookkeeping (no server), and against the HF reference engine for the same
LoRA adapter on the embedded 0.5B (needs .venv/bin/llama-server; skipped when it is absent).

The engines are compared by the log-probabilities they give the same tokens, never by exact greedy ties:
llama.cpp runs the Q4_K_M weights with 8-bit quantized activations, transformers the same weights dequantized to
fp32, so logits differ by a few hundredths and a greedy continuation flips wherever the top two tokens are that
close, which depends on the CPU (a clean clone on another machine matched 2 of 4 continuations where this one
matched 4). So each served continuation is scored teacher-forced by HF and the two engines' log-probs of those
tokens are compared: measured here (4 prompts x 12 greedy tokens) a mean gap of about 0.01 nats, max about
0.1; the tests ask for a mean under 0.05 and a max under 0.5 nats. Which adapter is served is told apart the
same way: the served tokens' log-probs sit closer to HF under the served adapter than under the other one.
"""

import math
from dataclasses import replace
from statistics import mean

import pytest
import torch

from components.embedded.models import ensure_gguf, load_hf_policy
from components.training.engines.llamacpp import LlamaCppRolloutEngine
from components.training.engines.rollout import SamplingParams
from components.training.model import LoRASettings, build_policy
from tests.embedded.native import requires_native_server

MODEL = "qwen2.5-coder-0.5b-instruct"
QUESTIONS = [
    "What is the capital of France?",
    "Name three primary colours.",
    "Write a Python function that adds two numbers.",
    "In which year did the Second World War end?",
]


def test_reported_logprobs_align_by_token_id():
    # the server skips a token that ends inside a UTF-8 character (6) and trims a stop string's (8)
    probs = [{"id": 5, "logprob": -0.5}, {"id": 7, "logprob": -1.5}]
    assert LlamaCppRolloutEngine._align([5, 6, 7, 8], probs, post=False) == [-0.5, None, -1.5, None]
    post = [{"id": 5, "prob": 0.25}]
    assert LlamaCppRolloutEngine._align([5], post, post=True) == [pytest.approx(math.log(0.25))]


@pytest.fixture(scope="module")
def setup(repo_root, tmp_path_factory):
    """The HF policy with a LoRA adapter whose B matrices are random (so it changes the outputs), and the
    native engine serving the same adapter."""
    torch.set_num_threads(2)
    gguf = ensure_gguf(MODEL, repo_root / ".cache")
    model, tok = load_hf_policy(MODEL, repo_root / ".cache")
    torch.manual_seed(0)  # the A matrices come from the global RNG: without this they depended on test order
    policy = build_policy(model, lora=LoRASettings(r=8, alpha=16))
    g = torch.Generator().manual_seed(0)
    with torch.no_grad():
        for name, p in policy.model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.02)
    prompts = [
        tok.apply_chat_template([{"role": "user", "content": q}], add_generation_prompt=True, tokenize=True)[
            "input_ids"
        ]
        for q in QUESTIONS
    ]
    engine = LlamaCppRolloutEngine(gguf, tok, parallel=4, n_ctx=512, seed=0,
                                   adapter_dir=tmp_path_factory.mktemp("adapters"))
    yield policy, tok, prompts, engine
    engine.close()


def _teacher_forced(policy, g, temperature=1.0):
    """(how many of ``g``'s tokens HF's greedy decoding reproduces, HF's log-probs of ``g``'s tokens)."""
    ids = torch.tensor([g.prompt_ids + g.token_ids])
    with torch.no_grad():
        logits = policy.model(input_ids=ids).logits[0, len(g.prompt_ids) - 1 : -1].float()
    lps = torch.log_softmax(logits / temperature, dim=-1).gather(-1, torch.tensor(g.token_ids)[:, None])[:, 0]
    greedy = logits.argmax(dim=-1).tolist()
    agree = next((i for i, (a, b) in enumerate(zip(greedy, g.token_ids, strict=True)) if a != b), len(greedy))
    return agree, lps.tolist()


def _gap_to_trained_weights(policy, gens, temperature):
    diffs = [abs(a - b) for g in gens for a, b in zip(g.logprobs, _teacher_forced(policy, g, temperature)[1])]
    return sum(diffs) / len(diffs)


def _gaps(policy, gens, temperature=1.0):
    """|served log-prob - HF's teacher-forced log-prob| of every served token."""
    out = []
    for g in gens:
        assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
        out += [abs(a - b) for a, b in zip(g.logprobs, _teacher_forced(policy, g, temperature)[1], strict=True)]
    return out


@pytest.mark.embedded
@requires_native_server
def test_greedy_continuations_score_as_hf_with_the_same_adapter(setup, conformance):
    policy, _, prompts, engine = setup
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    engine.update_weights(policy, 0)
    assert set(engine.last_update) == {"save_s", "convert_s", "restart_s", "swap_s"}
    served = engine.generate(prompts, greedy)

    gaps = _gaps(policy, served)
    conformance.check("llama.cpp rollout log-probs (mean gap, nats)", "HF transformers, teacher-forced, same adapter",
                      mean(gaps), 0.0, tol=0.05, note="Q4_K_M + 8-bit activations vs fp32 dequantized")
    conformance.check("llama.cpp rollout log-probs (max gap, nats)", "HF transformers, teacher-forced, same adapter",
                      max(gaps), 0.0, tol=0.5)
    with policy.model.disable_adapter():  # the adapter is applied: HF without it scores the served tokens worse
        unadapted = _gaps(policy, served)
    assert mean(unadapted) > 2 * mean(gaps), (unadapted, gaps)


@pytest.mark.embedded
@requires_native_server
def test_sampling_is_seeded_scored_and_stops_on_strings(setup):
    policy, tok, prompts, engine = setup
    engine.update_weights(policy, 1)
    # T=1: raw-logit scores, the stop string's tokens re-scored; T=0.7: scores after the sampler chain
    for sampling in (SamplingParams(max_new_tokens=24, temperature=1.0, stop_strings=(".",)),
                     SamplingParams(max_new_tokens=24, temperature=0.7)):
        gens = engine.generate([prompts[2]] * 4, sampling)
        assert len({tuple(g.token_ids) for g in gens}) > 1  # one seed per sample, not one per call
        for g in gens:
            assert g.prompt_ids == prompts[2]
            assert g.logprobs is not None and len(g.logprobs) == len(g.token_ids)
            assert all(lp <= 0 for lp in g.logprobs)
        assert _gap_to_trained_weights(policy, gens, sampling.temperature) < 0.1
    seeded = SamplingParams(max_new_tokens=12, temperature=1.0, seed=5)  # a request's seed: prompt i gets seed + i
    with engine.batch_invariant():  # slots decoded together differ in the last bits, and so their samples can
        first = [g.token_ids for g in engine.generate([prompts[2]] * 3, seeded)]
        assert [g.token_ids for g in engine.generate([prompts[2]] * 3, seeded)] == first
        assert [g.token_ids for g in engine.generate([prompts[2]] * 2, replace(seeded, seed=6))] == first[1:]
    assert len({tuple(t) for t in first}) > 1
    for g in engine.generate([prompts[2]] * 4, SamplingParams(max_new_tokens=24, stop_strings=(".",))):
        text = tok.decode(g.token_ids)
        if g.finish_reason == "stop" and "." in text:  # the stop string: trimmed from the text
            assert "." not in g.text and text.startswith(g.text)
        elif g.finish_reason == "stop":  # an end-of-turn token before any "." (a sample may answer in a line)
            assert g.token_ids[-1] in {tok.eos_token_id, tok.convert_tokens_to_ids("<|im_end|>")}, text
        else:
            assert len(g.token_ids) == 24
    [full] = engine.generate([prompts[1]], SamplingParams(max_new_tokens=8, temperature=0.0))
    stop = full.token_ids[3]
    [cut] = engine.generate([prompts[1]], SamplingParams(max_new_tokens=8, temperature=0.0, stop_token_ids=(stop,)))
    assert cut.token_ids == full.token_ids[: full.token_ids.index(stop) + 1] and cut.finish_reason == "stop"
    # same tokens, but a cached prompt changes the batch shapes: logits move in the last bits
    assert cut.logprobs == pytest.approx(full.logprobs[: len(cut.token_ids)], abs=0.05)


class _NoServer:
    def __init__(self, *args, **kwargs):
        self.root_url = "http://unused"

    def start(self):
        return self

    def stop(self):
        pass


def test_batch_invariant_requests_go_alone_and_reuse_no_cached_prompt(monkeypatch):
    import threading
    import time

    import components.training.engines.llamacpp as module

    monkeypatch.setattr(module, "NativeLlamaServer", _NoServer)
    engine = LlamaCppRolloutEngine("unused.gguf", parallel=4)
    lock, state, bodies = threading.Lock(), {"now": 0, "most": 0}, []

    def send(body):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
            bodies.append(body)
        time.sleep(0.05)
        with lock:
            state["now"] -= 1
        return {"tokens": [1], "stop_type": "eos", "completion_probabilities": [{"id": 1, "logprob": -0.1}]}

    monkeypatch.setattr(engine, "_send", send)
    greedy = SamplingParams(max_new_tokens=4, temperature=0.0)
    engine.generate([[1, 2]] * 4, greedy)
    assert state["most"] > 1 and all(b["cache_prompt"] for b in bodies)  # batched: in flight together, cached
    state["most"], bodies[:] = 0, []
    with engine.batch_invariant():
        engine.generate([[1, 2]] * 4, greedy)
    assert state["most"] == 1 and len(bodies) == 4 and not any(b["cache_prompt"] for b in bodies)
    state["most"], bodies[:] = 0, []
    engine.generate([[1, 2]] * 4, greedy)  # the block restores batched serving
    assert state["most"] > 1 and all(b["cache_prompt"] for b in bodies)
    engine.close()


@pytest.mark.embedded
@requires_native_server
def test_a_batch_invariant_continuation_depends_on_its_own_prompt_only(setup):
    """The same greedy request alone on a fresh slot, and among three neighbours after the slots cached other
    prompts: identical tokens and bit-identical log-probs inside ``batch_invariant()``."""
    _, _, prompts, engine = setup
    greedy = SamplingParams(max_new_tokens=16, temperature=0.0)
    with engine.batch_invariant():
        alone = engine.generate([prompts[0]], greedy)[0]
    engine.generate(prompts[1:], greedy)  # other prompts cached in the slots
    with engine.batch_invariant():
        crowded = engine.generate([prompts[1], prompts[0], prompts[2], prompts[3]], greedy)[1]
    assert crowded.token_ids == alone.token_ids
    assert crowded.logprobs == alone.logprobs  # exact: not one ulp of drift


@pytest.mark.embedded
@requires_native_server
def test_the_model_s_active_adapter_is_the_one_served(setup):
    """A model with two adapters (ARCO's mu beside its reference): update_weights hands over the active one."""
    from peft import LoraConfig

    policy, _, prompts, engine = setup
    greedy = SamplingParams(max_new_tokens=12, temperature=0.0)
    model = policy.model
    model.add_adapter("other", LoraConfig(r=8, lora_alpha=16, target_modules=sorted(model.peft_config["default"].target_modules)))
    g = torch.Generator().manual_seed(1)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B.other" in name:
                p.copy_(torch.randn(p.shape, generator=g) * 0.05)
    try:
        engine.update_weights(policy, 1)  # "default" active
        served_default = engine.generate(prompts, greedy)
        model.set_adapter("other")
        engine.update_weights(policy, 2)
        saved = engine.adapter_dir / "step_000002"
        assert (saved / "other" / "adapter_model.safetensors").is_file() and not (saved / "adapter_model.safetensors").exists()
        served_other = engine.generate(prompts, greedy)
        under_other = _gaps(policy, served_other)  # HF scores with "other" active
        model.set_adapter("default")
        under_default = _gaps(policy, served_other)
        mean_other, mean_default = mean(under_other), mean(under_default)
        assert mean_other < 0.05 and max(under_other) < 0.5, under_other
        assert mean_default > 2 * mean_other, (mean_default, mean_other)  # "other" is what was served
        assert mean(_gaps(policy, served_default)) < 0.05
    finally:
        model.set_adapter("default")
        model.delete_adapter("other")
        engine.update_weights(policy, 3)
