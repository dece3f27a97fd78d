"""``train_policy.device`` / ``train_policy.dtype``: how each setting resolves on machines with and without
CUDA, the refusal of a CUDA device the machine lacks (naming the key), the dtype the trainable-model loaders
hand back (the policy's and ARCO's rubric model's, from a tiny saved Qwen2 folder), and the run key, which holds
the dtype only when it is not float32. The ``gpu`` test loads onto CUDA in bfloat16 (``scripts/gpu_tests.sh``)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from components.params import Params
from components.params_load import load_params
from components.params_section import ParamsError
from components.run_spec import run_spec
from components.training.device import Placement, placement, resolve_device, resolve_dtype
from components.training.model import LoRASettings, build_policy, load_trainable_policy
from components.training.tiny import tiny_qwen2

ROOT = Path(__file__).resolve().parents[2]
NO_CUDA = not torch.cuda.is_available()
CHARS = "abcdefghij"


@pytest.mark.parametrize(("setting", "cuda_count", "device"), [
    ("auto", 0, "cpu"), ("cpu", 0, "cpu"), ("auto", 1, "cuda"), ("cpu", 2, "cpu"),
    ("cuda", 1, "cuda"), ("cuda:0", 1, "cuda:0"), ("cuda:1", 2, "cuda:1"),
])
def test_device_resolution(setting, cuda_count, device):
    assert resolve_device(setting, cuda_count=cuda_count) == torch.device(device)


@pytest.mark.parametrize(("setting", "device", "dtype"), [
    ("auto", "cpu", torch.float32), ("auto", "cuda", torch.bfloat16), ("float32", "cuda", torch.float32),
    ("bfloat16", "cpu", torch.bfloat16), ("float16", "cuda", torch.float16),
])
def test_dtype_resolution(setting, device, dtype):
    assert resolve_dtype(setting, torch.device(device)) == dtype


@pytest.mark.parametrize(("setting", "cuda_count", "message"), [
    ("cuda", 0, r"train_policy.device=cuda: this machine has no CUDA device"),
    ("cuda:0", 0, r"train_policy.device=cuda:0: this machine has no CUDA device"),
    ("cuda:2", 2, r"train_policy.device=cuda:2: only 2 CUDA device\(s\) visible"),
    ("gpu", 1, r"train_policy.device=gpu: expected auto, cpu, cuda or cuda:N"),
])
def test_a_device_the_machine_lacks_is_refused_naming_the_key(setting, cuda_count, message):
    with pytest.raises(ParamsError, match=message):
        resolve_device(setting, cuda_count=cuda_count)


def test_params_refuse_an_unknown_device_or_dtype():
    for override in ("train_policy.device=gpu", "train_policy.dtype=fp8"):
        with pytest.raises(ParamsError, match=override.split("=")[0]):
            load_params(ROOT / "params.yaml", overrides=[override])


@pytest.mark.skipif(not NO_CUDA, reason="what a machine without CUDA resolves")
def test_without_cuda_auto_is_the_cpu_in_float32_and_explicit_cuda_fails_at_load(tiny_folder):
    assert placement(load_params(ROOT / "params.yaml").train_policy) == Placement(torch.device("cpu"), torch.float32)
    assert placement(load_params(ROOT / "params.yaml", "paper").train_policy) == Placement(torch.device("cpu"), torch.float32)
    with pytest.raises(ParamsError, match="train_policy.device=cuda"):
        load_trainable_policy(run_spec(tiny_params(tiny_folder, device="cuda")))


@pytest.fixture(scope="module")
def tiny_folder(tmp_path_factory) -> Path:
    """A tiny random Qwen2 and a word-level tokenizer over its characters, saved as a transformers folder."""
    from tokenizers import Tokenizer
    from tokenizers.models import WordLevel
    from tokenizers.pre_tokenizers import Split
    from transformers import PreTrainedTokenizerFast

    folder = tmp_path_factory.mktemp("tiny_policy")
    vocab = {"<pad>": 0, "</s>": 1, **{c: i + 2 for i, c in enumerate(CHARS)}}
    core = Tokenizer(WordLevel(vocab, unk_token="<pad>"))
    core.pre_tokenizer = Split("", behavior="isolated")
    PreTrainedTokenizerFast(tokenizer_object=core, pad_token="<pad>", eos_token="</s>").save_pretrained(folder)
    tiny_qwen2(len(vocab), seed=0).save_pretrained(folder)
    return folder


def tiny_params(folder: Path, **train_policy: str) -> Params:
    """The default params with ``trainable_policy`` bound to the tiny folder (an hf backend)."""
    data = load_params(ROOT / "params.yaml").model_dump()
    data["llm"]["backends"]["tiny"] = {"type": "hf", "model": str(folder)}
    data["llm"]["roles"]["trainable_policy"] = "tiny"
    data["train_policy"].update(train_policy)
    return Params.model_validate(data)


def weights_dtype(model) -> set[torch.dtype]:
    return {p.dtype for p in model.parameters()}


@pytest.mark.parametrize(("dtype", "expected"), [("auto", torch.float32), ("float32", torch.float32),
                                                 ("bfloat16", torch.bfloat16)])
def test_the_loaders_give_the_requested_dtype_on_the_cpu(tiny_folder, dtype, expected):
    from components.methods.arco.model_setup import load_backbone

    params = tiny_params(tiny_folder, device="cpu", dtype=dtype)
    model, tokenizer = load_trainable_policy(run_spec(params))
    assert weights_dtype(model) == {expected} and {p.device.type for p in model.parameters()} == {"cpu"}
    assert tokenizer.convert_tokens_to_ids("c") == 4
    policy = build_policy(model, lora=LoRASettings(r=4, alpha=8))  # a model object keeps its dtype
    assert policy.model.get_base_model().model.embed_tokens.weight.dtype == expected
    ids = torch.tensor([[2, 3, 4, 5]])
    assert torch.isfinite(policy.token_logprobs(ids, torch.ones_like(ids))).all()
    mu, _ = load_backbone(run_spec(params), "trainable_policy")  # ARCO's rubric model loads the same way
    assert weights_dtype(mu) == {expected}


def test_the_run_key_holds_the_dtype_only_when_it_is_not_float32():
    from components.training.grpo.policy_run_key import run_settings

    base = load_params(ROOT / "params.yaml")
    default = run_settings(base, "grpo")
    assert "device" not in default["train_policy"] and "dtype" not in default["train_policy"]
    on_cpu = run_settings(load_params(ROOT / "params.yaml", overrides=["train_policy.device=cpu",
                                                                      "train_policy.dtype=float32"]), "grpo")
    assert on_cpu == default
    bf16 = run_settings(load_params(ROOT / "params.yaml", overrides=["train_policy.dtype=bfloat16"]), "grpo")
    assert bf16["train_policy"] == {**default["train_policy"], "dtype": "bfloat16"}


def test_the_run_key_holds_deepspeed_only_once_a_zero_stage_is_set():
    from components.training.grpo.policy_run_key import run_settings

    default = run_settings(load_params(ROOT / "params.yaml"), "grpo")
    assert "deepspeed" not in default["train_policy"]
    offload_only = run_settings(load_params(ROOT / "params.yaml", overrides=[
        "train_policy.deepspeed.offload_optimizer=true"]), "grpo")
    assert offload_only == default  # no ZeRO stage: the plain loop, whatever the offload flag says
    zero3 = run_settings(load_params(ROOT / "params.yaml", overrides=["train_policy.deepspeed.zero_stage=3"]), "grpo")
    assert zero3["train_policy"]["deepspeed"]["zero_stage"] == 3
    with pytest.raises(Exception, match="offload_params needs zero_stage: 3"):
        load_params(ROOT / "params.yaml", overrides=["train_policy.deepspeed.zero_stage=2",
                                                     "train_policy.deepspeed.offload_params=true"])


@pytest.mark.gpu
@pytest.mark.skipif(NO_CUDA, reason="needs CUDA")
@pytest.mark.parametrize("device", ["auto", "cuda", "cuda:0"])
def test_the_policy_loads_onto_cuda_in_bfloat16(tiny_folder, device):
    from components.methods.arco.model_setup import load_backbone

    params = tiny_params(tiny_folder, device=device)  # dtype auto: bfloat16 on CUDA
    assert placement(params.train_policy).dtype == torch.bfloat16
    model, _ = load_trainable_policy(run_spec(params))
    assert weights_dtype(model) == {torch.bfloat16}
    assert {p.device.type for p in model.parameters()} == {"cuda"}
    policy = build_policy(model, lora=LoRASettings(r=4, alpha=8))
    assert policy.device.type == "cuda"  # build_policy no longer moves a model object back to the CPU
    ids = torch.tensor([[2, 3, 4, 5]], device=policy.device)
    logp = policy.token_logprobs(ids, torch.ones_like(ids))
    assert logp.device.type == "cuda" and torch.isfinite(logp).all()
    (-logp.sum()).backward()
    assert all(p.grad is not None for p in policy.trainable_parameters())
    mu, _ = load_backbone(run_spec(params), "trainable_policy")
    assert weights_dtype(mu) == {torch.bfloat16} and next(mu.parameters()).device.type == "cuda"
