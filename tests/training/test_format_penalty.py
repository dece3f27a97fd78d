"""``grpo.format_penalty``: every training variant's outcome reward scores a format-invalid episode at the run's
penalty (unset: ARBOR's -1), and the run key holds it only once set."""

from __future__ import annotations

import pytest

from components.llm.backends.scripted import ScriptedChatModel
from components.method_registry import load_methods
from components.params_load import load_params
from components.rewards.outcome import OutcomeReward
from components.schemas import Question, Trajectory
from components.training.grpo.policy_run_key import run_settings
from components.variants import VariantContext, get_variant, variant_params

load_methods()  # the methods register their variants
# the variants whose reward holds the outcome reward (RubricEM's ss_grpo and rubricem score judged stages instead)
WITH_OUTCOME = ("grpo", "dapo", "arbor", "arbor_no_memory", "rar", "arco", "arco_frozen", "arco_no_decomp",
                "scaffold_grpo", "meta_policy")


def outcome_rewards(obj, depth: int = 0, seen: set | None = None) -> list[OutcomeReward]:
    """Every OutcomeReward reachable from a reward function: its attributes and its closure's cells."""
    seen = seen if seen is not None else set()
    if id(obj) in seen or depth > 5:
        return []
    seen.add(id(obj))
    if isinstance(obj, OutcomeReward):
        return [obj]
    found = []
    cells = getattr(obj, "__closure__", None) or ()
    children = [c.cell_contents for c in cells] + list(getattr(obj, "__dict__", {}).values())
    for child in children:
        if callable(child) or hasattr(child, "__dict__"):
            found += outcome_rewards(child, depth + 1, seen)
    return found


def built(repo_root, tmp_path, variant: str, overrides: list[str]):
    params = variant_params(load_params(repo_root / "params.yaml", "embedded", overrides), variant)
    roles = lambda role: ScriptedChatModel(lambda messages, sampling: "unused", name=role)
    return get_variant(variant)(VariantContext(params=params, roles=roles, toolbox=None, out_dir=tmp_path))


@pytest.mark.parametrize("variant", WITH_OUTCOME)
def test_every_variants_outcome_reward_takes_the_runs_format_penalty(repo_root, tmp_path, variant):
    default = outcome_rewards(built(repo_root, tmp_path / "a", variant, []).reward_fn)
    zero = outcome_rewards(built(repo_root, tmp_path / "b", variant, ["grpo.format_penalty=0"]).reward_fn)
    assert default and zero, f"{variant}: no outcome reward found in its reward function"
    assert {r.format_penalty for r in default} == {-1.0}
    assert {r.format_penalty for r in zero} == {0.0}


def test_an_unanswered_episode_scores_the_penalty():
    q = Question(id="q", question="Who?", answers=["Ada"], source="test")
    unanswered = Trajectory(question_id="q", question="Who?", steps=[], final_answer=None)
    assert OutcomeReward().score(unanswered, q) == -1.0
    assert OutcomeReward(format_penalty=0.0).score(unanswered, q) == 0.0


def test_the_run_key_holds_the_penalty_only_once_set(repo_root):
    base = load_params(repo_root / "params.yaml", "embedded")
    unset = run_settings(base, "grpo")
    assert "format_penalty" not in unset["grpo"]
    zero = run_settings(load_params(repo_root / "params.yaml", "embedded", ["grpo.format_penalty=0"]), "grpo")
    assert zero["grpo"]["format_penalty"] == 0.0
    assert {k: v for k, v in zero["grpo"].items() if k != "format_penalty"} == unset["grpo"]
