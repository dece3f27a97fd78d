"""ARBOR's reward and method state end to end on hand-made groups with scripted roles: the empty-memory
fallback, induction into the memory and consolidation, an all-wrong group rescued by a common rubric, a judge
failing on some calls, the no-memory and RaR baselines, and the variants built from params."""

import asyncio
import json

import pytest

from components.llm.backends.scripted import ScriptedChatModel
from components.methods.arbor.memory import CommonRubric, RubricMemory, RubricText
from components.methods.arbor.params import ArborParams
from components.methods.arbor.variants import ArborReward, ArborState, RarReward, RarState, lazy_embedder
from components.params_load import load_params
from components.training.grpo.episodes import StepContext
from components.variants import VariantContext, get_variant
from tests.arbor.helpers import COMMON, Q0, Q1, FakeEncoder, QualityJudge, episode, writer

S = ArborParams(k_consol=1)


def mixed_group(group=0):
    # F1: 1, 0.5 ("Ossian Kestrow" vs "Ossian Threll"), 0, 0; quality follows the outcome
    return [episode(group, "Ossian Threll", 3), episode(group, "Ossian Kestrow", 2),
            episode(group, "Vell Amsar", 1), episode(group, "Vell Amsar", 0)]


def wrong_group(group=1, question=Q1):
    return [episode(group, "Nowhere", q, question=question) for q in (0, 3, 1, 2)]


def ctx(episodes, step=1, state=None):
    return StepContext(step=step, groups=[e.group for e in episodes], method=state)


def with_common(settings):
    memory = RubricMemory(settings)
    memory.common.append(CommonRubric(id="c1", rubric=RubricText(**COMMON), created_step=0))
    return memory


def arbor(judge=None, inducer=None, consolidator=None, settings=S, memory=None):
    memory = memory or RubricMemory(settings, embed=lambda texts: FakeEncoder().encode(texts))
    state = ArborState(memory, consolidator or writer(COMMON), settings)
    reward = ArborReward(settings, judge or QualityJudge(), inducer or writer(), seed=7, state=state)
    return reward, state


def test_empty_memory_keeps_the_base_reward_and_feeds_drafts_to_the_memory(tmp_path):
    reward, state = arbor()
    state.snapshot_dir = tmp_path / "memory"
    eps = mixed_group() + wrong_group()
    out = asyncio.run(reward(eps, ctx(eps)))
    assert out.scores == pytest.approx([1.0, 0.5, 0.0, 0.0, 0.0, 0.0, 0.0, 0.0])
    assert out.metrics["rubric/active"] == 0 and out.metrics["induction/calls"] == 1  # the all-wrong group skips
    assert out.metrics["induction/contrast"] == 1 and out.metrics["induction/all_wrong"] == 1
    assert out.metrics["judge/calls"] == 5  # the draft judged on its own group of 4: 3 + 2 edges
    assert out.metrics["zero_var/base/all_wrong"] == 0.5 and out.metrics["zero_var/total/all_wrong"] == 0.5
    metrics = asyncio.run(state.on_step_end(None, ctx(eps, state=state), eps, None))
    # the draft (scores 1, 2/3, 1/3, 0: variance 0.139, Pearson > 0) was admitted; k_consol = 1 consolidates
    assert metrics["admitted"] == 1 and metrics["consolidated"] == 1 and metrics["consolidation_calls"] == 1
    assert [r.rubric.title for r in state.memory.common] == [COMMON["title"]] and state.memory.drafts == []
    assert metrics["memory/common"] == 1 and metrics["memory_changed"] == 1
    snapshot = json.loads((tmp_path / "memory" / "step_00001.json").read_text())
    assert snapshot["common"][0]["rubric"]["title"] == COMMON["title"]
    assert snapshot["common"][0]["sources"] == ["d1"]


def test_a_common_rubric_rescues_an_all_wrong_group_and_records_its_activations():
    judge = QualityJudge()
    inducer = writer()
    reward, state = arbor(judge=judge, inducer=inducer)
    eps = mixed_group() + wrong_group()
    asyncio.run(reward(eps, ctx(eps)))
    asyncio.run(state.on_step_end(None, ctx(eps, state=state), eps, None))
    out = asyncio.run(reward(eps, ctx(eps, step=2)))
    # all-wrong group (qualities 0, 3, 1, 2, base all 0): order 0..3, edges (0,1) (1,2) (2,3) (0,2) (1,3)
    # scores: 0 -> 0, 1 -> 1 (3 wins), 2 -> 1/3, 3 -> 1/2 (2 edges); mean 11/24; alpha 0.25 on the negative side
    mean = 11 / 24
    assert out.scores[4:] == pytest.approx([-0.025 * mean, 0.1 * (1 - mean), -0.025 * (mean - 1 / 3),
                                            0.1 * (0.5 - mean)])
    # the mixed group: scores 1, 2/3, 1/3, 0 under the common rubric
    assert out.scores[:4] == pytest.approx([1.05, 0.5 + 0.1 / 6, -0.1 * 0.25 / 6, -0.0125])
    assert out.metrics["zero_var/base/all_wrong"] == 0.5 and out.metrics["zero_var/total/all_wrong"] == 0.0
    assert out.metrics["zero_var/rescued_fraction"] == 1.0 and out.metrics["rubric/shaped_groups"] == 2
    assert out.metrics["judge/calls"] == 15 and out.metrics["judge/calls_per_group"] == 7.5  # 2 x 5 + the draft's 5
    # the inducer is told the common rubric exists
    assert COMMON["title"] in inducer.requests[-1][0][-1].content
    metrics = asyncio.run(state.on_step_end(None, ctx(eps, step=2, state=state), eps, None))
    rubric = state.memory.common[0]
    assert rubric.uses == 2 and rubric.last_used_step == 2 and metrics["activations"] == 2
    assert rubric.rho is not None and rubric.rho > 0


def test_a_judge_failing_on_some_calls_scores_nothing_zero_and_reports_the_failures():
    settings = ArborParams(k_consol=100)
    memory = with_common(settings)

    def fail(qa, qb):
        if 7 in (qa, qb) or {qa, qb} == {0, 1}:
            return "error"
        return "junk" if {qa, qb} == {2, 3} else None

    reward, state = arbor(judge=QualityJudge(fail), settings=settings, memory=memory)
    eps = [episode(0, "Nowhere", q) for q in range(8)]
    out = asyncio.run(reward(eps, ctx(eps)))
    assert out.metrics["judge/calls"] == 11 and out.metrics["judge/failures"] == 3
    assert out.metrics["judge/unparsed"] == 1 and out.metrics["rubric/removed_edges"] == 4
    assert out.metrics["rubric/unscored_trajectories"] == 1
    # scores 0, 0, .5, 0, 2/3, 2/3, 1 and none for 7; centred on their mean 17/42
    mean = (0.5 + 2 / 3 + 2 / 3 + 1) / 7
    assert out.scores[6] == pytest.approx(0.1 * (1 - mean)) and out.scores[0] == pytest.approx(-0.025 * mean)
    assert out.scores[7] == 0.0  # no judged edge: R_base, not the -0.025*mean a score of 0 would give
    assert all(isinstance(s, float) for s in out.scores)
    asyncio.run(state.on_step_end(None, ctx(eps, state=state), eps, None))
    assert memory.common[0].corr.n == 7  # the unscored trajectory stays out of the statistics


def test_a_judge_that_fails_every_call_leaves_the_base_reward():
    settings = ArborParams(k_consol=100)
    memory = with_common(settings)
    reward, _ = arbor(judge=QualityJudge(lambda qa, qb: "error"), settings=settings, memory=memory)
    eps = wrong_group(group=0)
    out = asyncio.run(reward(eps, ctx(eps)))
    assert out.scores == [0.0] * 4 and out.metrics["judge/failures"] == out.metrics["judge/calls"] == 5
    assert out.metrics["rubric/unscored_trajectories"] == 0 and out.metrics["rubric/shaped_groups"] == 0


def test_a_failed_induction_is_counted_and_adds_no_draft():
    reward, state = arbor(inducer=writer(fail=True))
    eps = mixed_group()
    out = asyncio.run(reward(eps, ctx(eps)))
    assert out.metrics["induction/failures"] == 1 and out.metrics["rubric/induction_failed"] == 1
    assert out.metrics["judge/calls"] == 0
    metrics = asyncio.run(state.on_step_end(None, ctx(eps, state=state), eps, None))
    assert metrics["admitted"] == 0 and state.memory.drafts == []


def test_no_memory_variant_shapes_a_group_with_its_own_admitted_drafts():
    reward = ArborReward(S, QualityJudge(), writer(), seed=7)
    eps = mixed_group() + wrong_group()
    out = asyncio.run(reward(eps, ctx(eps)))
    assert out.scores[:4] == pytest.approx([1.05, 0.5 + 0.1 / 6, -0.1 * 0.25 / 6, -0.0125])
    assert out.scores[4:] == [0.0] * 4  # all-wrong: no induction, nothing to shape with
    assert out.metrics["rubric/draft_admitted"] == 1 and out.metrics["rubric/active"] == 0


def test_no_memory_variant_does_not_use_a_draft_that_fails_admission():
    backwards = [episode(0, "Ossian Threll", 0), episode(0, "Ossian Kestrow", 1), episode(0, "Vell Amsar", 2)]
    reward = ArborReward(S, QualityJudge(), writer(), seed=7)
    out = asyncio.run(reward(backwards, ctx(backwards)))
    assert out.scores == pytest.approx([1.0, 0.5, 0.0]) and out.metrics["rubric/draft_admitted"] == 0


def test_rar_writes_one_checklist_per_question_and_adds_the_centred_rating():
    ratings = {0: 10, 1: 7, 2: 4, 3: 1}
    checklist_writer = ScriptedChatModel(lambda m, s: json.dumps({"items": ["Finds the director", "Answers with a name"]}))

    def rater(messages, sampling):
        q = int(messages[-1].content.split("quality=")[1][0])
        return f'{{"rating": {ratings[q]}}}' if q != 3 else "no idea"

    state = RarState()
    reward = RarReward(S, checklist_writer, ScriptedChatModel(rater), state)
    eps = wrong_group(group=0, question=Q0)  # qualities 0, 3, 1, 2
    out = asyncio.run(reward(eps, ctx(eps)))
    # ratings 10, (unreadable), 7, 4 -> 1, -, 2/3, 1/3; mean 2/3; lambda 0.1, no attenuation
    assert out.scores == pytest.approx([0.1 / 3, 0.0, 0.0, -0.1 / 3])
    assert out.metrics["judge/unparsed"] == 1 and out.metrics["rubric/unscored_trajectories"] == 1
    asyncio.run(reward(eps, ctx(eps, step=2)))
    assert len(checklist_writer.requests) == 1 and state.checklists == {"q0": ["Finds the director",
                                                                              "Answers with a name"]}
    copy = RarState()
    copy.load_state_dict(json.loads(json.dumps(state.state_dict())))
    assert copy.checklists == state.checklists


def test_variants_build_from_params_with_an_injected_embedder(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml")
    roles = {"rubric_evaluator": QualityJudge(), "consolidator": writer(COMMON)}
    encoder = FakeEncoder()
    vctx = VariantContext(params=params, roles=roles.__getitem__, toolbox=None, out_dir=tmp_path, embedder=encoder)
    parts = get_variant("arbor")(vctx)
    assert isinstance(parts.method, ArborState) and parts.method.snapshot_dir == tmp_path / "memory"
    assert parts.reward_fn.judge is roles["rubric_evaluator"] and parts.method.consolidator is roles["consolidator"]
    # the judge bench's choice for the embedded 1.5B, set on ARBOR's judge alone (its role's llm.scoring unset)
    assert parts.reward_fn.settings.judge_form == "single" and parts.reward_fn.judge.scoring == "probability"
    assert params.llm.scoring.get(params.arbor.judge_role, "text") == "text"
    assert parts.method.memory.settings.k_consol == params.arbor.k_consol
    vectors = parts.method.memory.embed(["a", "b", "a"])
    assert vectors.shape == (3, 16) and encoder.axes == {"a": 0, "b": 1}
    assert get_variant("arbor_no_memory")(vctx).method is None
    assert isinstance(get_variant("rar")(vctx).method, RarState)
    bad = VariantContext(params=params.model_copy(update={"arbor": ArborParams(rar_min_items=11)}),
                         roles=roles.__getitem__, toolbox=None, out_dir=tmp_path)
    with pytest.raises(ValueError, match="arbor.rar_min_items"):
        get_variant("rar")(bad)
    embed = lazy_embedder(bad, "nope")  # nothing is resolved or loaded until the first de-duplication
    with pytest.raises(ValueError, match="unknown embedder 'nope'"):
        embed(["x"])


def test_the_reward_asks_its_judge_in_the_configured_form(monkeypatch):
    import asyncio

    from components.judges.call import Tally
    from components.methods.arbor import variants
    from components.methods.arbor.pairwise_judge import GroupScores

    seen = {}

    async def fake_score_group(judge, question, texts, edges, rubric, key, max_tokens=32, form="winner",
                               reference=None):
        seen["form"] = form
        return GroupScores(scores=[None] * len(texts), outcomes={}, tally=Tally())

    monkeypatch.setattr(variants, "score_group", fake_score_group)
    for form in ("single", "winner"):
        reward = variants.ArborReward(ArborParams(judge_form=form), judge=None, inducer=None, seed=0)
        asyncio.run(reward._score("q", ["a", "b"], [(0, 1)], None, "k", Tally()))
        assert seen["form"] == form
