"""RubricEM through the real GRPO trainer (a tiny random Qwen2, replayed scaffold replies, scripted judges):
stage-tagged rows, stagewise scores and Lambda advantages, the reflection update on the same backbone, the
order of one step's parts against D.1-D.2 and Algorithm 1, and judge buffers plus the rubric bank saved in
and restored from a checkpoint."""

import json
import re

import numpy as np
import pytest
import torch

from components.methods.rubricem.scaffold_agent import ScaffoldAgent
from components.methods.rubricem.reflection import ReflectionJudge
from components.methods.rubricem.stagewise_judge import StagewiseJudge
from components.llm.backends.scripted import ScriptedChatModel
from components.methods.rubricem.variants import MetaPolicyFirst, ReflectionBranch, RubricEMState
from components.agents.params import AgentParams
from components.training.params import GRPOParams
from components.methods.rubricem.stage_returns import StageReturns, StagewiseReward
from components.methods.rubricem.bank import BANK_FILE, RubricBank
from components.training.grpo.agent_rollout import make_agent_rollout
from components.training.model import LoRASettings, build_policy
from components.training.engines.rollout import Generation
from components.training.tiny import CharTokenizer, tiny_qwen2
from components.training.grpo.trainer import GRPOTrainer
from tests.rubricem.test_meta_policy import GOOD, ratings
from tests.rubricem.test_scaffold import Tools
from tests.rubricem.test_stagewise_judge import GENERATION
from tests.rubricem.trajectories import TURN1, TURN2, TURN3, Q

PAPER = [[1.0, 0.4, 0.6, 0.8], [0.0, 1.0, 0.4, 0.8], [0.0, 0.0, 1.0, 0.8], [0.0, 0.0, 0.0, 1.0]]


class Tok(CharTokenizer):
    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return render_dicts(messages, add_generation_prompt)


def render_dicts(messages, add_generation_prompt):
    return "".join(f"<{m['role']}>{m['content']}</>\n" for m in messages) + ("<assistant>" if add_generation_prompt else "")


TOK = Tok("".join(chr(c) for c in range(32, 127)) + "\n")


def render(messages, add_generation_prompt):
    return render_dicts([m.model_dump() for m in messages], add_generation_prompt)


class Engine:
    """Replays the scaffold turn the conversation is at (or a reflection), cut at stop strings like a real
    engine; the trainer recomputes every log-prob from the policy itself."""

    tokenizer, pad_token_id = TOK, 0

    def generate(self, prompts, sampling):
        out = []
        for p in prompts:
            prompt = TOK.decode(p)
            reply = GOOD if "write guidance for later attempts" in prompt else (TURN1, TURN2, TURN3)[
                min(prompt.count("<tool_output>"), 2)]
            cut = min((reply.find(s) + len(s) for s in sampling.stop_strings if s in reply), default=len(reply))
            text = reply[:cut]
            for s in sampling.stop_strings:
                text = text.removesuffix(s)
            out.append(Generation(list(p), TOK.encode(reply[:cut]), [-1.0] * cut, "stop", text))
        return out

    def update_weights(self, policy, step):
        pass


class OneVector:
    def encode(self, sentences):
        return np.ones((len(sentences), 3))


def scoring():
    """Scores every rubric 2 on odd calls and 0 on even ones, so a group of two always differs."""
    counter = [0]

    def respond(messages, sampling):
        counter[0] += 1
        n = len(re.findall(r"^\d+\. \[", messages[-1].content, re.MULTILINE))
        return json.dumps({"scores": [{"index": i, "justification": "j", "score": 2 * (counter[0] % 2)}
                                      for i in range(n)]})

    return respond


def build(tmp_path, defer=False, reward=None):
    """The trainer and method state; ``reward(stagewise_reward, state)`` may wrap the reward (the variants'
    :class:`MetaPolicyFirst`)."""
    judge = StagewiseJudge(ScriptedChatModel(lambda m, s: GENERATION), ScriptedChatModel(scoring()))
    bank = RubricBank(OneVector())
    reflection = ReflectionBranch(ReflectionJudge(ScriptedChatModel(lambda m, s: ratings(
        (1, (1, 1, 1), (1, 1, 1)), (2, (0, 0, 0), (0.5, 0.5, 0.5))))), bank, candidates=2, defer=defer)
    state = RubricEMState(judge, bank, reflection, bank_dir=tmp_path / "bank", save_every=1)
    reward_fn = StagewiseReward(judge) if reward is None else reward(StagewiseReward(judge), state)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, max_positions=4096, seed=0), lora=LoRASettings(r=4, alpha=8))
    settings = AgentParams(history_format="chat", max_turns=4, max_search_calls=3, max_tokens=400)
    rollout = make_agent_rollout(lambda p: ScaffoldAgent(p, Tools(), settings, system_prompt="Use the scaffold."),
                                 TOK, render=render)
    config = GRPOParams(group_size=2, prompts_per_step=1, steps=2, checkpoint_every=2, shuffle=False, lr=1e-3)
    trainer = GRPOTrainer(policy, Engine(), reward_fn, [Q], config, rollout_fn=rollout,
                          advantage_fn=StageReturns(PAPER), method=state, checkpoint_dir=tmp_path / "ckpt",
                          pad_token_id=0)
    return trainer, state


@pytest.fixture
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.mark.usefixtures("one_thread")
def test_rubricem_trains_through_the_grpo_trainer_and_resumes(tmp_path):
    trainer, state = build(tmp_path)
    history = trainer.train(2)
    first = history[0]
    assert first["episodes"] == 2 and first["episodes/unscored"] == 0
    assert first["reward/judge/rubrics_added"] == 5 and first["reward/judge/scoring_failures"] == 0
    # one episode scored all 2s, the other all 0s: stage advantages +-1 moved the policy
    assert first["advantage/abs_mean"] == pytest.approx(1.0, abs=1e-3) and first["optimizer_steps"] == 1
    assert first["method/reflection/updated"] == 1 and first["method/bank/size"] == 1
    assert first["method/reflection/optimizer_steps"] == 1  # the second update of the step, same backbone
    assert (tmp_path / "bank" / "step_000001" / BANK_FILE).exists()
    ckpt = tmp_path / "ckpt" / "step_000002"
    assert (ckpt / "method" / "files" / BANK_FILE).exists()
    buffers = state.judge.state_dict()
    fresh, fresh_state = build(tmp_path / "other")
    assert fresh.resume(tmp_path / "ckpt") and fresh.step_count == 2
    assert fresh_state.judge.state_dict() == buffers
    assert len(fresh_state.bank) == 1 and fresh_state.bank.exact(Q.question).takeaways == "1. Follow the new name."


@pytest.mark.usefixtures("one_thread")
def test_one_steps_parts_run_in_the_order_of_d1_and_algorithm_1(tmp_path):
    """Deferred reflections, as the variants wire them (MetaPolicyFirst): at step N, after the rollouts, step
    N-1's best reflection is written to the bank and the backbone is trained on its candidates (Phase A,
    Algorithm 1 lines 9-11), then the step is scored and the task policy updated (Phase B, lines 12-29), then
    step N's candidates are sampled and their judging launched (line 27). The last batch lands at train end."""
    events = []

    def scored(inner, state):
        def reward(episodes, ctx):
            events.append(("score", ctx.step))
            return inner(episodes, ctx)
        return MetaPolicyFirst(reward, state)

    trainer, state = build(tmp_path, defer=True, reward=scored)
    rollout, update, generate, put = trainer.rollout_fn, trainer.update, state.reflection.generate, state.bank.put

    def rollout_fn(*args):
        events.append(("rollout", trainer.step_count + 1))
        return rollout(*args)

    def recorded_update(batch, advantages, **kw):
        text = TOK.decode(batch.input_ids[0][batch.attention_mask[0].bool()].tolist())
        events.append(("meta_update" if "write guidance for later attempts" in text else "task_update", kw["ctx"].step))
        return update(batch, advantages, **kw)

    def recorded_generate(trainer_, ctx, *args):
        events.append(("reflect", ctx.step))
        return generate(trainer_, ctx, *args)

    def recorded_put(*args, **kw):
        events.append(("bank_write", kw["step"]))
        return put(*args, **kw)

    trainer.rollout_fn, trainer.update = rollout_fn, recorded_update
    state.reflection.generate, state.bank.put = recorded_generate, recorded_put
    history = trainer.train(3)
    step = lambda n: [("rollout", n), ("bank_write", n), ("meta_update", n), ("score", n), ("task_update", n),
                      ("reflect", n)]
    assert events == [("rollout", 1), ("score", 1), ("task_update", 1), ("reflect", 1), *step(2), *step(3),
                      ("bank_write", 3), ("meta_update", 3)]  # on_train_end: the last step's batch
    assert history[1]["method/reflection/updated"] == 1 and history[1]["method/bank/size"] == 1
    assert history[1]["method/reflection/optimizer_steps"] == 1 and history[1]["optimizer_steps"] == 1
    assert "method/reflection/updated" not in history[0]
