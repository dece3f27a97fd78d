"""The training engine on CUDA, with tiny random Qwen2 models: a GRPO update and SFT steps give the CPU's
fp32 numbers, GRPO learns the verifiable reward, checkpoints resume exactly (and load into a CPU policy),
and a bf16 policy trains with finite losses close to fp32.

Opt in: ``pytest -m gpu tests/training/test_engine_gpu.py`` (every test skips without CUDA). On a GPU
machine that has torch, transformers and peft but not the project's other dependencies,
``scripts/gpu_tests.sh`` installs the wheels in ``.gpu_wheels/`` (e.g. pydantic, fetched elsewhere with
``pip download``) into a scratch folder and runs this file with the repository on ``PYTHONPATH``.
"""

import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from components.training.engines.rollout import HFRolloutEngine, RolloutSegment, SamplingParams, assemble
from components.training.grpo.trainer import GRPOTrainer
from components.training.model import LoRASettings, build_policy
from components.training.params import GRPOParams, SFTParams
from components.training.sft.examples import SFTExample
from components.training.sft.trainer import SFTTrainer
from components.training.tiny import CharTokenizer, tiny_qwen2

pytestmark = [pytest.mark.gpu, pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")]

ROOT = Path(__file__).resolve().parents[2]
TOK = CharTokenizer("abcdefghijklmn")
TARGET = TOK.encode("e")[0]
PROMPTS = ["abc", "bcd", "cde", "def", "efg", "fgh", "ghi", "hij"]
LORA = LoRASettings(r=8, alpha=16)

# An fp32 update on the GPU differs from the CPU's only by summation order (no TF32, see the fixture): ~1e-6
# relative per op. Four AdamW steps at lr 1e-2 move each LoRA weight by up to ~4e-2; the GPU's move may differ
# from the CPU's by ~1e-6 relative to it (the first Adam step, ~lr * sign(g), is most sensitive where a
# gradient is near Adam's eps), so 1e-4 relative (L2 over all LoRA weights) and 1e-4 absolute per weight
# (1% of one step's ~lr move) leave two orders of margin while a wrong gradient or a missed step (moves of
# ~lr) still fails.
REL_L2 = 1e-4
MAX_ABS = 1e-4


@pytest.fixture(autouse=True)
def full_fp32_matmuls():
    """fp32 matmuls in full precision (no TF32) on the GPU, as on the CPU, whatever another test set."""
    before = torch.get_float32_matmul_precision()
    torch.set_float32_matmul_precision("highest")
    yield
    torch.set_float32_matmul_precision(before)


def wide_qwen2():
    """Wider than the CPU tests' model (64 x 2 layers, MLP 128) so the GPU kernels have real work per op."""
    return tiny_qwen2(TOK.vocab_size, hidden_size=64, num_layers=2, num_heads=4, num_kv_heads=2,
                      intermediate_size=128, seed=0)


def target_fraction(episodes, ctx=None):
    return [sum(t == TARGET for t in e.response_ids) / max(len(e.response_ids), 1) for e in episodes]


def lora_weights(model, device="cpu"):
    return {n: p.detach().to(device, copy=True) for n, p in model.named_parameters() if p.requires_grad}


def copy_trainable(src, dst):
    """Give ``dst`` the trainable weights of ``src`` (same start on both devices, whatever peft's init did)."""
    weights = lora_weights(src)
    params = dict(dst.named_parameters())
    assert weights.keys() == {n for n, p in params.items() if p.requires_grad}
    with torch.no_grad():
        for name, value in weights.items():
            params[name].copy_(value)


def update_gap(start, cpu_after, gpu_after):
    """(largest CPU move, relative L2 and max abs difference of the GPU's move from the CPU's)."""
    cpu_move = torch.cat([(cpu_after[n] - start[n]).flatten() for n in start])
    gpu_move = torch.cat([(gpu_after[n].float() - start[n]).flatten() for n in start])
    diff = gpu_move - cpu_move
    return float(cpu_move.abs().max()), float(diff.norm() / cpu_move.norm()), float(diff.abs().max())


def assert_on_cuda(model, optimizer=None):
    assert all(p.is_cuda for p in model.parameters())
    if optimizer is not None:
        states = [t for s in optimizer.state.values() for k, t in s.items() if k != "step"]
        assert states and all(t.is_cuda for t in states)


def fixed_batch():
    """Hand-built rows (not sampled, so the devices' RNGs do not matter): prompts, replies ending in EOS,
    one reply cut without EOS, one two-turn row with a tool observation in the middle, varied lengths."""
    e, eos = TOK.encode, [TOK.eos_token_id]
    rows = [
        [RolloutSegment(e("abc"), False), RolloutSegment(e("eeh") + eos, True)],
        [RolloutSegment(e("bcd"), False), RolloutSegment(e("kla") + eos, True)],
        [RolloutSegment(e("cdef"), False), RolloutSegment(e("e") + eos, True)],
        [RolloutSegment(e("defgh"), False), RolloutSegment(e("mnmnme") + eos, True)],
        [RolloutSegment(e("abc"), False), RolloutSegment(e("ge"), True), RolloutSegment(e("hij"), False),
         RolloutSegment(e("ee") + eos, True)],
        [RolloutSegment(e("fg"), False), RolloutSegment(e("abcde"), True)],
        [RolloutSegment(e("ghi"), False), RolloutSegment(e("ej") + eos, True)],
        [RolloutSegment(e("hij"), False), RolloutSegment(e("nn") + eos, True)],
    ]
    batch = assemble(rows, pad_token_id=TOK.pad_token_id)
    advantages = torch.tensor([1.5, -0.5, 1.0, -1.0, 0.75, -1.25, 0.25, -0.75])[:, None] * batch.loss_mask.float()
    return batch, advantages


# Two epochs x two mini-batches of two micro-batches: four optimizer steps, off-policy ratios after the first,
# a KL term against the adapter-disabled reference.
UPDATE_CONFIG = dict(ppo_epochs=2, mini_batch_size=4, micro_batch_size=2, lr=1e-2, kl_coef=0.05,
                     old_logprobs="recompute")


def grpo_trainer(source, device, *, init_seed=0, dtype=torch.float32, config=None, prompts=PROMPTS, **kwargs):
    torch.manual_seed(init_seed)  # the adapter's init; also seeds CUDA, which samples the rollouts
    policy = build_policy(source, lora=LORA, device=device, dtype=dtype)
    return GRPOTrainer(policy, HFRolloutEngine(policy.model, TOK), kwargs.pop("reward", target_fraction), prompts,
                       GRPOParams(**(config or UPDATE_CONFIG)), **kwargs)


def test_grpo_update_on_cuda_matches_cpu():
    batch, advantages = fixed_batch()
    cpu = grpo_trainer(wide_qwen2(), "cpu")
    gpu = grpo_trainer(wide_qwen2(), "cuda")
    copy_trainable(cpu.policy.model, gpu.policy.model)
    start = lora_weights(cpu.policy.model)

    m_cpu = cpu.update(batch, advantages)
    m_gpu = gpu.update(batch, advantages)
    assert_on_cuda(gpu.policy.model, gpu.optimizer)
    assert m_gpu["optimizer_steps"] == m_cpu["optimizer_steps"] == 4
    assert m_cpu["kl"] > 0 and m_cpu["ratio_max"] > 1.0  # the later steps were off-policy and saw the KL term
    for key in ("loss", "pg_loss", "kl", "grad_norm", "grad_norm_max", "ratio_mean", "ratio_min", "ratio_max",
                "clip_fraction"):
        assert m_gpu[key] == pytest.approx(m_cpu[key], rel=1e-4, abs=1e-6), key
    moved, rel_l2, max_abs = update_gap(start, lora_weights(cpu.policy.model), lora_weights(gpu.policy.model))
    print(f"DIAG grpo update: max move {moved:.3e}, GPU-CPU rel L2 {rel_l2:.2e}, max abs {max_abs:.2e}")
    assert moved > 10 * MAX_ABS  # the update did something the tolerance cannot hide
    assert rel_l2 < REL_L2 and max_abs < MAX_ABS


def test_grpo_raises_reward_on_cuda():
    """test_grpo_raises_reward_on_tiny_model with the policy, rollouts and update all on the GPU."""
    config = dict(group_size=8, prompts_per_step=2, ppo_epochs=2, mini_batch_size=8, micro_batch_size=4, lr=1e-2,
                  kl_coef=5e-3)
    trainer = grpo_trainer(tiny_qwen2(TOK.vocab_size, seed=0), "cuda", config=config,
                           sampling=SamplingParams(max_new_tokens=8, temperature=1.0))
    devices = set()

    def record(module, args, kwargs):
        ids = kwargs.get("input_ids", args[0] if args else None)
        if ids is not None:
            devices.add(ids.device.type)

    decoder = trainer.policy.model.get_base_model().get_decoder()  # peft calls the LM's forward() directly
    hook = decoder.register_forward_pre_hook(record, with_kwargs=True)
    try:
        history = trainer.train(30)
    finally:
        hook.remove()
    rewards = [m["reward/mean"] for m in history]
    first, last = sum(rewards[:5]) / 5, sum(rewards[-5:]) / 5
    print("DIAG cuda reward curve:", [round(r, 3) for r in rewards])
    assert devices == {"cuda"}  # every forward (generate and update) read CUDA inputs
    assert_on_cuda(trainer.policy.model, trainer.optimizer)
    assert first < 0.2  # about 1/16 at random
    assert last > first + 0.4, (first, last)
    assert all(m["optimizer_steps"] == 4 for m in history)


def resumable(root, init_seed, device="cuda"):
    """The CPU test_resume_continues_exactly run, on ``device``: checkpoints every 3 steps, keeps one."""
    config = dict(group_size=4, prompts_per_step=2, ppo_epochs=2, mini_batch_size=4, lr=1e-2, kl_coef=0.05,
                  warmup_steps=2, total_steps=8, checkpoint_every=3, keep_last=1)
    return grpo_trainer(wide_qwen2(), device, init_seed=init_seed, config=config, prompts=PROMPTS[:3],
                        checkpoint_dir=root, sampling=SamplingParams(max_new_tokens=6, temperature=0.9), seed=1)


def _optimizer_tensors(optimizer):
    return {(i, k): t.detach().cpu() for i, s in optimizer.state_dict()["state"].items() for k, t in s.items()}


def assert_same_run(a, b):
    wa, wb = lora_weights(a.policy.model), lora_weights(b.policy.model)
    assert wa.keys() == wb.keys()
    gaps = {n: float((wa[n] - wb[n]).abs().max()) for n in wa}
    assert not any(gaps.values()), f"largest weight difference {max(gaps.values()):.3e}"
    oa, ob = _optimizer_tensors(a.optimizer), _optimizer_tensors(b.optimizer)
    assert oa.keys() == ob.keys()
    for key in oa:
        assert torch.equal(oa[key], ob[key]), key
    assert a.history == b.history
    assert a.sampler.state_dict() == b.sampler.state_dict()


def test_resume_on_cuda_continues_exactly_and_the_checkpoint_loads_on_cpu(tmp_path):
    straight = resumable(tmp_path / "a", init_seed=0)
    straight.train(6)
    assert_on_cuda(straight.policy.model, straight.optimizer)

    first = resumable(tmp_path / "b", init_seed=0)
    first.train(3)
    assert (tmp_path / "b" / "latest").read_text().strip() == "step_000003"
    resumed = resumable(tmp_path / "b", init_seed=123)  # different RNG use while building
    assert resumed.resume() and resumed.step_count == 3
    resumed.train(6)
    assert_same_run(straight, resumed)
    assert resumed.scheduler.state_dict()["last_epoch"] == 6
    assert straight.history[-1]["kl"] > 0  # it trained

    # The step-6 checkpoint (written from CUDA) into a CPU policy: the optimizer state follows the parameters.
    on_cpu = resumable(tmp_path / "c", init_seed=7, device="cpu")
    assert on_cpu.resume(tmp_path / "b") and on_cpu.step_count == 6
    assert all(not p.is_cuda for p in on_cpu.policy.model.parameters())
    assert all(not t.is_cuda for s in on_cpu.optimizer.state.values() for t in s.values())
    assert_same_run(resumed, on_cpu)


_CPU_ONLY_RESUME = """
import importlib.util, sys, torch
spec = importlib.util.spec_from_file_location("engine_gpu", sys.argv[2])
helpers = importlib.util.module_from_spec(spec)
spec.loader.exec_module(helpers)
lora_weights, resumable = helpers.lora_weights, helpers.resumable
assert not torch.cuda.is_available()
trainer = resumable(sys.argv[1] + "/cpu", init_seed=7, device="cpu")
assert trainer.resume(sys.argv[1] + "/gpu")
torch.save({"step": trainer.step_count, "weights": lora_weights(trainer.policy.model),
            "optimizer": trainer.optimizer.state_dict()["state"]}, sys.argv[1] + "/loaded.pt")
"""


def test_a_cuda_checkpoint_resumes_in_a_process_without_cuda(tmp_path):
    """A run checkpointed on a GPU machine, resumed (or branched from) on a CPU-only one."""
    gpu = resumable(tmp_path / "gpu", init_seed=0)
    gpu.train(3)
    env = {**os.environ, "CUDA_VISIBLE_DEVICES": "",
           "PYTHONPATH": os.pathsep.join([str(ROOT), *filter(None, [os.environ.get("PYTHONPATH")])])}
    done = subprocess.run([sys.executable, "-c", _CPU_ONLY_RESUME, str(tmp_path), __file__], cwd=ROOT, env=env,
                          capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-3000:]
    loaded = torch.load(tmp_path / "loaded.pt", weights_only=True)
    assert loaded["step"] == 3
    for name, value in lora_weights(gpu.policy.model).items():
        assert torch.equal(loaded["weights"][name], value), name
    for i, state in gpu.optimizer.state_dict()["state"].items():
        for key, value in state.items():
            assert torch.equal(loaded["optimizer"][i][key], value.cpu()), (i, key)


SFT_EXAMPLES = [
    SFTExample([2, 3, 4, 5, 6, 7, 1], [0, 0, 1, 1, 1, 1, 1]),
    SFTExample([3, 4, 5, 6], [0, 1, 1, 1]),
    SFTExample([8, 9, 10, 11, 12, 13, 14, 15, 1], [0, 0, 0, 1, 1, 0, 0, 1, 1]),
    SFTExample([5, 6, 6, 1], [0, 0, 1, 1]),
    SFTExample([9, 8, 7, 6, 5, 4], [0, 0, 0, 1, 1, 1]),
    SFTExample([2, 2, 3, 3, 4, 4, 5, 5, 1], [0, 1, 1, 1, 1, 1, 1, 1, 1]),
]
SFT_CONFIG = SFTParams(lr=1e-2, batch_size=4, micro_batch_size=2, max_length=16)


def sft_trainer(source, device, dtype=torch.float32):
    torch.manual_seed(0)
    policy = build_policy(source, lora=LORA, device=device, dtype=dtype)
    return SFTTrainer(policy, SFT_EXAMPLES, SFT_CONFIG, pad_token_id=TOK.pad_token_id, seed=0)


def nonzero_lora_b(model, seed=0, scale=0.02):
    """Random B matrices: with peft's B = 0 the A matrices get no gradient on the first step and ~eps-sized
    ones on the second, where Adam's step g / (sqrt(v) + eps) amplifies summation-order noise to ~lr
    (seen on an H100: one k_proj A weight with |m| 4e-9, sqrt(v) 1.3e-9, moved 3.6e-4 apart)."""
    gen = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for name, p in model.named_parameters():
            if "lora_B" in name:
                p.copy_(torch.randn(p.shape, generator=gen) * scale)


def test_sft_steps_on_cuda_match_cpu():
    cpu, gpu = sft_trainer(wide_qwen2(), "cpu"), sft_trainer(wide_qwen2(), "cuda")
    nonzero_lora_b(cpu.policy.model)
    copy_trainable(cpu.policy.model, gpu.policy.model)
    start = lora_weights(cpu.policy.model)
    h_cpu, h_gpu = cpu.train(3), gpu.train(3)
    assert_on_cuda(gpu.policy.model, gpu.optimizer)
    for a, b in zip(h_cpu, h_gpu, strict=True):
        assert b["tokens"] == a["tokens"] and b["rows"] == a["rows"]  # the same rows in the same order
        assert b["loss"] == pytest.approx(a["loss"], rel=1e-5), a["step"]
        assert b["grad_norm"] == pytest.approx(a["grad_norm"], rel=1e-4), a["step"]
    assert h_cpu[-1]["loss"] < h_cpu[0]["loss"]  # it learns (the batches differ; all rows repeat by step 3)
    moved, rel_l2, max_abs = update_gap(start, lora_weights(cpu.policy.model), lora_weights(gpu.policy.model))
    print(f"DIAG sft: losses {[round(h['loss'], 5) for h in h_gpu]}, max move {moved:.3e}, "
          f"GPU-CPU rel L2 {rel_l2:.2e}, max abs {max_abs:.2e}")
    assert moved > 10 * MAX_ABS
    assert rel_l2 < REL_L2 and max_abs < MAX_ABS


@pytest.fixture(scope="module")
def saved_model(tmp_path_factory):
    """``wide_qwen2`` saved as a transformers folder: a dtype is applied only when loading from a folder
    (``load_causal_lm`` passes a model object through as it is)."""
    folder = tmp_path_factory.mktemp("wide_qwen2")
    wide_qwen2().save_pretrained(str(folder))
    return str(folder)


def test_bf16_policy_trains_with_finite_losses_close_to_fp32(saved_model):
    policies = {}
    for dtype in (torch.float32, torch.bfloat16):
        sft = sft_trainer(saved_model, "cuda", dtype=dtype)
        grpo = grpo_trainer(saved_model, "cuda", dtype=dtype)
        if dtype == torch.bfloat16:  # the same adapter start as fp32
            copy_trainable(policies[torch.float32][0].policy.model, sft.policy.model)
            copy_trainable(policies[torch.float32][1].policy.model, grpo.policy.model)
        policies[dtype] = (sft, grpo)
    sft16, grpo16 = policies[torch.bfloat16]
    assert sft16.policy.model.get_base_model().model.embed_tokens.weight.dtype == torch.bfloat16
    assert policies[torch.float32][0].policy.model.get_base_model().model.embed_tokens.weight.dtype == torch.float32

    batch, advantages = fixed_batch()
    results = {}
    for dtype, (sft, grpo) in policies.items():
        sft_start, grpo_start = lora_weights(sft.policy.model), lora_weights(grpo.policy.model)
        results[dtype] = (sft.step(), grpo.update(batch, advantages), sft_start, lora_weights(sft.policy.model),
                          grpo_start, lora_weights(grpo.policy.model))
    sft32, upd32, _, sft32_after, grpo32_start, grpo32_after = results[torch.float32]
    sft16_m, upd16, sft16_start, sft16_after, grpo16_start, grpo16_after = results[torch.bfloat16]

    def cosine(start, a, b):
        da = torch.cat([(a[n].float() - start[n].float()).flatten() for n in start])
        db = torch.cat([(b[n].float() - start[n].float()).flatten() for n in start])
        return float(da @ db / (da.norm() * db.norm()))

    sft_cos = cosine(sft16_start, sft32_after, sft16_after)
    grpo_cos = cosine(grpo16_start, grpo32_after, grpo16_after)
    print(f"DIAG bf16: sft loss {sft16_m['loss']:.5f} vs fp32 {sft32['loss']:.5f}, grad norm "
          f"{sft16_m['grad_norm']:.4f} vs {sft32['grad_norm']:.4f}, move cosine {sft_cos:.4f}; grpo loss "
          f"{upd16['loss']:.5f} vs {upd32['loss']:.5f}, kl {upd16['kl']:.3e} vs {upd32['kl']:.3e}, grad norm "
          f"{upd16['grad_norm']:.4f} vs {upd32['grad_norm']:.4f}, move cosine {grpo_cos:.4f}")
    for m in (sft16_m, upd16):
        assert all(torch.isfinite(torch.tensor(float(v))) for v in m.values())
    for start, after in ((sft16_start, sft16_after), (grpo16_start, grpo16_after)):
        assert all(torch.isfinite(v).all() for v in after.values())
        assert max(float((after[n] - start[n]).abs().max()) for n in start) > 1e-3  # it moved
    # bf16 keeps 8 mantissa bits (~0.4% per rounding): the loss and gradient norm stay within a few percent
    # of fp32, and the update points the same way.
    assert sft16_m["loss"] == pytest.approx(sft32["loss"], rel=2e-2)
    assert sft16_m["grad_norm"] == pytest.approx(sft32["grad_norm"], rel=0.1)
    assert upd16["loss"] == pytest.approx(upd32["loss"], rel=5e-2, abs=1e-2)
    assert upd16["grad_norm"] == pytest.approx(upd32["grad_norm"], rel=0.1)
    assert sft_cos > 0.9 and grpo_cos > 0.9
