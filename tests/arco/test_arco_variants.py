"""The ARCO variants from params.yaml: what each builds (without loading mu's backbone), the sparse phase in steps,
and ARCO's released setup enforced under the paper profile."""

import pytest

from components.methods.arco.model_setup import check_setup, load_backbone, setup_overrides, sparse_steps
from components.methods.arco.variants import ArcoReward, ArcoState
from components.params_load import load_params
from components.params_section import ParamsError
from components.run_spec import run_spec
from components.variants import VariantContext, get_variant
from tests.arco.helpers import teacher


def context(params, tmp_path):
    return VariantContext(params=params, roles=lambda name: teacher(), toolbox=None, out_dir=tmp_path)


def test_variants_build_their_parts_without_loading_mu(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml")
    built = {name: get_variant(name)(context(params, tmp_path)) for name in ("arco", "arco_frozen", "arco_no_decomp")}
    for parts in built.values():
        assert isinstance(parts.reward_fn, ArcoReward) and isinstance(parts.method, ArcoState)
        assert parts.advantage_fn == parts.method.advantages and parts.agent == "react"
        assert parts.method._mu is None  # mu's backbone loads on first use, not at build time
        assert parts.method.sparse_steps == 5  # 0.25 epochs x ceil(40 questions / 2 per step)
    assert [built[n].method.frozen for n in built] == [False, True, False]
    assert [built[n].method.loss for n in built] == ["decomposition", "decomposition", "per_step_outcome"]


def test_sparse_phase_counts_the_questions_train_policy_reads(repo_root, tmp_path):
    n_train = load_params(repo_root / "params.yaml").data.n_train
    params = load_params(repo_root / "params.yaml", overrides=[f"train_policy.first_question={n_train - 16}",
                                                                "arco.warmup_steps=0"])
    # 16 questions left after first_question, not train_policy.n_questions' 40: 0.25 x ceil(16 / 2)
    assert get_variant("arco")(context(params, tmp_path)).method.sparse_steps == 2


def test_sparse_phase_cannot_end_before_mu_is_warm(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml", overrides=["arco.sparse_epochs=0.05", "arco.warmup_steps=2"])
    assert sparse_steps(params.arco, params.train_policy.n_questions, params.grpo.prompts_per_step) == 1
    with pytest.raises(ValueError, match="arco.sparse_epochs"):
        get_variant("arco")(context(params, tmp_path))


def test_paper_profile_requires_arco_released_setup(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml", "paper")
    assert check_setup(params.arco.setup, params.retrieval, params.agent, params.data) == ["retrieval.scope=corpus", "retrieval.top_k=3", "agent.max_turns=12",
                                   "data.n_train=11406", "data.n_dev=50"]
    with pytest.raises(ParamsError, match="--set retrieval.scope=question --set retrieval.top_k=1"):
        get_variant("arco")(context(params, tmp_path))
    fixed = load_params(repo_root / "params.yaml", "paper", overrides=setup_overrides(params.arco.setup))
    assert check_setup(fixed.arco.setup, fixed.retrieval, fixed.agent, fixed.data) == [] and fixed.agent.max_turns == 3 and fixed.data.n_train == 2000
    assert isinstance(get_variant("arco")(context(fixed, tmp_path)).method, ArcoState)


def test_mu_backbone_must_be_weights(repo_root):
    params = load_params(repo_root / "params.yaml", overrides=["arco.model_role=policy"])
    with pytest.raises(ParamsError, match="arco.model_role"):
        load_backbone(run_spec(params), params.arco.model_role)


@pytest.mark.parametrize(("overrides", "fused", "int8"), [([], True, False),
                                                         (["grpo.fused_lora=false"], False, False),
                                                         (["grpo.int8_base=true"], True, True)])
def test_mu_on_its_own_base_takes_the_runs_speed_options(repo_root, tmp_path, monkeypatch, overrides, fused, int8):
    from components.methods.arco import variants
    from components.training.tiny import tiny_qwen2
    from tests.arco.helpers import TOK

    monkeypatch.setattr(variants, "load_backbone", lambda params, role: (tiny_qwen2(TOK.vocab_size, seed=0), TOK))
    params = load_params(repo_root / "params.yaml", overrides=[*overrides, "arco.engine=hf"])
    mu = get_variant("arco")(context(params, tmp_path)).method.mu
    layers = [m for m in mu.model.modules() if hasattr(m, "lora_A")]
    assert layers and all(("forward" in m.__dict__) == fused for m in layers)
    assert all(hasattr(m.get_base_layer(), "_int8_w_t") == int8 for m in layers)
    assert (mu.micro_batch_tokens, mu.checkpoint_min_tokens) == (params.arco.micro_batch_tokens,
                                                                 params.arco.checkpoint_min_tokens)


def test_mu_takes_its_micro_batch_options(repo_root, tmp_path, monkeypatch):
    from components.methods.arco import variants
    from components.training.tiny import tiny_qwen2
    from tests.arco.helpers import TOK

    monkeypatch.setattr(variants, "load_backbone", lambda params, role: (tiny_qwen2(TOK.vocab_size, seed=0), TOK))
    params = load_params(repo_root / "params.yaml",
                         overrides=["arco.micro_batch_tokens=null", "arco.checkpoint_min_tokens=512", "arco.engine=hf"])
    mu = get_variant("arco")(context(params, tmp_path)).method.mu
    assert (mu.micro_batch_tokens, mu.checkpoint_min_tokens) == (None, 512)


@pytest.mark.parametrize(("overrides", "served"), [([], True), (["train_policy.engine=hf"], False),
                                                   (["arco.engine=hf"], False),
                                                   (["train_policy.engine=hf", "arco.engine=llamacpp"], True)])
def test_mu_writes_on_llamacpp_as_the_policy_samples_unless_told(repo_root, tmp_path, monkeypatch, overrides, served):
    from components.methods.arco import variants
    from components.training.engines import llamacpp
    from components.training.engines.rollout import HFRolloutEngine
    from components.training.tiny import tiny_qwen2
    from tests.arco.helpers import TOK

    monkeypatch.setattr(variants, "load_backbone", lambda params, role: (tiny_qwen2(TOK.vocab_size, seed=0), TOK))
    asked = []
    monkeypatch.setattr(llamacpp, "engine_for_role", lambda params, role, tokenizer, **kw: asked.append((role, kw)) or "server")
    params = load_params(repo_root / "params.yaml", overrides=overrides)
    mu = get_variant("arco")(context(params, tmp_path)).method.mu
    if served:
        assert mu.engine == "server" and asked == [(params.arco.model_role, {"parallel": params.arco.write_batch,
                                                                                "logprobs": False})]
    else:
        assert isinstance(mu.engine, HFRolloutEngine) and asked == []


def test_mu_takes_its_score_head_kl_and_optimizer_options(repo_root, tmp_path, monkeypatch):
    from components.methods.arco import variants
    from components.training.tiny import tiny_qwen2
    from tests.arco.helpers import TOK

    monkeypatch.setattr(variants, "load_backbone", lambda params, role: (tiny_qwen2(TOK.vocab_size, seed=0), TOK))
    released = get_variant("arco")(context(load_params(repo_root / "params.yaml", overrides=["arco.engine=hf"]),
                                            tmp_path)).method
    mu = released.mu
    assert (mu.score_readout, mu.kl_estimator, mu.head.net[-1].__class__.__name__) == ("mean_pool", "full", "Tanh")
    assert mu.head.net[-2].out_features == 3  # one output per criterion slot
    groups = released.optimizer.param_groups
    assert [g["lr"] for g in groups] == [1e-4, 1e-4] and [g["weight_decay"] for g in groups] == [0.01, 0.01]
    assert {id(p) for p in groups[1]["params"]} == {id(p) for p in mu.head.parameters()}
    params = load_params(repo_root / "params.yaml", overrides=[
        "arco.engine=hf", "arco.score_head=mlp2", "arco.score_readout=criterion_end", "arco.kl_estimator=k3",
        "arco.head_lr=5e-4", "arco.weight_decay=0"])
    ours = get_variant("arco")(context(params, tmp_path)).method
    assert (ours.mu.score_readout, ours.mu.kl_estimator, ours.mu.head.net[-1].out_features) == ("criterion_end", "k3", 1)
    assert [g["lr"] for g in ours.optimizer.param_groups] == [1e-4, 5e-4]
    assert [g["weight_decay"] for g in ours.optimizer.param_groups] == [0.0, 0.0]


def test_the_dense_advantages_and_fit_weights_follow_their_options(repo_root, tmp_path):
    from types import SimpleNamespace

    import torch

    from components.methods.arco.criteria import trajectory_steps
    from components.methods.arco.decomposition import (
        class_balanced_weights,
        position_bucket_advantages,
        step_advantages,
    )
    from tests.arco.helpers import BAD, GOOD, trajectory

    steps = [trajectory_steps(trajectory(GOOD)), trajectory_steps(trajectory(BAD)), trajectory_steps(trajectory(GOOD[:2]))]
    episodes = [SimpleNamespace(group=g, info={"arco": SimpleNamespace(steps=s)}) for g, s in zip([0, 0, 1], steps)]
    scores = torch.tensor([[0.2, 0.3, 0.4], [0.1, -0.2, 0.0], [0.5, 0.1, float("nan")]])
    lengths = [3, 3, 2]

    def state(*overrides):
        params = load_params(repo_root / "params.yaml", overrides=["arco.sparse_epochs=0", "arco.warmup_steps=0", *overrides])
        return get_variant("arco")(context(params, tmp_path)).method

    released, ctx = state(), SimpleNamespace(step=1)
    assert released.dense(1)
    buckets = [["search_1", "search_2", "terminal"]] * 2 + [["search_1", "terminal"]]
    expected = position_bucket_advantages(scores, lengths, buckets, scale=0.5)
    assert torch.allclose(released.advantages(episodes, scores, ctx), expected, equal_nan=True)
    ours = state("arco.dense_baseline=step_index", "arco.dense_scale=1", "arco.dense_std=true")
    expected = step_advantages(scores, lengths, [0, 0, 1], normalize_std=True)
    assert torch.allclose(ours.advantages(episodes, scores, ctx), expected, equal_nan=True)
    assert torch.equal(released.fit_weights([1.0, 0.0, 0.0]), class_balanced_weights([1.0, 0.0, 0.0]))
    assert state("arco.decomposition_weighting=none").fit_weights([1.0, 0.0, 0.0]) is None
