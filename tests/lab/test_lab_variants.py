"""Every training variant trains in the lab through the unchanged ``train_policy`` stage: a tiny nano policy (saved
where ``--overlay lab`` reads it) fully fine-tuned, the simulated judge answering every judge call (no failed
call in the run's accounting), and each method's own mechanism acting on the step (its health metric in
metrics.csv), not only the run finishing. One prepared world for the module; one step per variant (ARCO two: mu
trains after the teacher's warm-up step)."""

from __future__ import annotations

import pandas as pd
import pytest

from components.lab.policy import sft_corpus, train_nano
from components.llm.factory import LLMPool
from components.params_load import load_params
from tests.lab.test_lab_overlay import TINY

# format_penalty -1 (the lab's is 0): a broken reply's score then tells the outcome reward's format check apart
STEP = ["grpo.steps=1", "grpo.format_penalty=-1", "grpo.group_size=2", "grpo.prompts_per_step=2", "train_policy.n_questions=4",
        "train_policy.eval_questions=0", "rubricem.scaffold_max_tokens=16", "rubricem.reflection_max_tokens=16",
        "rubricem.reflection_candidates=1", "arco.write_batch=2", "arco.sparse_epochs=0.5", "arco.warmup_steps=1",
        "dapo.max_num_gen_batches=2", "dapo.overlong_buffer_tokens=4"]


@pytest.fixture(scope="module")
def lab(repo_root, tmp_path_factory):
    from tasks.index import index
    from tasks.prepare import prepare

    root = tmp_path_factory.mktemp("lab")
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(root)  # the overlay's backends read outputs/lab/sft under the working directory
        mp.setenv("RUBRICFLOW_MLFLOW", "0")
        params = load_params(repo_root / "params.yaml", overlays=["lab"], overrides=[*TINY, *STEP])
        train_nano(params, sft_corpus(params), seed=0).save(root / "outputs/lab/sft")
        prepare.fn(params)
        index.fn(params)
        yield params, root, repo_root


def _train(lab, variant: str, *overrides: str):
    from tasks.train_policy import train_policy

    params, root, repo_root = lab
    if overrides:
        params = load_params(repo_root / "params.yaml", overlays=["lab"], overrides=[*TINY, *STEP, *overrides])
    with LLMPool(params) as pool:
        train_policy.fn(params, variant=variant, pool=pool)
        roles = dict(pool.accounting.roles)
    folder = root / "outputs/lab/train" / variant
    return pd.read_csv(folder / "metrics.csv"), roles, folder


def _signal_outcome(rows, roles, folder) -> None:
    """The outcome reward alone: no judge asked, and a reply the policy's format breaks scores -1."""
    assert sum(s.calls for s in roles.values()) == 0
    assert rows["reward/format_valid"][0] > 0 or rows["reward/mean"][0] == -1.0


def _signal_dapo(rows, roles, folder) -> None:
    """Groups without signal are dropped and the trainer draws fresh prompts to replace them."""
    assert rows["reward/homogeneous_groups"][0] == 2 == rows["dynamic_sampling/reward/homogeneous_groups"][0]
    assert rows["dynamic_sampling/refill_rounds"][0] >= 1 and rows["dynamic_sampling/filtered_groups"][0] > 0


def _signal_discard(rows, roles, folder) -> None:
    """ARBOR's DAPO baseline: homogeneous groups discarded (unscored), no refill."""
    assert rows["reward/homogeneous_groups"][0] == rows["episodes"][0] / 2
    assert rows["episodes/unscored"][0] == rows["episodes"][0]
    assert "dynamic_sampling/refill_rounds" not in rows


def _signal_arbor(rows, roles, folder) -> None:
    """Every group goes through the contrast planner (each counted under the reason it was or was not induced from)
    and the zero-variance accounting the rescue rate is read from."""
    reasons = [c for c in rows if c.startswith("reward/induction/") and c.split("/")[-1] in (
        "too_few_valid", "all_correct", "all_wrong", "uniform_partial", "collapsed", "contrast")]
    assert reasons and sum(rows[c][0] for c in reasons) == rows["reward/groups"][0] == 2
    assert rows["reward/zero_var/base/all"][0] == 1.0 and rows["reward/judge/failures"][0] == 0


def _signal_rar(rows, roles, folder) -> None:
    """RaR: a checklist written per prompt, then every trajectory rated against it, by the simulated judge."""
    assert rows["reward/checklist/calls"][0] == 2 and rows["reward/judge/calls"][0] == rows["episodes"][0]
    assert roles["rubric_evaluator"].calls == 2 + rows["episodes"][0]


def _signal_stagewise(rows, roles, folder) -> None:
    """RubricEM's stage judge: stage rubrics written for each prompt, and every episode's stages read (the nano
    speaks no scaffold, so each of its plan, research and review stages is counted missing)."""
    assert rows["reward/judge/generation_calls"][0] == 2 and rows["reward/judge/generation_failures"][0] == 0
    for stage in ("plan", "research", "review"):
        assert rows[f"reward/stage/{stage}_missing"][0] == rows["episodes"][0]


def _signal_reflection(rows, roles, folder) -> None:
    """RubricEM's meta-policy: the policy reflects on each prompt's attempts and each reflection is validated."""
    assert rows["end/method/reflection/questions"][0] == 2
    assert rows["end/method/reflection/invalid/format"][0] + rows["end/method/reflection/bank_writes"][0] == 2


def _signal_arco(rows, roles, folder) -> None:
    """ARCO: the teacher annotates every trajectory of the warm-up step and mu (the rubric model) trains on them."""
    assert rows["method/teacher/annotated"][0] == rows["episodes"][0] == roles["teacher"].calls
    assert rows["method/mu/warm"][0] == 1.0 and rows["method/mu/warmup_optimizer_steps"][0] > 0
    assert rows["method/mu/warmup_grad_norm"][0] > 0


def _signal_rubricem(rows, roles, folder) -> None:
    _signal_stagewise(rows, roles, folder)
    _signal_reflection(rows, roles, folder)


SIGNALS = {"grpo": _signal_outcome, "dapo": _signal_dapo, "arbor": _signal_arbor, "arbor_no_memory": _signal_arbor,
           "rar": _signal_rar, "scaffold_grpo": _signal_outcome, "ss_grpo": _signal_stagewise,
           "meta_policy": _signal_reflection, "rubricem": _signal_rubricem, "arco": _signal_arco,
           "arco_frozen": _signal_arco, "arco_no_decomp": _signal_arco, "grpo_arbor": _signal_outcome,
           "dapo_arbor": _signal_discard, "grpo_arco": _signal_outcome}


@pytest.mark.parametrize("variant", list(SIGNALS))
def test_the_variant_trains_in_the_lab_with_its_mechanism_acting(lab, variant):
    rows, roles, folder = _train(lab, variant)
    assert len(rows) == 1 and rows["episodes"][0] > 0
    assert all(s.failures == 0 for s in roles.values()), {k: s.failures for k, s in roles.items()}
    SIGNALS[variant](rows, roles, folder)
    saved = folder / "adapter"  # full fine-tuning: the trained policy is a whole model, no LoRA adapter
    assert (saved / "config.json").exists() and not (saved / "adapter_config.json").exists()


def test_the_nano_policy_is_its_own_warm_start_with_its_prompts(lab):
    """``train_policy.merge_warm_start: false``: no adapter is read (merged, the run would look for the sft stage's),
    and each agent runs under its warm start's prompt (the one the nano was trained with; the scaffold's one line),
    not the default prompt it never saw."""
    from components.lab.world import LAB_PROMPT
    from components.policy_run import PolicyRun
    from components.run_spec import run_spec
    from components.training.grpo.policy_run_key import run_settings
    from components.training.warm_started import warm_start_adapter
    from tasks.runtime import run_toolbox

    params, root, repo_root = lab
    assert warm_start_adapter(run_spec(params), "react") is None and run_settings(params, "grpo")["warm_start"] is None
    merged = load_params(repo_root / "params.yaml", overlays=["lab"],
                         overrides=[*TINY, *STEP, "train_policy.merge_warm_start=true"])
    assert warm_start_adapter(run_spec(merged), "react").as_posix() == "outputs/lab/sft/adapter"
    with LLMPool(params) as pool:
        for variant, prompt in (("grpo", LAB_PROMPT), ("ss_grpo", params.methods["sft_scaffold"].options["system_prompt"])):
            toolbox = run_toolbox(params)
            with PolicyRun(params, variant, pool.role, toolbox, root / "runs" / variant) as run:
                assert run.options["system_prompt"] == prompt
