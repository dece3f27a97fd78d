"""Each training method against its matched baselines (GRPO, and DAPO where its paper compares with it, trained
under the method's own settings): under both profiles, the params every ``train_policy`` run of a method's variant
trains with equal its baseline's in the grpo (the trainer's configuration), sft, agent, lora and train_policy
sections, and the two variants' parts differ only in the pieces the method declares as its mechanism
(``MethodSpec.mechanism``); a baseline runs none of the mechanism and its run key holds none of its settings. The
checks are shown to fail on a baseline that ignores its method's ``shared`` block and on parts that differ
elsewhere."""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest

from components.llm.backends.scripted import ScriptedChatModel
from components.method_registry import MethodSpec, load_methods
from components.params import Params
from components.params_load import load_params
from components.training.grpo.policy_run_key import run_settings
from components.variants import VariantContext, VariantParts, get_variant, variant_grpo, variant_params

SECTIONS = ("sft", "agent", "lora", "train_policy")  # and grpo, as the trainer gets it (variant_grpo)
PROFILES = ("embedded", "paper")
NO_MECHANISM = ("advantage_fn", "method", "loss_fn", "order_prompts")  # a baseline's parts leave these unset


def specs() -> list[MethodSpec]:
    return [spec for spec in load_methods() if spec.baselines]


def pairs() -> list[tuple[str, str, str]]:
    """(method, its variant, its matched baseline) for every method that declares baselines."""
    return [(spec.name, v, b.variant) for spec in specs() for v in spec.variants for b in spec.baselines]


def load(repo_root: Path, profile: str, overrides: list[str] = ()) -> Params:
    params = load_params(repo_root / "params.yaml", profile, list(overrides))
    if profile == "paper":  # ARCO's variants run on its released setup only; the same flags apply to all runs
        from components.methods.arco.model_setup import setup_overrides

        params = load_params(repo_root / "params.yaml", profile, [*setup_overrides(params.arco.setup), *overrides])
    return params


def roles(role: str) -> ScriptedChatModel:
    return ScriptedChatModel(lambda messages, sampling: "unused", name=role)


def trains_with(params: Params, variant: str, out_dir: Path, resolve=variant_params) -> tuple[dict, VariantParts]:
    """The sections ``train_policy@<variant>`` trains with (grpo as its trainer gets it) and its parts."""
    params = resolve(params, variant)
    parts = get_variant(variant)(VariantContext(params=params, roles=roles, toolbox=None, out_dir=out_dir))
    sections = {name: getattr(params, name).model_dump() for name in SECTIONS}
    sections["grpo"] = variant_grpo(params.grpo, parts).model_dump()
    return sections, parts


def setting_differences(mine: dict, theirs: dict) -> list[str]:
    return [f"{section}.{key}" for section in mine for key in sorted(set(mine[section]) | set(theirs[section]))
            if mine[section].get(key) != theirs[section].get(key)]


def same(a, b) -> bool:
    if a is None or b is None or isinstance(a, (int, float, str, dict, list, tuple)):
        return a == b
    return type(a) is type(b)  # two builds of the same callable piece


def part_differences(spec: MethodSpec, mine: VariantParts, theirs: VariantParts) -> list[str]:
    """The parts fields where a method's variant differs from its baseline beyond the method's declared mechanism;
    declared agent options may add to the baseline's, never change one of them."""
    out = []
    for f in dataclasses.fields(VariantParts):
        a, b = getattr(mine, f.name), getattr(theirs, f.name)
        if f.name == "agent_options" and f.name in spec.mechanism:
            out += [f"agent_options.{k}" for k in b if k not in a or a[k] != b[k]]
        elif f.name not in spec.mechanism and not same(a, b):
            out.append(f.name)
    return out


@pytest.mark.parametrize("profile", PROFILES)
@pytest.mark.parametrize(("method", "variant", "baseline"), pairs())
def test_a_method_and_its_matched_baseline_differ_only_in_the_mechanism(repo_root, tmp_path, profile, method,
                                                                        variant, baseline):
    params = load(repo_root, profile)
    spec = next(s for s in specs() if s.name == method)
    mine, my_parts = trains_with(params, variant, tmp_path / variant)
    theirs, their_parts = trains_with(params, baseline, tmp_path / baseline)
    assert setting_differences(mine, theirs) == []
    assert part_differences(spec, my_parts, their_parts) == []
    assert all(getattr(their_parts, name) is None for name in NO_MECHANISM) and not their_parts.extra_modules


def test_the_paper_profile_trains_arbors_baselines_at_arbors_settings_not_the_shared_ones(repo_root, tmp_path):
    params = load(repo_root, "paper")
    for variant in ("arbor", "grpo_arbor", "dapo_arbor"):
        grpo = trains_with(params, variant, tmp_path / variant)[0]["grpo"]
        assert (grpo["lr"], grpo["kl_coef"], grpo["temperature"], grpo["prompts_per_step"], grpo["tis_cap"],
                grpo["weight_decay"], grpo["clip_eps"], grpo["clip_eps_high"]) == (1e-6, 0.0, 0.7, 32, 2.0, 0.01, 0.2, None)
    shared = trains_with(params, "grpo", tmp_path / "grpo")[0]["grpo"]
    assert (shared["lr"], shared["kl_coef"], shared["prompts_per_step"]) == (2e-6, 5e-3, 2)
    scaffold = trains_with(params, "scaffold_grpo", tmp_path / "scaffold_grpo")[0]["grpo"]
    assert (scaffold["lr"], scaffold["steps"]) == (5e-7, 600)  # RubricEM's Baseline-RL: F.1.2 / F.2


def test_the_check_fails_on_a_baseline_that_ignores_its_methods_shared_block(repo_root, tmp_path):
    params = load(repo_root, "paper")
    ignoring = lambda p, v: p if v == "grpo_arbor" else variant_params(p, v)  # noqa: E731  (grpo's resolution)
    mine = trains_with(params, "arbor", tmp_path / "a")[0]
    theirs = trains_with(params, "grpo_arbor", tmp_path / "b", resolve=ignoring)[0]
    assert {"grpo.lr", "grpo.kl_coef", "grpo.temperature", "grpo.prompts_per_step", "grpo.tis_cap",
            "grpo.weight_decay", "agent.max_search_calls"} <= set(setting_differences(mine, theirs))


def test_the_check_fails_on_parts_that_differ_beyond_the_mechanism(repo_root, tmp_path):
    params = load(repo_root, "embedded")
    spec = next(s for s in specs() if s.name == "rubricem")
    mine = trains_with(params, "rubricem", tmp_path / "a")[1]
    theirs = trains_with(params, "scaffold_grpo", tmp_path / "b")[1]
    assert part_differences(spec, mine, dataclasses.replace(theirs, dynamic_sampling_max_rounds=3)) == \
        ["dynamic_sampling_max_rounds"]
    assert part_differences(spec, mine, dataclasses.replace(theirs, agent="react")) == ["agent"]
    shorter = dataclasses.replace(theirs, agent_options={**theirs.agent_options, "max_tokens": 1})
    assert part_differences(spec, mine, shorter) == ["agent_options.max_tokens"]


@pytest.mark.parametrize(("baseline", "mechanism", "read"), [
    ("grpo_arbor", "arbor.shaping_lambda=0.3", None), ("dapo_arbor", "arbor.k_consol=2", None),
    ("grpo_arco", "arco.kl_coef=0.5", None), ("scaffold_grpo", "rubricem.answer_weight=1.0",
                                              "rubricem.scaffold_max_tokens=128"),
])
def test_a_baselines_run_key_holds_its_methods_shared_block_and_reads_not_its_mechanism(repo_root, baseline,
                                                                                       mechanism, read):
    from components.method_registry import variant_method
    from components.run_spec import run_spec
    from components.trained_policy import variant_agent

    params = load(repo_root, "embedded")
    method = variant_method(baseline)
    variant = method.variants[0]

    def key(p: Params, v: str) -> dict:
        return run_settings(variant_params(p, v), v, variant_agent(run_spec(p), v))

    tuned = load(repo_root, "embedded", [mechanism])
    assert key(tuned, baseline) == key(params, baseline)  # the mechanism's settings are not the baseline's
    assert key(tuned, variant) != key(params, variant)
    section = method.sections[0]
    faster = load(repo_root, "embedded", [f"{section}.shared.grpo.lr=0.5"])
    assert key(faster, baseline) != key(params, baseline) and key(faster, variant) != key(params, variant)
    if read is not None:  # what the baseline declares it reads is keyed
        assert key(load(repo_root, "embedded", [read]), baseline) != key(params, baseline)
