"""Agent rollouts with the embedded Qwen2.5 tokenizer's own chat template (ChatML, EOS ``<|im_end|>``).

The default test needs only the tokenizer (about 10 s to read from the GGUF): replayed replies ending in
EOS must splice into exactly the ids the template gives for the whole conversation. The slow test
samples real ReAct episodes from the 0.5B policy over the embedded world's BM25 index and checks that
the trainer's recomputed log-probs equal the sampling ones on every policy token.

    python -m pytest tests/training/test_agent_rollout_qwen.py            # tokenizer only
    python -m pytest -m slow tests/training/test_agent_rollout_qwen.py -s  # real episodes, ~2 min
"""

from pathlib import Path

import pytest
import torch

from components.agents.params import AgentParams
from components.agents.react import ReActAgent
from components.schemas import Question, ToolCall
from components.training.engines.rollout import Generation, HFRolloutEngine, SamplingParams, assemble
from components.training.grpo.agent_rollout import make_agent_rollout

ROOT = Path(__file__).resolve().parents[2]
MODEL = "qwen2.5-coder-0.5b-instruct"


def _gguf() -> Path | None:
    try:
        from components.embedded.models import ensure_gguf

        return ensure_gguf(MODEL, ROOT / ".cache")
    except Exception:  # noqa: BLE001 - the [embedded] extra is not installed, or the parts are missing
        return None


@pytest.fixture(scope="module")
def tokenizer():
    path = _gguf()
    if path is None:
        pytest.skip("the embedded Qwen GGUF is not available")
    from components.embedded.models import load_hf_tokenizer

    return load_hf_tokenizer(MODEL, path.parents[1])


class Toolbox:
    def call(self, name, argument):
        return ToolCall(name=name, arguments={"query": argument}, doc_ids=["d7"],
                        observation="[1] (d7) Velmora Library: designed by Ossian Threll.")


class Replay:
    def __init__(self, tokenizer, replies):
        self.tokenizer, self.replies = tokenizer, list(replies)

    def generate(self, prompts, sampling):
        out = []
        for p in prompts:
            ids = self.tokenizer.encode(self.replies.pop(0), add_special_tokens=False) + [self.tokenizer.eos_token_id]
            out.append(Generation(list(p), ids, [0.0] * len(ids), "stop", None))
        return out


def test_spliced_chat_row_equals_the_templates_own_tokens(tokenizer):
    replies = ["Thought: I need the architect.\nAction: search[Velmora Library]",
               "Thought: It is Ossian Threll.\nAction: finish[Ossian Threll]"]
    q = Question(id="q", question="Who designed the Velmora Library?", answers=["Ossian Threll"], source="world")
    agent = lambda p: ReActAgent(p, Toolbox(), AgentParams(history_format="chat", force_answer=False))
    [sample] = make_agent_rollout(agent, tokenizer)(Replay(tokenizer, replies), [q], 1, SamplingParams())

    trajectory = sample.info["trajectory"]
    assert trajectory.final_answer == "Ossian Threll" and len(trajectory.steps) == 2
    messages = ReActAgent(None, Toolbox(), AgentParams(history_format="chat")).messages
    from components.agents.react import EpisodeState

    state = EpisodeState(q, steps=trajectory.steps)
    conversation = [m.model_dump() for m in messages(state)]  # ends with the final assistant reply
    expected = tokenizer.encode(tokenizer.apply_chat_template(conversation, tokenize=False), add_special_tokens=False)
    row = [t for s in sample.rows[0] for t in s.token_ids]
    assert row == expected[: len(row)] and tokenizer.decode(expected[len(row):]) == "\n"
    observation = tokenizer.decode(sample.rows[0][2].token_ids)
    assert observation.startswith("\n<|im_start|>user\nObservation: [1] (d7)")  # EOS was sampled, not re-added
    assert observation.endswith("<|im_start|>assistant\n")


@pytest.mark.slow
def test_real_policy_episodes_train_on_exactly_the_sampled_context(tokenizer, tmp_path):
    from components.embedded.models import load_hf_policy
    from components.retrieval.store import build_index
    from components.retrieval.tools import make_toolbox
    from components.training.model import LoRASettings, build_policy
    from components.world.generate import generate_world

    torch.set_num_threads(2)
    model, _ = load_hf_policy(MODEL, ROOT / ".cache")
    policy = build_policy(model, lora=LoRASettings(r=8, alpha=16))
    world = generate_world(0, n_people=40, n_films=15, n_cities=10, n_companies=8, distractors_per_entity=1,
                           question_mix=None, n_questions=10)
    index = build_index("bm25", world.documents, tmp_path / "index")
    toolbox = make_toolbox(index, world.documents, top_k=3, snippet_chars=200)
    settings = AgentParams(history_format="chat", max_turns=3, max_search_calls=2, max_tokens=64)
    rollout = make_agent_rollout(lambda p: ReActAgent(p, toolbox, settings), tokenizer)
    torch.manual_seed(0)
    samples = rollout(HFRolloutEngine(policy.model, tokenizer), world.questions[:1], 2, SamplingParams(temperature=1.0))

    for s in samples:
        print(s.info["finish_reason"], repr(s.info["final_answer"]), [st.action for st in s.info["trajectory"].steps])
    batch = assemble([row for s in samples for row in s.rows], pad_token_id=tokenizer.pad_token_id)
    with torch.no_grad():
        lp = policy.token_logprobs(batch.input_ids, batch.attention_mask, temperature=1.0)
    gap = (lp - batch.old_logprobs)[batch.loss_mask].abs()
    print(f"{int(batch.loss_mask.sum())} policy tokens, max |recomputed - sampled| log-prob {gap.max():.2e}")
    assert gap.max() < 1e-2 and gap.mean() < 1e-3
    for s in samples:  # one trainable turn per step, plus the forced-answer call when the budget ran out
        trajectory = s.info["trajectory"]
        forced = bool(trajectory.metadata.get("forced_answer"))
        assert sum(seg.trainable for row in s.rows for seg in row) == len(trajectory.steps) + forced
