"""RubricEM's scaffold as a lab protocol: compact scaffold episodes parse back through the unchanged scaffold agent
to the oracle's answer within the lab's scaffold turn budget, only their replies are trained, the stage judge scores
each of their stages (none of a ReAct episode's), and ``lab.sft_protocols`` at ReAct alone gives the ReAct corpus and
tokenizer."""

from __future__ import annotations

import asyncio

import pytest

from components.judges.render import scaffold_text
from components.lab.judges import stage_rubrics, stage_score
from components.lab.nano import fit_tokenizer
from components.lab.policy import lab_protocols, sft_corpus
from components.lab.scaffold import TAGS
from components.lab.world import build_lab_world, compact_episodes, sft_rows
from components.llm.backends.simulated import Dial, Oracle, SimulatedJudge
from components.methods.rubricem.scaffold_format import STAGES, parse_scaffold_turn, split_stages
from components.methods.rubricem.stagewise_judge import StagewiseJudge, render_attempt
from components.params_load import load_params
from tests.lab.test_nano import TINY


@pytest.fixture(scope="module")
def params():
    return load_params("params.yaml", overlays=["lab"], overrides=TINY)


@pytest.fixture(scope="module")
def world(params):
    return build_lab_world(params, params.seed + 1, 12)


@pytest.fixture(scope="module")
def episodes(params, world):
    found, skipped = compact_episodes(world, world.questions, params.agent, lab_protocols(params.methods)["scaffold"])
    assert len(found) + skipped["skipped"] == 12 and len(found) >= 10
    return found


def test_scaffold_episodes_parse_back_to_the_oracle_answer_stage_by_stage(params, episodes):
    for traj, q in episodes:
        assert traj.final_answer in q.answers and traj.finish_reason == "answer"
        assert [s.stage for s in traj.steps][0] == "research" and traj.steps[-1].stage == "answer"
        for step in traj.steps:
            assert parse_scaffold_turn(step.raw).text == step.action
        blocks = split_stages(scaffold_text(traj)).blocks
        assert all(blocks[name] for name in STAGES), blocks  # plan, research, review and answer all present
        assert f"> {traj.steps[0].tool_call.arguments['query']} <" in traj.steps[0].raw  # the name set off by spaces


def test_only_the_replies_are_trained_each_within_the_scaffold_turn_budget(params, world, episodes):
    protocol = lab_protocols(params.methods)["scaffold"]
    rows = sft_rows(episodes, params.agent, protocol)
    texts = ["".join(t for t, _ in row) for row in rows]
    tok = fit_tokenizer(texts + [d.text for d in world.world.documents], 4096, TAGS)  # the lab's vocabulary size
    assert all(len(tok.encode(tag)) == 1 for tag in TAGS)
    prompt = params.methods["sft_scaffold"].options["system_prompt"]
    for row in rows:
        assert row[0][0].startswith(f"<|system|>{prompt}<|end|>") and not row[0][1]
        trained = [text for text, trainable in row if trainable]
        assert len(trained) == sum(1 for _ in filter(lambda p: p[1], row)) >= 2
        assert all(t.startswith("<think>") and t.endswith(("</call_tool><|end|>\n", "</answer><|end|>\n"))
                   for t in trained)
        assert not any("<tool_output>" in t for t in trained)
        assert all("<tool_output>" in t for t, trainable in row[2::2] if not trainable)
        # generation stops at the closing tag (a stop string): the reply up to it fits the variants' budget
        assert max(len(tok.encode(t.removesuffix("<|end|>\n"))) for t in trained) <= params.rubricem.scaffold_max_tokens


def test_the_stage_judge_scores_a_scaffold_episode_in_every_stage_and_a_react_one_in_none(params, world, episodes):
    traj, q = next((t, q) for t, q in episodes if len(q.gold_chain) >= 2)
    react, _ = compact_episodes(world, [q], params.agent)
    trajs = [traj, react[0][0]]
    blocks = [split_stages(scaffold_text(t)).blocks for t in trajs]
    # the simulated judge's own rubrics: each quality met in its own stage (2), neither flaw shown (0)
    attempt = render_attempt(blocks[0], 10_000)
    assert [stage_score(q, k, f"{t}: {d}", attempt) for k, t, d, negative in stage_rubrics(q)] == [
        0 if negative else 2 for *_, negative in stage_rubrics(q)]
    judge = StagewiseJudge(generator=SimulatedJudge(Oracle(world.questions), Dial()),
                           evaluator=SimulatedJudge(Oracle(world.questions), Dial()))
    drafts, why = asyncio.run(judge.generate(q, trajs, blocks))
    assert why is None and judge.admit(q, drafts, step=0) > 0
    rubrics = judge.buffer(q).rubrics()
    scaffold, plain = (asyncio.run(judge.score(q, t, b, rubrics)) for t, b in zip(trajs, blocks))
    assert scaffold.scores[1:3] == [1.0, 1.0]  # research and review: every separating rubric met in its stage
    assert plain.scores[1:3] == [0.0, 0.0]  # ReAct turns have no research or review stage to score


def test_react_only_is_todays_corpus_and_tokenizer(params):
    react = sft_corpus(params)
    both = sft_corpus(load_params("params.yaml", overlays=["lab"],
                                  overrides=[*TINY, "lab.sft_protocols=[react,scaffold]"]))
    assert params.lab.sft_protocols == ["react"] and react.tags == ()
    assert both.rows[:len(react.rows)] == react.rows and len(both.rows) == 2 * len(react.rows)
    assert not any("<think>" in text for row in react.rows for text, _ in row)
    assert all(row[1][0].startswith("<think>") for row in both.rows[len(react.rows):])
    assert both.documents == react.documents and both.tags == TAGS
    texts = ["".join(t for t, _ in row) for row in react.rows] + react.documents
    assert fit_tokenizer(texts, 400, react.tags).get_vocab() == fit_tokenizer(texts, 400).get_vocab()
