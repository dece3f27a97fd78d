"""The `train_rubric_generator` stage through the real GRPO trainer, on a tiny random Qwen2 and a scripted evaluator.

A tiny random model cannot write JSON, so two cases:
- the plain HF engine: every rubric is unparseable, scored 0 by the format term (never sent to the evaluator),
  and the stage still runs, counts the failures and writes its files;
- a "menu" engine: the tiny policy samples one token, which picks one of four prepared rubric texts (the
  episode's text; the token is what is trained). The policy then has something to learn:
  which rubric to write. The listwise reward raises the share of the rubric that ranks slates like the council,
  and held-out Spearman rises from the untrained choice to 1. The evaluator fails on some calls: those episodes
  leave their groups (counted), none is scored 0.
"""

import json
import math
import re
import string
from dataclasses import replace

import pytest
import torch

from components.io import read_json
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import TransientLLMError
from components.methods.coreact.generator_training import run_training
from components.methods.coreact.rubric_training import paired_change
from components.params_load import load_params
from components.schemas import BranchingPoint, Candidate
from components.training.engines.rollout import Generation, HFRolloutEngine
from components.training.model import LoRASettings, build_policy
from components.training.tiny import CharTokenizer, tiny_qwen2


@pytest.fixture(autouse=True)
def one_thread():
    """Tiny matmuls on 2 shared cores run faster on one torch thread."""
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


TOK = CharTokenizer(string.ascii_letters + string.digits + " \n{}[]\":,.?!'_-()")
ACTIONS = ["search[Nightfall Harbor]", "search[Ossian Threll]", "browse[d9]", "search[film]"]
IN_ORDER = [[True, True], [True, False], [False, True], [False, False]]  # weights 2:1 -> 1, 2/3, 1/3, 0


def rubric(marker):
    return json.dumps({"criteria": [{"criterion": f"Looks up the film {marker}", "weight": 2},
                                    {"criterion": f"Uses a search action {marker}", "weight": 1}]})


MENU = [rubric("GOODRUBRIC"), rubric("BADRUBRIC"), "no rubric here", rubric("FLATRUBRIC")]


def points(n=8):
    return [BranchingPoint(question_id=f"q{i}", question=f"Q{i}?", depth=0,
                           candidates=[Candidate(action=a, model="m", temperature=0.4) for a in ACTIONS],
                           slate=[0, 1, 2, 3], borda_scores=[3.0, 2.0, 1.0, 0.0], consensus=[0, 1, 2, 3])
            for i in range(n)] + [BranchingPoint(question_id="q-flat", question="Qf?", depth=0, slate=[0, 1],
                                                 candidates=[Candidate(action=a, model="m", temperature=0.4)
                                                             for a in ACTIONS[:2]], borda_scores=[1.0, 1.0])]


def render(messages, add_generation_prompt):
    if messages[-1].role == "assistant":  # a reply, as the SFT rows close it: with a newline
        return messages[-1].content + "\n"
    return re.search(r"Question:\n(.+)", messages[1].content).group(1) + "\n"


def evaluator(calls):
    """Scripted evaluator of every mode: one action (``{"satisfied": ...}``), the labelled slate
    (``{"verdicts": ...}``, criterion by criterion) or one criterion of one action (yes / no)."""

    def verdicts(body, action):
        if "FLATRUBRIC" in body and action == ACTIONS[2]:  # the flat rubric can never be scored
            raise TransientLLMError("evaluator down")
        i = ACTIONS.index(action)
        return IN_ORDER[i] if "GOODRUBRIC" in body else IN_ORDER[3 - i] if "BADRUBRIC" in body else [True, False]

    def respond(messages, sampling):
        body = messages[1].content
        if "Requirement: " in body:
            action = re.search(r"Proposed next action: (.+)", body).group(1)
            calls.append(action)
            index = 0 if "Requirement: Looks up" in body else 1
            return "yes" if verdicts(body, action)[index] else "no"
        if "Proposed next actions" in body:
            shown = re.findall(r"^[A-Z]\. (.+)$", body.split("Proposed next actions", 1)[1].split("Checklist")[0], re.MULTILINE)
            calls.extend(shown)
            rows = [verdicts(body, a) for a in shown]
            return json.dumps({"verdicts": [list(c) for c in zip(*rows)]})
        action = re.search(r"Proposed next action:\n(.+)", body).group(1)
        calls.append(action)
        return json.dumps({"satisfied": verdicts(body, action)})

    return ScriptedChatModel(respond)


class MenuEngine:
    """The tiny policy samples one token; it stands for a rubric text of the menu (the episode's text). Only that
    token is trained, so the choice is all the policy learns."""

    def __init__(self, model):
        self.inner = HFRolloutEngine(model, TOK)
        self.greedy_calls = []  # per greedy generate call: was it inside batch_invariant()?

    def update_weights(self, policy, step):
        pass

    def batch_invariant(self):
        return self.inner.batch_invariant()

    def generate(self, prompts, sampling):
        if sampling.temperature == 0:
            self.greedy_calls.append(self.inner.max_batch_size == 1)
        firsts = self.inner.generate(prompts, replace(sampling, max_new_tokens=1, stop_strings=()))
        out = []
        for g in firsts:
            text = MENU[g.token_ids[0] % len(MENU)]
            out.append(Generation(g.prompt_ids, g.token_ids[:1], g.logprobs, "stop", text))
        return out


def params_for(repo_root, tmp_path, *extra):
    return load_params(repo_root / "params.yaml", overrides=[
        f"run.out_dir={tmp_path}", "rubric_generator.group_size=8", "rubric_generator.prompts_per_step=2",
        "rubric_generator.kl_coef=0.0", "rubric_generator.checkpoint_every=0",
        "rubric_generator.warm_start=none", *extra])  # GRPO from the tiny base unless a test asks for the warm start


def tiny_policy():
    return build_policy(tiny_qwen2(TOK.vocab_size, seed=0, max_positions=256), lora=LoRASettings(r=8, alpha=16))


@pytest.mark.parametrize("mode", ["action", "slate", "criterion"])
def test_listwise_grpo_learns_which_rubric_ranks_like_the_council(repo_root, tmp_path, mode):
    params = params_for(repo_root, tmp_path, "rubric_generator.epochs=8", "rubric_generator.lr=0.03",
                        f"rubric_generator.evaluator_mode={mode}", "rubric_generator.heldout_samples=3")
    torch.manual_seed(0)
    policy, calls = tiny_policy(), []
    folder = tmp_path / "train_rubric_generator" / "listwise"
    engine = MenuEngine(policy.model)
    result = run_training(params, policy, engine, evaluator(calls), points(), folder, render=render)
    assert engine.greedy_calls == [True, True]  # the held-out greedy rubrics, before and after: one prompt at a time
    m = result.metrics
    assert m["points_train"] == 6 and m["points_held_out"] == 2 and m["points_dropped.flat_consensus"] == 1
    history = [json.loads(json.dumps(r)) for r in __import__("pandas").read_csv(folder / "metrics.csv").to_dict("records")]
    assert len(history) == 8 * 6 // 2  # epochs x points / prompts per step
    first, last = history[:4], history[-4:]
    mean = lambda rows, k: sum(r[k] for r in rows) / len(rows)
    print("reward:", [round(r["reward/mean"], 3) for r in history])
    assert mean(last, "reward/mean") > mean(first, "reward/mean") + 0.2
    # every term of the reward is logged per step, and the evaluator's failures dropped episodes, never scored 0
    assert {"reward/rank_mean", "reward/flat_rate", "reward/atomicity_mean", "reward/format_mean", "reward/gated",
            "reward/rubric_parse_failure_rate", "reward/evaluator/failures"} <= set(history[0])
    assert sum(r["reward/evaluator_dropped"] for r in history) > 0
    assert sum(r["episodes/unscored"] for r in history) == sum(r["reward/evaluator_dropped"] for r in history)
    before, after = result.before, result.after
    print("held-out before", before, "after", after)
    assert after["spearman"] == pytest.approx(1.0) and after["parse_rate"] == 1.0
    assert not before["spearman"] >= 1.0  # NaN (an unparseable choice) or a worse rubric
    stored = read_json(folder / "heldout.json")
    assert stored["before"] == before and stored["after"] == after
    # each held-out point's greedy rubric is kept beside its rho, before and after
    greedy = {k: [r for r in stored[f"rubrics_{k}"] if r["greedy"]] for k in ("before", "after")}
    assert [r["point"] for r in greedy["after"]] == [r["point"] for r in greedy["before"]]
    assert len(greedy["after"]) == 2 and all(r["parsed"] and r["rho"] == pytest.approx(1.0) for r in greedy["after"])
    assert all(r["rubric"] for r in greedy["after"])
    assert any(not r["parsed"] or r["rho"] != pytest.approx(1.0) for r in greedy["before"])
    # ... and 3 sampled rubrics per point beside it, summarised as the policy's expected held-out rho
    sampled = [r for r in stored["rubrics_after"] if not r["greedy"]]
    assert sorted(r["point"] for r in sampled) == sorted([r["point"] for r in greedy["after"]] * 3)
    evaluated = [r["rho"] for r in sampled if r["rho"] is not None]
    assert after["sampled_evaluated"] == len(evaluated)
    assert after["sampled_spearman"] == pytest.approx(sum(evaluated) / len(evaluated))
    assert after["sampled_spearman"] > 0.5 and not before["sampled_spearman"] >= after["sampled_spearman"]
    assert (folder / "adapter" / "adapter_config.json").exists()
    # the paired before/after change is computed from those same records and lands in metrics.json
    change = stored["change"]
    assert change == paired_change(stored["rubrics_before"], stored["rubrics_after"], seed=params.seed)
    assert change["after_mean"] == pytest.approx(1.0) and change["delta_mean"] > 0
    assert m["heldout_change.delta_mean"] == pytest.approx(change["delta_mean"], abs=1e-6)
    as_chance = stored["change_unparsed_as_chance"]
    assert as_chance == paired_change(stored["rubrics_before"], stored["rubrics_after"], seed=params.seed,
                                      unparsed_as_chance=True)
    assert as_chance["points_paired"] >= change["points_paired"]
    assert m["heldout_change_unparsed_as_chance.delta_mean"] == pytest.approx(as_chance["delta_mean"], abs=1e-6)

    # a re-run resumes at the last step: nothing is trained again and "before" is the untrained measurement;
    # metrics.csv is written again from the checkpoint's history (a run killed after its last checkpoint)
    (folder / "metrics.csv").unlink()
    fresh = tiny_policy()
    rerun = run_training(params, fresh, MenuEngine(fresh.model), evaluator([]), points(), folder, render=render)
    assert rerun.before == before and rerun.after == after
    rows = __import__("pandas").read_csv(folder / "metrics.csv").to_dict("records")
    assert [r["step"] for r in rows] == [r["step"] for r in history]
    assert [r["reward/mean"] for r in rows] == pytest.approx([r["reward/mean"] for r in history])


def test_paired_change_compares_each_held_out_points_mean_rho_before_and_after():
    def recs(**points):
        return [{"point": k, "rho": r} for k, rhos in points.items() for r in rhos]
    before = recs(a=[0.0, 0.2], b=[0.5], c=[None], d=[0.3], f=[0.1])
    after = recs(a=[0.4, 0.6], b=[0.3], c=[0.9], e=[1.0], f=[0.4])
    change = paired_change(before, after, seed=3)
    # paired points a (0.1 -> 0.5), b (0.5 -> 0.3), f (0.1 -> 0.4); c, d and e are evaluated on one side only
    assert change["points_paired"] == 3 and (change["points_up"], change["points_down"], change["points_same"]) == (2, 1, 0)
    assert change["before_mean"] == pytest.approx(0.7 / 3) and change["after_mean"] == pytest.approx(1.2 / 3)
    assert change["delta_mean"] == pytest.approx(0.5 / 3)
    # |d| ranks 0.2 -> 1, 0.3 -> 2, 0.4 -> 3: W- = 1; exact two-sided p = 2 * P(W <= 1) = 2 * 2/8
    assert change["wilcoxon_p"] == pytest.approx(0.5)
    assert -0.2 - 1e-9 <= change["delta_ci_low"] <= change["delta_mean"] <= change["delta_ci_high"] <= 0.4 + 1e-9
    assert paired_change(before, after, seed=3) == change  # the interval is seeded
    # every point moved alike: the interval is that move; nothing moved, or one point: no interval and no p
    same = paired_change(recs(a=[0.1], b=[0.2]), recs(a=[0.3], b=[0.4]))
    assert same["delta_ci_low"] == pytest.approx(0.2) and same["delta_ci_high"] == pytest.approx(0.2)
    assert same["wilcoxon_p"] == pytest.approx(0.5)
    flat = paired_change(recs(a=[0.1], b=[0.2]), recs(a=[0.1], b=[0.2]))
    assert flat["points_same"] == 2 and flat["delta_mean"] == 0 and math.isnan(flat["wilcoxon_p"])
    assert math.isnan(paired_change(recs(a=[0.1]), recs(a=[0.5]))["delta_ci_low"])
    assert paired_change([], [])["points_paired"] == 0


def test_unparsed_rubrics_count_as_chance_only_when_asked():
    before = [{"point": "a", "rho": None, "parsed": False, "evaluator_failed": False},
              {"point": "a", "rho": 0.4, "parsed": True, "evaluator_failed": False},
              {"point": "b", "rho": None, "parsed": False, "evaluator_failed": False},
              {"point": "c", "rho": None, "parsed": True, "evaluator_failed": True}]
    after = [{"point": k, "rho": 0.3, "parsed": True, "evaluator_failed": False} for k in "abc"]
    evaluated = paired_change(before, after)
    assert evaluated["points_paired"] == 1 and evaluated["delta_mean"] == pytest.approx(-0.1)
    chance = paired_change(before, after, unparsed_as_chance=True)
    # a: (0 + 0.4) / 2 = 0.2 -> 0.3; b: 0 -> 0.3; c's evaluator failed: still not paired
    assert chance["points_paired"] == 2 and chance["before_mean"] == pytest.approx(0.1)
    assert chance["delta_mean"] == pytest.approx(0.2) and chance["points_up"] == 2


def test_unparseable_rubrics_score_zero_without_evaluator_calls(repo_root, tmp_path):
    params = params_for(repo_root, tmp_path, "rubric_generator.epochs=1", "rubric_generator.max_tokens=16")
    torch.manual_seed(0)
    policy, calls = tiny_policy(), []
    folder = tmp_path / "random"
    result = run_training(params, policy, HFRolloutEngine(policy.model, TOK), evaluator(calls), points(), folder,
                          render=render)
    assert calls == []  # random text never parses, so nothing reaches the evaluator
    assert result.metrics["reward/rubric_parse_failure_rate"] == 1.0 and result.metrics["reward/mean"] == 0.0
    assert result.before["parse_rate"] == 0.0 and result.after["evaluated"] == 0.0
    # nothing parsed: no mean over evaluated rubrics, but as chance every rubric is worth rho 0
    assert math.isnan(result.after["spearman"]) and result.after["spearman_with_unparsed"] == 0.0
    assert (folder / "metrics.json").exists() and (folder / "adapter" / "adapter_config.json").exists()
    assert read_json(folder / "warm_start" / "metrics.json") == {"kind": "none"}  # written, so DVC clears it too


def test_generator_checkpoints_on_its_own_schedule(repo_root, tmp_path):
    """grpo.checkpoint_every (10) is for long policy runs; the generator's few, long steps are each kept."""
    from components.methods.coreact.rubric_training import generator_config

    params = load_params(repo_root / "params.yaml", overrides=["grpo.checkpoint_every=10", "grpo.micro_batch_tokens=4096",
                                                               "rubric_generator.checkpoint_every=1",
                                                               "grpo.checkpoint_min_tokens=4096"])
    config = generator_config(params.grpo, params.rubric_generator, n_train_points=6)
    assert config.checkpoint_every == 1 and config.steps == 3 * params.rubric_generator.epochs
    assert config.micro_batch_tokens == params.rubric_generator.micro_batch_tokens != params.grpo.micro_batch_tokens
    assert config.checkpoint_min_tokens == 0  # the policy's threshold is not the generator's: it always recomputes
    assert generator_config(params.grpo, params.rubric_generator.model_copy(update={"checkpoint_every": 0}),
                            6).checkpoint_every == 0


def test_generator_advantages_divide_by_the_std_its_section_names(repo_root):
    """rubric_generator.adv_std reaches the trainer's config whatever grpo.adv_std says: the released code's verl
    divides by the sample std, so G=4 rewards [1, 0, 0, 0] give 0.75 / 0.5 = 1.5, not 0.75 / 0.433 = 1.732."""
    import torch

    from components.methods.coreact.rubric_training import generator_config
    from components.training.grpo.advantages import group_advantages

    params = load_params(repo_root / "params.yaml", overrides=["grpo.adv_std=population"])
    assert params.rubric_generator.adv_std == "sample" and generator_config(params.grpo, params.rubric_generator, 4).adv_std == "sample"
    assert load_params(repo_root / "params.yaml", "paper").rubric_generator.adv_std == "sample"
    population = load_params(repo_root / "params.yaml", overrides=["rubric_generator.adv_std=population"])
    assert generator_config(population.grpo, population.rubric_generator, 4).adv_std == "population"
    rewards = torch.tensor([1.0, 0.0, 0.0, 0.0])
    # mean 0.25; sample std sqrt(0.75 / 3) = 0.5, population std sqrt(0.75 / 4) = 0.433
    for config, first in ((generator_config(params.grpo, params.rubric_generator, 4), 0.75 / 0.5),
                          (generator_config(population.grpo, population.rubric_generator, 4), 0.75 / (0.75 / 4) ** 0.5)):
        adv = group_advantages(rewards, [0] * 4, eps=0.0, unbiased_std=config.adv_std == "sample")
        assert adv[0].item() == pytest.approx(first)


def gold_questions():
    """Every test point's question, with one hop whose answer no prefix shows: each oracle rubric is the same text."""
    from components.schemas import Question, SubQuestion

    return {q: Question(id=q, question=f"{q}?", answers=["Zed"], source="world",
                        gold_chain=[SubQuestion(question="Who directed the film?", answer="Zed")])
            for q in [f"q{i}" for i in range(8)] + ["q-flat"]}


def test_oracle_warm_start_trains_the_format_and_serves_one_adapter(repo_root, tmp_path):
    """warm_start=oracle: SFT on the training points' gold-chain rubrics, merged under a fresh LoRA for GRPO; the
    served adapter holds both (its delta is the sum), and the held-out Spearman is measured after each phase."""
    from peft import PeftModel

    from components.methods.coreact.generator_training import WarmStartInputs
    from components.methods.coreact.oracle_rubrics import oracle_rubric

    params = params_for(repo_root, tmp_path, "rubric_generator.epochs=1", "rubric_generator.max_tokens=120",
                        "rubric_generator.warm_start=oracle", "rubric_generator.warm_start_epochs=200",
                        "rubric_generator.warm_start_lr=0.02", "sft.batch_size=7", "sft.checkpoint_every=0",
                        "rubric_generator.evaluator_mode=criterion")
    torch.manual_seed(0)
    base = lambda: tiny_qwen2(TOK.vocab_size, seed=0, max_positions=256, hidden_size=64)  # room to learn a rubric
    lora = LoRASettings(r=16, alpha=32)
    policy, rebased = build_policy(base(), lora=lora), []

    def rebase(trained, adapter):
        fresh = build_policy(trained.model.merge_and_unload(), lora=lora)
        rebased.append(adapter)
        return fresh, HFRolloutEngine(fresh.model, TOK)

    def one_prompt(messages, add_generation_prompt):  # every point alike: held-out prompts are no novelty to it
        return messages[-1].content + "\n" if messages[-1].role == "assistant" else "Q?\n"

    # a policy warm-start episode in a training world: a search, then the answer (2 more rows)
    from components.schemas import Question, Step, SubQuestion, ToolCall, Trajectory
    episode = Trajectory(question_id="s1-q", question="S1?", steps=[
        Step(index=0, action="search[film]", tool_call=ToolCall(name="search", observation="Zed directed it.")),
        Step(index=1, action="finish[Zed]", final_answer="Zed")])
    questions = {**gold_questions(), "s1-q": Question(id="s1-q", question="S1?", answers=["Zed"], source="world",
                                                      gold_chain=[SubQuestion(question="Who?", answer="Zed")])}
    folder = tmp_path / "warm"
    inputs = WarmStartInputs(questions, TOK, rebase, [episode])
    result = run_training(params, policy, HFRolloutEngine(policy.model, TOK), evaluator([]), points(), folder,
                          render=one_prompt, warm_start=inputs)
    warm = read_json(folder / "warm_start" / "metrics.json")
    # 6 training points of the usable ones and the flat-consensus point (not held out), and the episode's 2 prefixes
    assert warm["kind"] == "oracle" and warm["rows"] == 9 and warm["points.collect"] == 7 and warm["points.trajectories"] == 2
    assert rebased == [folder / "warm_start" / "adapter"]
    assert warm["loss_last_tenth"] < warm["loss_first_tenth"]
    # the held-out Spearman is measured after the warm start too, and compared with before and after
    stored = read_json(folder / "heldout.json")
    same = lambda a, b: json.dumps(a, sort_keys=True) == json.dumps(b, sort_keys=True)  # NaN where nothing parsed
    assert same(stored["warm_start"], result.warm_start) and len(stored["rubrics_warm_start"]) == 2 * (1 + params.rubric_generator.heldout_samples)
    assert stored["change_warm_start_unparsed_as_chance"]["points_paired"] == 2
    assert stored["change_grpo_unparsed_as_chance"]["points_paired"] == 2
    assert result.metrics["heldout_warm_start.parse_rate"] == result.warm_start["parse_rate"]

    # the warm start learned a held-out point's oracle rubric (the 2-layer model cannot write all of it greedily)
    def nll(model, target):
        ids = TOK.encode("Q?\n" + target + "\n", add_special_tokens=False)
        with torch.no_grad():
            out = model.eval()(torch.tensor([ids])).logits[0, 2:-1]
        return torch.nn.functional.cross_entropy(out, torch.tensor(ids[3:])).item()
    expected = oracle_rubric(points()[0], gold_questions()["q0"])  # every point's: one hop, never shown
    warm_model = PeftModel.from_pretrained(base(), str(folder / "warm_start" / "adapter"))
    assert nll(warm_model, expected) < 0.25 * nll(base(), expected)

    # the served adapter on the untrained base = the warm start merged, then GRPO's LoRA
    ids = torch.tensor([TOK.encode("Q?\n{\"criteria\"", add_special_tokens=False)])
    def logits(model):
        with torch.no_grad():
            return model.eval()(ids).logits
    step_by_step = PeftModel.from_pretrained(base(), str(folder / "warm_start" / "adapter")).merge_and_unload()
    step_by_step = PeftModel.from_pretrained(step_by_step, str(folder / "warm_start" / "grpo_adapter"))
    served = PeftModel.from_pretrained(base(), str(folder / "adapter"))
    assert torch.allclose(logits(served), logits(step_by_step), atol=1e-5)
    grpo_only = PeftModel.from_pretrained(base(), str(folder / "warm_start" / "grpo_adapter"))
    assert not torch.allclose(logits(served), logits(grpo_only), atol=1e-3)

    # a rerun finds the warm start done: no SFT again, and the fresh policy gets its adapter back before rebasing
    fresh = build_policy(base(), lora=lora)
    rerun = run_training(params, fresh, HFRolloutEngine(fresh.model, TOK), evaluator([]), points(), folder,
                         render=one_prompt, warm_start=inputs)
    assert read_json(folder / "warm_start" / "metrics.json") == warm and same(rerun.warm_start, result.warm_start)
    assert same(rerun.after, result.after)


def test_oracle_warm_start_needs_its_inputs(repo_root, tmp_path):
    params = params_for(repo_root, tmp_path, "rubric_generator.warm_start=oracle")
    policy = tiny_policy()
    with pytest.raises(ValueError, match="warm_start=oracle"):
        run_training(params, policy, HFRolloutEngine(policy.model, TOK), evaluator([]), points(), tmp_path / "x",
                     render=render)


def test_without_a_usable_point_the_untrained_generator_is_written_and_the_skip_recorded(repo_root, tmp_path):
    """A collect that kept no point (every council vote unreadable) leaves nothing to train on: the stage takes no
    step, writes every file DVC expects, the untrained LoRA as the adapter (the base generator), and says why."""
    from safetensors.torch import load_file

    params = params_for(repo_root, tmp_path)
    policy, calls = tiny_policy(), []
    folder = tmp_path / "empty"
    unkept = [p.model_copy(update={"kept": False}) for p in points(2)]
    result = run_training(params, policy, HFRolloutEngine(policy.model, TOK), evaluator(calls), unkept, folder,
                          render=render)
    assert calls == [] and result.after == {}
    assert result.metrics["skipped"] == 1.0 and result.metrics["optimizer_steps"] == 0.0
    assert result.metrics["points_dropped.not_kept"] == len(unkept) and result.metrics["points_train"] == 0.0
    for out in ("ckpt", "warm_start/metrics.json", "heldout_before.json", "heldout.json", "metrics.json",
                "metrics.csv"):
        assert (folder / out).exists(), out
    assert "no branching point to train on" in read_json(folder / "heldout.json")["skipped"]
    weights = load_file(folder / "adapter" / "adapter_model.safetensors")
    assert all(float(t.abs().sum()) == 0.0 for name, t in weights.items() if "lora_B" in name)  # zero delta
