"""Tiny, scripted pieces for the ARCO tests: a character tokenizer with a chat template, a world-style question
with a two-hop gold chain, fake tools, a policy engine that replays a good or a bad path, mu's scripted writer
and a scripted teacher."""

from __future__ import annotations

import json
import re

from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import TransientLLMError
from components.schemas import Question, Step, SubQuestion, ToolCall, Trajectory
from components.training.engines.rollout import Generation
from components.training.tiny import CharTokenizer


class Tok(CharTokenizer):
    def apply_chat_template(self, messages, tokenize=False, add_generation_prompt=True):
        return render_dicts(messages, add_generation_prompt)


def render_dicts(messages, add_generation_prompt):
    return "".join(f"<{m['role']}>{m['content']}</>\n" for m in messages) + ("<assistant>" if add_generation_prompt else "")


def render(messages, add_generation_prompt):
    return render_dicts([m.model_dump() for m in messages], add_generation_prompt)


TOK = Tok("".join(chr(c) for c in range(32, 127)) + "\n")

Q = Question(id="wq-1", question="Which river flows through the home town of Ossian Threll?", answers=["Ammel"],
             source="world", type="bridge",
             gold_chain=[SubQuestion(question="Where was Ossian Threll born?", answer="Kestrow", doc_id="d-Ossian Threll"),
                         SubQuestion(question="Which river flows through Kestrow?", answer="Ammel", doc_id="d-Kestrow")],
             metadata={"hop_titles": ["Ossian Threll", "Kestrow"]})

GOOD = ["Thought: first the person.\nAction: search[Ossian Threll]", "Thought: now the town.\nAction: search[Kestrow]",
        "Thought: done.\nAction: finish[Ammel]"]
BAD = ["Thought: guess.\nAction: search[Velmora]", "Thought: again.\nAction: search[Torvel]",
       "Thought: give up.\nAction: finish[Nowhere]"]


class Tools:
    def call(self, name, argument):
        return ToolCall(name=name, arguments={"query": argument}, observation=f"[1] (d-{argument}) {argument}: text",
                        doc_ids=[f"d-{argument}"])


class PolicyEngine:
    """Replays the good path for the first episode of each batch and the bad path for the others (then keeps
    each episode on its path by what its prompt already shows); the trainer recomputes every log-prob."""

    tokenizer, pad_token_id = TOK, 0

    def generate(self, prompts, sampling):
        out = []
        for n, p in enumerate(prompts):
            prompt = TOK.decode(p)
            turn = prompt.count("Observation:")
            bad = "Velmora" in prompt or (turn == 0 and n % 2 == 1)
            reply = (BAD if bad else GOOD)[min(turn, 2)]
            out.append(Generation(list(p), TOK.encode(reply), [-1.0] * len(reply), "stop", reply))
        return out

    def update_weights(self, policy, step):
        pass


CRITERIA = "1. Looks up the next name\n2. Reuses what was found\n3. Answers when the facts are in"


class MuWriter:
    """mu's scripted generation: three numbered criteria (plus EOS); ``junk_for`` prompts get an unreadable reply."""

    def __init__(self, junk_for: str | None = None):
        self.junk_for, self.calls = junk_for, 0
        self.published: list[tuple[int, str, dict]] = []  # (step, the model's active adapter, its weights)
        self.closed = False

    def update_weights(self, policy, step):
        from peft import get_peft_model_state_dict

        active = policy.model.active_adapter
        weights = {k: v.detach().clone() for k, v in get_peft_model_state_dict(policy.model, adapter_name=active).items()}
        self.published.append((step, active, weights))

    def close(self):
        self.closed = True

    def generate(self, prompts, sampling):
        self.calls += 1
        out = []
        for p in prompts:
            text = "no criteria here" if self.junk_for and self.junk_for in TOK.decode(p) else CRITERIA
            out.append(Generation(list(p), TOK.encode(text) + [TOK.eos_token_id], None, "stop", text))
        return out


def teacher(fail_on: str | None = None) -> ScriptedChatModel:
    """Writes 3 criteria per step; fails (a transient error) on trajectories whose text contains ``fail_on``."""

    def respond(messages, sampling):
        text = messages[-1].content
        if fail_on and fail_on in text:
            return TransientLLMError("teacher down")
        n = int(re.search(r"for each of the (\d+) steps", text).group(1))
        return json.dumps({"steps": [{"step": t + 1, "criteria": [f"step {t + 1} criterion {j + 1}" for j in range(3)]}
                                     for t in range(n)]})

    return ScriptedChatModel(respond, name="teacher")


def trajectory(replies=GOOD, answer="Ammel", forced=False) -> Trajectory:
    steps = []
    for i, r in enumerate(replies):
        action = r.split("Action: ")[1]
        if action.startswith("finish"):
            steps.append(Step(index=i, raw=r, thought="t", action=action, final_answer=action[7:-1]))
        else:
            arg = action[7:-1]
            call = ToolCall(name="search", arguments={"query": arg}, observation=f"{arg}: text", doc_ids=[f"d-{arg}"])
            steps.append(Step(index=i, raw=r, thought="t", action=action, tool_call=call, observation=call.observation))
    return Trajectory(question_id=Q.id, question=Q.question, steps=steps, final_answer=answer,
                      finish_reason="max_turns" if forced else "answer",
                      metadata={"forced_answer": True} if forced else {})
