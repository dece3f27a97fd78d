"""The method registry: every shipped method registers explicitly (name, params sections, variants,
agents, doc page), every training variant and agent has one owner, and nothing is inferred from file names."""

from __future__ import annotations

import pytest

from components.agents.react import AGENTS, agent_class
from components.method_registry import METHODS, SHIPPED, MethodSpec, load_methods, variant_method
from components.params import Params
from components.registry import RegistryError
from components.variants import VARIANTS, get_variant


def test_the_four_methods_register_their_sections_variants_and_agents(repo_root):
    specs = {spec.name: spec for spec in load_methods()}
    assert set(SHIPPED) <= set(specs)
    assert specs["arbor"].variants == ("arbor", "arbor_no_memory", "rar")
    assert specs["rubricem"].agents == ("scaffold",)
    assert specs["coreact"].variants == () and "coreact" in specs["coreact"].agents
    for spec in specs.values():
        assert all(section in Params.model_fields for section in spec.sections), spec
        assert all(name in VARIANTS for name in spec.variants), spec
        assert all(name in AGENTS for name in spec.agents), spec
        assert (repo_root / spec.doc).is_file(), spec.doc


def test_every_variant_has_one_owner_or_is_shared():
    load_methods()
    owners = {}
    for name in METHODS.names():
        spec = METHODS.get(name)
        for variant in [*spec.variants, *(b.variant for b in spec.baselines)]:
            assert variant not in owners, f"{variant} registered by {owners[variant]} and {name}"
            owners[variant] = name
    assert set(VARIANTS.names()) - set(owners) == {"grpo", "dapo"}  # the shared variants
    assert variant_method("ss_grpo").sections[0] == "rubricem"
    assert variant_method("rar").name == "arbor"
    assert variant_method("grpo") is None


def test_a_matched_baseline_trains_under_its_method_but_runs_a_shared_recipe_and_no_health():
    from components.method_registry import paired_baselines, variant_baseline, variant_health, variant_recipe

    load_methods()
    assert variant_method("grpo_arbor").name == "arbor" and variant_recipe("grpo_arbor") == "grpo"
    assert get_variant("grpo_arbor") is get_variant("grpo")  # exactly grpo's parts
    assert variant_recipe("dapo_arbor") == "discard_homogeneous" and variant_baseline("dapo_arbor").of == "dapo"
    assert variant_method("scaffold_grpo").name == "rubricem" and variant_recipe("scaffold_grpo") is None
    assert variant_recipe("dapo") == "dapo" and variant_recipe("arbor") is None
    assert variant_health("grpo_arbor") == () and variant_health("arbor")  # no mechanism, no mechanism figures
    assert paired_baselines("arbor") == ["grpo_arbor", "grpo"] and paired_baselines("dapo_arbor") == ["grpo_arbor", "grpo"]
    assert paired_baselines("rubricem") == ["scaffold_grpo", "grpo"] and paired_baselines("dapo") == ["grpo"]
    assert paired_baselines("grpo") == paired_baselines("grpo_arco") == []  # baselines themselves


def test_lookups_load_the_methods_on_first_use():
    assert get_variant("arco_frozen").__module__ == "components.methods.arco.variants"
    assert agent_class("best_of_n").__module__ == "components.methods.coreact.baselines"


def test_a_second_spec_under_a_taken_name_is_refused():
    load_methods()
    with pytest.raises(RegistryError, match="already registered"):
        MethodSpec(name="arbor", sections=("arbor",)).register()


def test_a_stage_finds_the_method_whose_settings_it_runs_with():
    from components.method_registry import agent_method, method_section

    assert method_section(variant_method("rar")) == "arbor"
    assert method_section(agent_method("scaffold")) == "rubricem"  # RubricEM's scaffold warm start
    assert method_section(agent_method("react")) is None and method_section(variant_method("dapo")) is None
