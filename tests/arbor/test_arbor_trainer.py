"""ARBOR inside the one GRPO trainer (tiny Qwen2, scripted roles): the memory forms during step 1, shapes
step 2, lands in every checkpoint (state.json and method/files/memory.json) and comes back on resume."""

import json

import pytest
import torch

from components.methods.arbor.variants import ArborReward, ArborState
from components.methods.arbor.params import ArborParams
from components.training.params import GRPOParams
from components.methods.arbor.memory import RubricMemory
from components.training.model import LoRASettings, build_policy
from components.training.engines.rollout import HFRolloutEngine, SamplingParams
from components.training.tiny import CharTokenizer, tiny_qwen2
from components.training.grpo.trainer import GRPOTrainer, single_turn_rollout
from tests.arbor.helpers import COMMON, Q0, Q1, FakeEncoder, QualityJudge, episode, writer

TOK = CharTokenizer("abcdefgh")
ANSWERS = {"a": ["Ossian Threll", "Ossian Kestrow", "Vell", "Vell"], "b": ["Nowhere"] * 4}  # mixed, all wrong


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


def rollout(engine, prompts, group_size, sampling):
    """Tiny-model token rows, with a hand-made trajectory per episode (answer and quality by position)."""
    episodes = single_turn_rollout(engine, prompts, group_size, sampling)
    for i, e in enumerate(episodes):
        quality = 3 - i % group_size if e.prompt == "a" else (7 * i) % 4  # "a": quality follows F1
        made = episode(e.group, ANSWERS[e.prompt][i % group_size], quality=quality,
                       question=Q0 if e.prompt == "a" else Q1)
        e.prompt, e.info["trajectory"] = made.prompt, made.info["trajectory"]
    return episodes


def make(tmp_path):
    settings = ArborParams(k_consol=1)
    encoder = FakeEncoder()
    state = ArborState(RubricMemory(settings, embed=encoder.encode), writer(COMMON), settings,
                       snapshot_dir=tmp_path / "memory")
    reward = ArborReward(settings, QualityJudge(), writer(), seed=3, state=state)
    config = GRPOParams(group_size=4, prompts_per_step=2, shuffle=False, checkpoint_every=1, keep_last=1, lr=1e-2)
    torch.manual_seed(0)
    policy = build_policy(tiny_qwen2(TOK.vocab_size, seed=0), lora=LoRASettings(r=4, alpha=8))
    trainer = GRPOTrainer(policy, HFRolloutEngine(policy.model, TOK), reward, ["a", "b"], config,
                          rollout_fn=rollout, method=state, checkpoint_dir=tmp_path / "ckpt",
                          sampling=SamplingParams(max_new_tokens=3, temperature=1.0))
    return trainer, state


def test_memory_forms_shapes_checkpoints_and_resumes(tmp_path):
    trainer, state = make(tmp_path)
    first, second = trainer.train(2)
    assert first["reward/rubric/active"] == 0 and first["method/memory/common"] == 1
    assert first["reward/zero_var/base/all_wrong"] == 0.5 and first["reward/zero_var/total/all_wrong"] == 0.5
    assert second["reward/rubric/active"] == 1 and second["reward/zero_var/total/all_wrong"] == 0.0
    assert second["reward/zero_var/rescued_fraction"] == 1.0 and second["method/activations"] == 2
    assert second["reward/judge/calls_per_group"] > 0 and second["reward/std"] > 0
    files = tmp_path / "ckpt" / "step_000002" / "method"
    saved = json.loads((files / "files" / "memory.json").read_text())
    assert saved == json.loads(json.dumps(state.state_dict())) and saved["common"][0]["uses"] == 2
    # step 2's draft was consolidated into a copy of the rubric already in P: de-duplicated, nothing changed
    assert second["method/consolidation_duplicates"] == 1 and second["method/memory_changed"] == 0
    assert sorted(p.name for p in (tmp_path / "memory").iterdir()) == ["step_00001.json"]

    resumed, resumed_state = make(tmp_path)
    assert resumed.resume() and resumed.step_count == 2
    assert resumed_state.state_dict() == state.state_dict()
    assert [r.id for r in resumed_state.memory.choose_active()] == [r.id for r in state.memory.choose_active()]
