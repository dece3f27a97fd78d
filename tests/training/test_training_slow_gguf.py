"""GRPO on the embedded Qwen2.5-Coder-0.5B policy (GGUF dequantized by transformers), opt in with -m slow.

The policy GGUF is the verified embedded 0.5B (components.embedded.models.ensure_gguf), or the file named
by RUBRICFLOW_POLICY_GGUF; the test is skipped when neither is available. The task is a
one-word bandit with a verifiable reward: asked to name a colour, the base model mostly says "Red"; the
reward is 1 when the answer is "blue". Each step is slow on CPU (the 0.5B needs tens of seconds per
update for 8 short rollouts on two shared cores), so the run is 10 steps and the check is only that the
mean reward of the last 3 steps beats the first 3.

Run::

    RUBRICFLOW_POLICY_GGUF=/path/qwen2.5-coder-0.5b-instruct-q4_k_m.gguf python -m pytest -m slow \
        tests/training/test_training_slow_gguf.py -s
"""

import os
from pathlib import Path

import pytest
import torch

from components.training.model import LoRASettings, build_policy
from components.training.engines.rollout import HFRolloutEngine, SamplingParams
from components.training.params import GRPOParams
from components.training.grpo.trainer import GRPOTrainer


def _policy_gguf() -> str | None:
    if os.environ.get("RUBRICFLOW_POLICY_GGUF"):
        return os.environ["RUBRICFLOW_POLICY_GGUF"]
    try:
        from components.embedded.models import ensure_gguf

        return str(ensure_gguf("qwen2.5-coder-0.5b-instruct", Path(__file__).resolve().parents[2] / ".cache"))
    except Exception:  # noqa: BLE001 - the [embedded] extra is not installed, or the parts are missing
        return None


GGUF = _policy_gguf()


@pytest.mark.slow
@pytest.mark.skipif(not GGUF, reason="needs the [embedded] extra or RUBRICFLOW_POLICY_GGUF")
def test_grpo_raises_reward_on_embedded_policy():
    from transformers import AutoTokenizer

    path = Path(GGUF)
    tok = AutoTokenizer.from_pretrained(str(path.parent), gguf_file=path.name)
    torch.manual_seed(0)
    policy = build_policy(path.parent, gguf_file=path.name, lora=LoRASettings(r=8, alpha=16))
    prompt = tok.apply_chat_template(
        [{"role": "user", "content": "Name one colour. Answer with one word."}],
        add_generation_prompt=True,
        tokenize=True,
    )["input_ids"]

    def reward(episodes, ctx):
        return [1.0 if "blue" in (e.text or "").lower() else 0.0 for e in episodes]

    config = GRPOParams(group_size=8, prompts_per_step=1, lr=1e-4, kl_coef=5e-3)
    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, tok), reward, [prompt], config,
                          sampling=SamplingParams(max_new_tokens=4))
    history = trainer.train(10)
    rewards = [m["reward/mean"] for m in history]
    print("reward curve:", rewards)
    assert sum(rewards[-3:]) / 3 > sum(rewards[:3]) / 3, rewards
