"""The reflection meta-policy: candidate parsing, the reflection judge's weighted scores and failures, the
one-step deferred update through a stand-in trainer, the windowed curriculum's prompt order, the method state
through checkpoints, and the registered variants."""

import asyncio
import json
import re
import threading
from dataclasses import dataclass, field

import pytest
import torch

from components.methods.rubricem.reflection import ReflectionJudge, parse_reflection
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import ChatModel, Completion, TransientLLMError
from components.methods.rubricem.variants import MetaPolicyFirst, ReflectionBranch, RubricEMState, windowed_curriculum
from components.rewards.outcome import OutcomeReward
from components.variants import VariantContext, get_variant
from components.params_load import load_params
from components.training.params import GRPOParams
from components.methods.rubricem.stage_returns import StageReturns, StagewiseReward
from components.methods.rubricem.bank import BANK_FILE, PHASE_KEY, BankGuidance, RubricBank
from components.schemas import Question
from components.training.grpo.episodes import Episode, StepContext
from components.training.prompt_order import PromptSampler
from components.training.engines.rollout import Generation, SamplingParams
from tests.rubricem.test_bank import TableEmbedder
from tests.rubricem.trajectories import episode_trajectory

GOOD = "<reflection_rubrics>\nCritical: find the town first.\n</reflection_rubrics>\n<reflection_takeaways>\n1. Follow the new name.\n</reflection_takeaways>"


def test_reflection_parser():
    ok = parse_reflection(GOOD)
    assert ok.valid and ok.rubrics == "Critical: find the town first." and ok.takeaways == "1. Follow the new name."
    assert "found 0" in parse_reflection("<reflection_rubrics>x</reflection_rubrics>").error
    assert "non-empty <reflection_rubrics>" in parse_reflection(GOOD.replace("Critical: find the town first.", " ")).error
    swapped = GOOD.split("\n<reflection_takeaways>")
    assert "comes before" in parse_reflection("<reflection_takeaways>" + swapped[1] + swapped[0]).error
    assert "text outside" in parse_reflection("Sure! " + GOOD).error
    # the format's own placeholders copied (the 1.5B teacher's first reply did this) are not a reflection
    copied = GOOD.replace("Critical: find the town first.", "Critical requirements: ...\nApproach: ...\nPitfalls: ...")
    assert "only repeats the format's placeholders" in parse_reflection(copied).error
    assert "<reflection_takeaways> only" in parse_reflection(
        GOOD.replace("1. Follow the new name.", "1. ... (one to four short lessons)")).error
    assert parse_reflection(GOOD.replace("Critical: find the town first.", "Critical: ...\nApproach: search first.")).valid
    assert ok.reason is None and {parse_reflection(t).reason for t in ("junk", "Sure! " + GOOD, copied)} == {"format"}


def test_a_reflection_that_names_an_answer_is_invalid():
    leaky = GOOD.replace("1. Follow the new name.", "1. The answer is Torsten Radefelt.")
    assert parse_reflection(leaky).valid  # nothing withheld
    bad = parse_reflection(leaky, ["Ammel", "Torsten Radefelt"])
    assert not bad.valid and "names an answer ('Torsten Radefelt')" in bad.error and bad.reason == "names_answer"
    assert parse_reflection(GOOD, ["Ammel", "Torsten Radefelt"]).valid
    assert parse_reflection(GOOD.replace("new name", "new AMMEL."), ["Ammel"]).error  # normalised match
    assert parse_reflection(GOOD, ["town"]).error  # "the town first": a word match
    assert parse_reflection(GOOD.replace("town first", "townhall"), ["town"]).valid  # not inside a word
    assert parse_reflection(GOOD.replace("new name", "no guess"), ["no"]).valid  # yes/no are plain words


def ratings(*triples):
    return json.dumps({"candidates": [
        {"index": i, "within": dict(zip(("diagnostic_accuracy", "specificity", "scope"), w)),
         "cross": dict(zip(("diagnostic_accuracy", "specificity", "scope"), c))} for i, w, c in triples]})


Q = Question(id="q1", question="Which river flows through Kestrow?", answers=["Ammel"], source="world")


def test_reflection_judge_weights_and_failures():
    judge = ReflectionJudge(ScriptedChatModel([ratings((1, (1.0, 0.5, 0.0), (0.0, 1.0, 1.0)), (2, (0.5, 0.5, 0.5), (1, 1, 1)))]))
    scores, error = asyncio.run(judge.score(Q, "traj", "plan 0.5", [parse_reflection(GOOD), parse_reflection("junk"),
                                                                     parse_reflection(GOOD)]))
    # u_within = .4*1 + .3*.5 + .3*0 = .55; u_cross = .4*0 + .3 + .3 = .6; u = (.55 + .6) / 2
    assert error is None and scores == pytest.approx([0.575, 0.0, 0.75])  # the invalid candidate scores 0
    prompt = judge.judge.requests[0][0][-1].content
    # the valid candidates are shown as 1 and 2 (no gap where the invalid one was) and mapped back
    assert "--- Reflection 1 ---" in prompt and "--- Reflection 2 ---" in prompt and "Reflection 3" not in prompt
    assert prompt.count("Critical: find the town first.") == 2 and "(1, 2) exactly once" in prompt
    pinned = judge.judge.requests[0][1].json_schema["properties"]["candidates"]["prefixItems"]
    assert [c["properties"]["index"] for c in pinned] == [{"const": 1}, {"const": 2}]
    assert "How it was graded:\nplan 0.5" in prompt
    partial = ReflectionJudge(ScriptedChatModel([ratings((1, (1, 1, 1), (1, 1, 1)))]))
    scores, error = asyncio.run(partial.score(Q, "t", "f", [parse_reflection(GOOD)] * 2))
    assert scores == [None, None] and "expected [1, 2]" in error
    down = ReflectionJudge(ScriptedChatModel([TransientLLMError("503")]))
    scores, error = asyncio.run(down.score(Q, "t", "f", [parse_reflection(GOOD)]))
    assert scores == [None] and "503" in error
    with pytest.raises(ValueError, match="must name exactly"):
        ReflectionJudge(ScriptedChatModel([]), {"specificity": 1.0})


def test_windowed_curriculum_order():
    qs = [Question(id=f"q{i}", question=f"question {i}", answers=["x"], source="world") for i in range(7)]
    order = windowed_curriculum(qs, batch_size=2, window=3)
    got = [(q.id, q.metadata[PHASE_KEY]) for q in order]
    cross = [(f"q{i}", "cross") for i in (0, 1, 2, 3, 4, 5)]
    within = [(f"q{i}", "within") for i in (0, 1, 2, 3, 4, 5)]
    assert got == cross + within + [("q6", "cross"), ("q0", "cross"), ("q6", "within"), ("q0", "within")]
    # the trainer's sampler, unshuffled, walks it step by step: B1 B2 B3 (cross) then B1 B2 B3 (within)
    sampler = PromptSampler(len(order), seed=0, shuffle=False)
    steps = [[(order[i].id, order[i].metadata[PHASE_KEY]) for i in sampler.next(2)] for _ in range(6)]
    assert steps[0] == [("q0", "cross"), ("q1", "cross")] and steps[3] == [("q0", "within"), ("q1", "within")]
    assert steps[5] == [("q4", "within"), ("q5", "within")]
    assert qs[0].metadata == {}  # the dataset's questions are not modified


# ------------------------------------------------------------------------------ a stand-in trainer


class ChatTok:
    """Character ids with a trivial chat template."""

    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return "".join(f"<{m['role']}>{m['content']}" for m in messages) + ("<assistant>" if add_generation_prompt else "")

    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]

    def decode(self, ids, skip_special_tokens=True):
        return "".join(chr(i) for i in ids)


class Engine:
    def __init__(self, replies):
        self.tokenizer, self.replies, self.calls, self.refreshed = ChatTok(), list(replies), [], []

    def generate(self, prompts, sampling):
        self.calls.append((len(prompts), sampling))
        self.prompts = ["".join(map(chr, p)) for p in prompts]
        out = []
        for p in prompts:
            text = self.replies.pop(0)
            out.append(Generation(list(p), [ord(c) for c in text], [-1.0] * len(text), "stop", text))
        return out

    def update_weights(self, policy, step):
        self.refreshed.append(step)


@dataclass
class Trainer:
    engine: Engine
    config: GRPOParams = field(default_factory=GRPOParams)
    sampling: SamplingParams = field(default_factory=SamplingParams)
    pad_token_id: int = 0
    max_length: int | None = None
    policy: object = None
    updates: list = field(default_factory=list)

    def update(self, batch, advantages, *, row_episode=None, ctx=None):
        self.updates.append((batch, advantages, ctx.step))
        return {"loss": 0.25}


def step_episodes(questions, per_group=2):
    eps = []
    for g, q in enumerate(questions):
        for i in range(per_group):
            eps.append(Episode(prompt=q, group=g, rows=[], info={"trajectory": episode_trajectory(f"E{g}{i}")}))
    return eps


def branch(judge_replies, defer=True, m=2):
    bank = RubricBank(TableEmbedder())
    judge = ReflectionJudge(ScriptedChatModel(judge_replies))
    return ReflectionBranch(judge, bank, candidates=m, defer=defer, seed=1), bank


QA = Question(id="qa", question="Which river flows through Kestrow?", answers=["Ammel"], source="world",
              metadata={PHASE_KEY: "cross"})
QB = Question(id="qb", question="Who directed Nightfall Harbor?", answers=["Ossian Threll"], source="world",
              metadata={PHASE_KEY: "within"})


def test_candidates_rated_alike_still_reach_the_bank_but_train_nothing_and_are_counted():
    br, bank = branch([ratings((1, (1, 1, 0), (1, 1, 0)), (2, (1, 1, 0), (1, 1, 0)))], defer=False)
    trainer = Trainer(Engine([GOOD, GOOD.replace("town first", "town")]))
    out = br.step_end(trainer, StepContext(step=1, groups=[0, 0]), step_episodes([QA]), torch.tensor([[0.5], [1.0]]))
    assert out["reflection/flat_groups"] == 1 and out["reflection/updated"] == 0 and trainer.updates == []
    assert out["reflection/bank_writes"] == 1 and len(bank) == 1  # the first of the tied best enters the bank


def test_a_candidate_naming_its_trajectorys_answer_never_reaches_the_bank():
    leaky = GOOD.replace("1. Follow the new name.", "1. The answer was Kestrow Mill.")
    br, bank = branch([ratings((1, (1, 1, 1), (1, 1, 1)))], defer=False)
    trainer = Trainer(Engine([leaky, GOOD]))
    episodes = step_episodes([QA])
    for e in episodes:
        e.info["trajectory"] = e.info["trajectory"].model_copy(update={"final_answer": "Kestrow Mill"})
    out = br.step_end(trainer, StepContext(step=1, groups=[0, 0]), episodes, torch.tensor([[0.5], [1.0]]))
    assert out["reflection/valid_fraction"] == 0.5 and out["reflection/bank_writes"] == 1
    assert out["reflection/invalid/names_answer"] == 1 and "reflection/invalid/format" not in out
    assert "Kestrow Mill" not in bank.exact(QA.question).takeaways
    prompt = br.judge.judge.requests[0][0][-1].content
    assert "Kestrow Mill" not in prompt.split("--- Reflection 1 ---", 1)[1]  # the judge sees only the valid one


def test_the_meta_policy_is_shown_each_tool_output_cut_to_observation_chars():
    episodes = step_episodes([QA], per_group=1)
    observations = [s.observation for s in episodes[0].info["trajectory"].steps if s.observation]
    assert observations and min(map(len, observations)) > 12
    prompts = {}
    for chars in (None, 12):
        br, _ = branch([ratings((1, (1, 1, 1), (1, 1, 1)))], defer=False)
        br.observation_chars = chars
        trainer = Trainer(Engine([GOOD, GOOD]))
        br.step_end(trainer, StepContext(step=1, groups=[0]), episodes, torch.tensor([[0.5]]))
        prompts[chars] = trainer.engine.prompts[0]
    assert all(o in prompts[None] for o in observations)
    for o in observations:
        assert o not in prompts[12] and o[:12].rstrip() + " [...]" in prompts[12]


def test_deferred_reflection_update_lands_one_step_later():
    br, bank = branch([ratings((1, (1, 1, 1), (1, 1, 1)))])  # only the valid candidate goes to the judge
    trainer = Trainer(Engine([GOOD.replace("town first", "town"), "not a reflection"]))
    scores = torch.tensor([[0.5], [1.0], [0.0], [0.0]])
    # step 1: QA (new-query phase) gets m=2 candidates; QB is a repeat and is skipped (D.4); judging is deferred
    m1 = br.step_end(trainer, StepContext(step=1, groups=[0, 0, 1, 1]), step_episodes([QA, QB]), scores)
    assert m1 == {} and trainer.updates == [] and len(bank) == 0
    assert trainer.engine.calls[0][0] == 2 and trainer.engine.calls[0][1].temperature == 0.7
    # step 2: step 1's judged batch is trained on and its best valid candidate enters the bank
    trainer.engine.replies = []
    m2 = br.step_end(trainer, StepContext(step=2, groups=[0, 0, 1, 1]), step_episodes([QB]), scores[:2])
    assert m2["reflection/bank_writes"] == 1 and m2["reflection/updated"] == 1 and m2["reflection/loss"] == 0.25
    assert m2["reflection/valid_fraction"] == 0.5 and m2["reflection/best_score"] == pytest.approx(1.0)
    assert m2["reflection/invalid/format"] == 1
    assert bank.exact(QA.question).rubrics == "Critical: find the town."
    (batch, adv, step), = trainer.updates
    assert step == 2 and trainer.engine.refreshed == [2]
    # candidate scores 1.0 and 0.0 (invalid) -> advantages +1 / -1 on the reflection tokens only
    assert batch.input_ids.shape[0] == 2
    for row, sign in ((0, 1.0), (1, -1.0)):
        trained = adv[row][batch.loss_mask[row]]
        assert len(trained) > 0 and torch.allclose(trained, torch.full_like(trained, sign), atol=1e-4)
    prompt = ChatTok().decode(batch.input_ids[0][~batch.loss_mask[0] & batch.attention_mask[0].bool()].tolist())
    assert "Which river flows through Kestrow?" in prompt and "Two hops." in prompt  # question + trajectory: context
    assert ChatTok().decode(batch.input_ids[0][batch.loss_mask[0]].tolist()) in GOOD.replace("town first", "town")
    # which trajectory was reflected on is drawn uniformly but reproducibly
    feedback = br.judge.judge.requests[0][0][-1].content
    assert re.search(r"Two hops\. E0[01]", feedback) and "outcome reward" in feedback


def test_synchronous_mode_and_a_failed_judge(caplog):
    br, bank = branch([TransientLLMError("judge down")], defer=False)
    trainer = Trainer(Engine([GOOD, GOOD]))
    with caplog.at_level("WARNING", logger="components.methods.rubricem.variants"):
        out = br.step_end(trainer, StepContext(step=1, groups=[0, 0]), step_episodes([QA]), torch.zeros(2, 1))
    assert out["reflection/judge_failures"] == 1 and out["reflection/bank_writes"] == 0
    assert out["reflection/judge_failure/call_TransientLLMError"] == 1 and "judge down" in caplog.text
    assert trainer.updates == [] and len(bank) == 0  # a failed judge is never a 0: nothing is trained
    skipping, _ = branch([ratings((1, (1, 1, 1), (1, 1, 1)))], defer=False)  # rates 1 of the 2 candidates
    out = skipping.step_end(Trainer(Engine([GOOD, GOOD])), StepContext(step=1, groups=[0, 0]), step_episodes([QA]),
                            torch.zeros(2, 1))
    assert out["reflection/judge_failure/coverage"] == 1 and out["reflection/bank_writes"] == 0


def test_checkpoint_waits_for_pending_judging_and_resumes_with_it(tmp_path):
    br, bank = branch([ratings((1, (1, 1, 1), (1, 1, 1)), (2, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)))])
    trainer = Trainer(Engine([GOOD, GOOD.replace("town first", "town later")]))
    br.step_end(trainer, StepContext(step=1, groups=[0, 0]), step_episodes([QA]), torch.zeros(2, 1))
    state = RubricEMState(bank=bank, reflection=br, bank_dir=tmp_path / "snapshots", save_every=2)
    saved = json.loads(json.dumps(state.state_dict()))  # waits for the background judge
    state.write_files(tmp_path)
    assert saved["reflection"]["ready"][0]["scores"] == pytest.approx([1.0, 0.5]) and saved["bank_entries"] == 0
    # a fresh run restores the batch and applies it at its next step
    br2, bank2 = branch([])
    resumed = RubricEMState(bank=bank2, reflection=br2, bank_dir=tmp_path / "snapshots", save_every=2)
    resumed.load_state_dict(saved, tmp_path)
    trainer2 = Trainer(Engine([]))
    metrics = resumed.on_step_end(trainer2, StepContext(step=2, groups=[]), [], torch.zeros(0, 1))
    assert metrics["reflection/bank_writes"] == 1 and metrics["bank/size"] == 1
    assert bank2.exact(QA.question).rubrics == "Critical: find the town first."
    assert (tmp_path / "snapshots" / "step_000002" / BANK_FILE).exists()  # every save_every steps


def test_the_last_steps_reflections_land_when_training_ends(tmp_path):
    br, bank = branch([ratings((1, (1, 1, 1), (1, 1, 1)), (2, (0.5, 0.5, 0.5), (0.5, 0.5, 0.5)))])
    trainer = Trainer(Engine([GOOD, GOOD.replace("town first", "town later")]))
    state = RubricEMState(bank=bank, reflection=br, bank_dir=tmp_path / "snapshots", save_every=10)
    first = state.on_step_end(trainer, StepContext(step=1, groups=[0, 0]), step_episodes([QA]), torch.zeros(2, 1))
    assert first == {"bank/size": 0.0} and trainer.updates == []  # judging deferred to the next step
    end = state.on_train_end(trainer, StepContext(step=1, groups=[]))
    assert end["reflection/bank_writes"] == 1 and end["reflection/updated"] == 1 and end["bank/size"] == 1
    assert bank.exact(QA.question).rubrics == "Critical: find the town first."  # the best-scored candidate
    assert [u[2] for u in trainer.updates] == [1] and trainer.engine.refreshed == [1]
    assert (tmp_path / "snapshots" / "step_000001" / BANK_FILE).exists()
    assert state.on_train_end(trainer, StepContext(step=1, groups=[])) == {}  # nothing left: a no-op
    assert state.state_dict()["reflection"]["ready"] is None and len(trainer.updates) == 1
    assert RubricEMState(bank=RubricBank(TableEmbedder())).on_train_end(trainer, StepContext(step=1, groups=[])) == {}


def test_bank_restores_with_its_checkpoint(tmp_path):
    bank = RubricBank(TableEmbedder())
    bank.put("Which river flows through Kestrow?", rubrics="r", takeaways="t", step=3)
    state = RubricEMState(bank=bank)
    state.write_files(tmp_path)
    other = RubricEMState(bank=RubricBank(TableEmbedder()))
    other.bank.put("Who directed Nightfall Harbor?", rubrics="x", takeaways="y")
    other.load_state_dict(state.state_dict(), tmp_path)
    assert [e.question for e in other.bank.entries.values()] == ["Which river flows through Kestrow?"]
    with pytest.raises(FileNotFoundError, match="bank entries"):
        RubricEMState(bank=RubricBank(None)).load_state_dict({"bank_entries": 1}, tmp_path / "missing")


def test_variants_plug_rubricem_parts_into_the_trainer(repo_root, tmp_path):
    params = load_params(repo_root / "params.yaml")
    roles = {}

    def role(name):
        return roles.setdefault(name, ScriptedChatModel([], name=name))

    def parts(name):
        return get_variant(name)(VariantContext(params=params, roles=role, toolbox=None, out_dir=tmp_path,
                                                embedder=TableEmbedder()))

    full = parts("rubricem")
    assert full.agent == "scaffold" and full.agent_options["max_tokens"] == params.rubricem.scaffold_max_tokens
    # Phase A (D.2) runs before the step's reward, hence before its task update
    assert isinstance(full.reward_fn, MetaPolicyFirst) and full.reward_fn.state is full.method
    assert isinstance(full.reward_fn.reward, StagewiseReward) and isinstance(full.advantage_fn, StageReturns)
    assert isinstance(full.agent_options["guidance"], BankGuidance)
    assert full.method.judge.caps == [3, 2, 2, 3] and full.method.reflection.m == params.rubricem.reflection_candidates
    assert full.method.bank_dir == tmp_path / "bank"
    ss = parts("ss_grpo")
    assert ss.method.bank is None and "guidance" not in ss.agent_options and isinstance(ss.reward_fn, StagewiseReward)
    meta = parts("meta_policy")
    assert meta.advantage_fn is None and meta.method.judge is None and meta.method.reflection is not None
    assert isinstance(meta.reward_fn, MetaPolicyFirst) and isinstance(meta.reward_fn.reward, OutcomeReward)
    base = parts("scaffold_grpo")
    assert base.method is None and base.advantage_fn is None and base.agent == "scaffold"
    assert set(roles) == {"rubric_evaluator", "reflection_judge"}


class Gated(ChatModel):
    """A judge that answers only once the test opens the gate (from another thread)."""

    def __init__(self, reply):
        self.reply, self.gate, self.started = reply, threading.Event(), threading.Event()

    async def _complete(self, messages, sampling):
        self.started.set()
        await asyncio.to_thread(self.gate.wait, 30)
        return Completion(texts=[self.reply], model="gated")


def test_deferred_judging_runs_in_the_background_while_the_next_step_proceeds():
    gated = Gated(ratings((1, (1, 1, 1), (1, 1, 1)), (2, (0, 0, 0), (0, 0, 0))))
    bank = RubricBank(TableEmbedder())
    br = ReflectionBranch(ReflectionJudge(gated), bank, candidates=2, defer=True)
    trainer = Trainer(Engine([GOOD, GOOD]))
    br.step_end(trainer, StepContext(step=1, groups=[0, 0]), step_episodes([QA]), torch.zeros(2, 1))
    assert gated.started.wait(30) and not br.pending.done()  # step 1 returned; its judge is still working
    gated.gate.set()
    out = br.step_end(trainer, StepContext(step=2, groups=[]), [], torch.zeros(0, 1))  # joins, then trains
    assert out["reflection/updated"] == 1 and len(bank) == 1 and br.pending is None


def test_phase_a_lands_the_deferred_batch_before_the_steps_reward_and_reports_at_its_end():
    """D.2 / Algorithm 1 lines 9-11: at step 2, step 1's reflections reach the bank and the backbone inside the
    reward call (after the rollouts, before the task update); the step's end then has nothing left to apply."""
    br, bank = branch([ratings((1, (1, 1, 1), (1, 1, 1)), (2, (0, 0, 0), (0, 0, 0)))])
    trainer = Trainer(Engine([GOOD, GOOD.replace("town first", "town later")]))
    state = RubricEMState(bank=bank, reflection=br)
    state.attach(trainer)
    events = []

    def reward(episodes, ctx):
        events.append(("reward", ctx.step, len(bank), len(trainer.updates)))
        return [0.0] * len(episodes)

    wrapped = MetaPolicyFirst(reward, state)
    one = StepContext(step=1, groups=[0, 0])
    assert wrapped(step_episodes([QA]), one) == [0.0, 0.0]  # step 1: nothing deferred yet
    assert state.on_step_end(trainer, one, step_episodes([QA]), torch.zeros(2, 1)) == {"bank/size": 0.0}
    two = StepContext(step=2, groups=[])
    wrapped([], two)
    assert events == [("reward", 1, 0, 0), ("reward", 2, 1, 1)]  # the step-2 reward saw the bank and the update
    assert [u[2] for u in trainer.updates] == [2] and trainer.engine.refreshed == [2]
    assert bank.exact(QA.question).rubrics == "Critical: find the town first."
    end = state.on_step_end(trainer, two, [], torch.zeros(0, 1))
    assert end["reflection/bank_writes"] == 1 and end["reflection/updated"] == 1 and end["bank/size"] == 1
    assert len(trainer.updates) == 1 and br.phase_a_metrics == {}
    with pytest.raises(RuntimeError, match="attach"):
        RubricEMState(reflection=branch([])[0]).before_task_update(two)


def test_a_reflection_that_copies_the_prompts_example_is_invalid():
    # the prompt shows a worked example for another question instead of "...": a copied line is not a reflection
    from components.methods.rubricem.reflection import EXAMPLE_RUBRICS, EXAMPLE_TAKEAWAYS, POLICY_SYSTEM
    assert EXAMPLE_RUBRICS in POLICY_SYSTEM and EXAMPLE_TAKEAWAYS in POLICY_SYSTEM and "..." not in POLICY_SYSTEM
    copied_line = EXAMPLE_RUBRICS.splitlines()[1]
    bad = parse_reflection(GOOD.replace("Critical: find the town first.", f"Critical: find the town.\n  {copied_line} "))
    assert "copies a line of the prompt's example" in bad.error
    assert "<reflection_takeaways> copies" in parse_reflection(
        GOOD.replace("1. Follow the new name.", EXAMPLE_TAKEAWAYS.splitlines()[0].upper())).error
    assert parse_reflection(GOOD.replace("Critical: find the town first.", "Approach: search the bridge first.")).valid
    # as the 1.5B teacher copied it: without the full stop, renumbered; a lesson reworded for the question is kept
    lesson = EXAMPLE_TAKEAWAYS.splitlines()[0]
    assert "copies" in parse_reflection(GOOD.replace("1. Follow the new name.", "2. " + lesson[3:].rstrip("."))).error
    reworded = "1. In a chain of two hops, name each intermediate entity before searching for the next one."
    assert parse_reflection(GOOD.replace("1. Follow the new name.", reworded)).valid
