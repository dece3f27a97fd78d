"""A training run's learning curve: ``GRPOTrainer.train(evaluate_every=k, evaluate=...)`` measures the policy
after every k-th step but the last (the stage's ``dev_after`` is the last), the points join that step's metrics
and survive a resume through metrics.csv; ``train_policy.eval_every`` is not part of the run key,
``train_policy.first_question`` is once set."""

import pandas as pd
import torch

from components.params_load import load_params
from components.policy_run import resumed_rows
from components.training.engines.rollout import HFRolloutEngine
from components.training.grpo.policy_run_key import run_settings
from components.training.grpo.trainer import GRPOTrainer
from components.training.model import LoRASettings, build_policy
from components.training.params import GRPOParams
from components.training.tiny import CharTokenizer, tiny_qwen2

TOK = CharTokenizer("abcdefgh")


def test_the_curve_is_measured_every_k_steps_on_the_updated_weights():
    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=2, alpha=4))
    config = GRPOParams(group_size=4, prompts_per_step=1, max_new_tokens=3, steps=5, lr=0.05, temperature=1.0)
    seen, logged = [], []
    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, TOK), lambda eps, ctx: [float(len(e.text)) for e in eps],
                          ["ab", "cd"], config, seed=0, on_metrics=lambda step, m: logged.append((step, dict(m))))

    def evaluate(step: int) -> dict[str, float]:
        weights = sum(float(p.detach().abs().sum()) for p in policy.model.parameters() if p.requires_grad)
        seen.append((step, trainer.step_count, weights))
        return {"dev/em": step / 10}

    history = trainer.train(5, evaluate_every=2, evaluate=evaluate)
    assert [(s, c) for s, c, _ in seen] == [(2, 2), (4, 4)]  # not at 5: the last step is the run's dev_after
    assert seen[0][2] != seen[1][2]  # measured on the weights of that step, which training changed
    assert [h.get("dev/em") for h in history] == [None, 0.2, None, 0.4, None]
    assert [(s, m) for s, m in logged if "dev/em" in m] == [(2, {"dev/em": 0.2}), (4, {"dev/em": 0.4})]


def test_a_resume_keeps_the_curve_and_the_judge_calls_from_metrics_csv(tmp_path):
    csv = tmp_path / "metrics.csv"
    pd.DataFrame([{"step": 1, "loss": 0.5, "time/update": 1.0, "calls/judges": 8.0},
                  {"step": 2, "loss": 0.4, "time/update": 1.1, "calls/judges": 16.0, "dev/em": 0.3}]).to_csv(csv)
    rows = resumed_rows([{"loss": 0.5}, {"loss": 0.4}], csv)
    assert rows[1]["dev/em"] == 0.3 and rows[1]["calls/judges"] == 16.0
    assert "dev/em" not in rows[0]  # a step without a point gets none (not the csv's empty cell)


def test_the_curve_is_not_keyed_and_held_out_questions_are(repo_root):
    base = load_params(repo_root / "params.yaml")
    curve = load_params(repo_root / "params.yaml", overrides=["train_policy.eval_every=5"])
    offset = load_params(repo_root / "params.yaml", overrides=["train_policy.first_question=150"])
    assert run_settings(curve, "grpo") == run_settings(base, "grpo")
    assert run_settings(offset, "grpo") != run_settings(base, "grpo")
    assert "first_question" not in run_settings(base, "grpo")["train_policy"]  # earlier runs keep their keys
