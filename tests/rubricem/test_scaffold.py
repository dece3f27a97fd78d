"""The Plan/Research/Review/Answer scaffold: stage splitting of hand-made trajectories (malformed ones too),
the agent on the ReAct seams, stage-tagged token segments, the validator and the SFT rejection reasons
(B.2.3's consecutive tool errors among them)."""

import asyncio
import re

import pytest

from components.agents.react import AGENTS
from components.methods.rubricem.scaffold_agent import BUDGET, REMINDER, ScaffoldAgent
from components.methods.rubricem.scaffold_format import (
    ANSWER,
    PLAN,
    RESEARCH,
    REVIEW,
    SCAFFOLD_REASONS,
    complete_reply,
    consecutive_tool_errors,
    parse_scaffold_turn,
    scaffold_problems,
    split_stages,
    stage_spans,
    validate_scaffold,
)
from components.judges.render import clip_tool_outputs, scaffold_text
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import Message, TransientLLMError
from components.agents.params import AgentParams
from components.schemas import Step, ToolCall, Trajectory
from components.training.grpo.agent_rollout import make_agent_rollout
from components.training.engines.rollout import Generation
from components.training.tiny import CharTokenizer
from components.warmstart.rejection import REASONS, select
from tests.rubricem.trajectories import (
    DOCS,
    OBS,
    PLAN_TEXT,
    REVIEW_TEXT,
    TURN1,
    TURN2,
    TURN3,
    Q,
    hand_trajectory,
)


class Tools:
    def call(self, name, argument):
        text = {"Ossian Threll": "born in Kestrow", "Kestrow": "on the river Ammel"}.get(argument, "nothing")
        return ToolCall(name=name, arguments={"query": argument}, observation=f"[1] (d-{argument}) {argument}: {text}",
                        doc_ids=[f"d-{argument}"])


def run(replies, guidance=None, **settings):
    policy = ScriptedChatModel(replies)
    agent = ScaffoldAgent(policy, Tools(), AgentParams(**{"max_turns": 6, "max_search_calls": 3, **settings}),
                          guidance=guidance)
    return asyncio.run(agent.run(Q)), policy


def test_well_formed_episode_splits_into_the_four_stages():
    # the engines cut the stop string, so replies arrive without their closing tag
    traj, policy = run([TURN1.removesuffix("</call_tool>"), TURN2.removesuffix("</call_tool>"),
                        TURN3.removesuffix("</answer>")])
    assert traj.finish_reason == "answer" and traj.final_answer == "Ammel"
    assert [s.action for s in traj.steps] == ["search[Ossian Threll]", "search[Kestrow]", "finish[Ammel]"]
    assert [s.stage for s in traj.steps] == ["research", "research", "answer"]
    assert traj.steps[0].raw == TURN1  # closing tag restored
    text = scaffold_text(traj)
    split = split_stages(text)
    assert split.blocks["plan"] == PLAN_TEXT
    research = split.blocks["research"]
    assert research.startswith('\n<call_tool name="search">Ossian Threll') and research.endswith("</tool_output>\n")
    assert "on the river Ammel" in research and TURN2 in research
    assert split.blocks["review"] == REVIEW_TEXT and split.blocks["answer"] == "<answer>Ammel</answer>"
    assert validate_scaffold(traj) == [] and scaffold_problems(traj) == []
    # each reply was tagged with its own stage spans; read in sequence they give the whole-text split
    first = policy.requests[0][0]
    assert first[0].role == "system" and "<structured_plan>" in first[0].content
    assert "Question: Which river" in first[1].content


def test_clipping_tool_outputs_cuts_only_the_observations_and_keeps_the_stages():
    traj, _ = run([TURN1, TURN2, TURN3])
    text = scaffold_text(traj)
    clipped = clip_tool_outputs(text, 20)
    assert clip_tool_outputs(text, None) == text and clip_tool_outputs(text, 10_000) == text
    outputs = re.findall(r"<tool_output>\n(.*?)\n</tool_output>", clipped, re.DOTALL)
    whole = re.findall(r"<tool_output>\n(.*?)\n</tool_output>", text, re.DOTALL)
    assert len(outputs) == len(whole) == 2
    for cut, full in zip(outputs, whole, strict=True):
        assert cut == full[:20].rstrip() + " [...]"
    # everything the policy wrote is still there, so the stage split is unchanged outside the research block
    assert re.sub(r"<tool_output>.*?</tool_output>", "", clipped, flags=re.DOTALL) == re.sub(
        r"<tool_output>.*?</tool_output>", "", text, flags=re.DOTALL)
    assert split_stages(clipped).blocks["plan"] == split_stages(text).blocks["plan"]


def test_reply_spans_compose_into_the_trajectory_split():
    stage = PLAN
    for reply, expected in [(TURN1, [(0, PLAN), (len(PLAN_TEXT), RESEARCH)]), (TURN2, [(0, RESEARCH)]),
                            (TURN3, [(0, REVIEW), (len(REVIEW_TEXT), ANSWER)])]:
        spans = stage_spans(reply, stage)
        assert spans == expected
        stage = spans[-1][1]


@pytest.mark.parametrize("name, text, expected", [
    ("plan never closed: ends where the first tool call starts",
     ('<think>x</think><structured_plan><rubric>r</rubric><call_tool name="search">A</call_tool>'
      "<tool_output>o</tool_output><answer>A</answer>"),
     {"plan": "<think>x</think><structured_plan><rubric>r</rubric>", "review": None, "answer": "<answer>A</answer>"}),
    ("answer with no review: the review stage is absent",
     PLAN_TEXT + '<call_tool name="search">A</call_tool><tool_output>o</tool_output><think>t</think><answer>A</answer>',
     {"plan": PLAN_TEXT, "review": None, "answer": "<answer>A</answer>"}),
    ("review without a preceding think starts at <review>",
     PLAN_TEXT + '<call_tool name="search">A</call_tool><tool_output><think>noise</think></tool_output>'
     "<review>r</review><answer>A</answer>",
     {"review": "<review>r</review>", "answer": "<answer>A</answer>"}),
    ("no tags at all: everything is plan",
     "I think the answer is Ammel.", {"plan": "I think the answer is Ammel.", "research": None, "answer": None}),
    ("a revised plan inside research stays research",
     PLAN_TEXT + '<call_tool name="search">A</call_tool><tool_output>o</tool_output><structured_plan>new'
     '</structured_plan><call_tool name="search">B</call_tool>',
     {"plan": PLAN_TEXT, "review": None, "answer": None}),
])
def test_malformed_trajectories_split_best_effort(name, text, expected):
    blocks = split_stages(text).blocks
    for stage, block in expected.items():
        assert blocks[stage] == block, name
    assert "".join(b for b in blocks.values() if b is not None) == text  # the blocks tile the text


def test_turn_parser():
    assert parse_scaffold_turn('<call_tool name="browse"> d-7 </call_tool>').text == "browse[d-7]"
    assert parse_scaffold_turn('x <answer><cite id="d1">\\boxed{1987}</cite></answer>').argument == "1987"
    assert parse_scaffold_turn('<call_tool name="google">x</call_tool>').error.startswith("unknown tool")
    assert parse_scaffold_turn("<answer>answer</answer>").kind == "invalid"
    assert parse_scaffold_turn("<think>just thinking</think>").error.startswith("no <call_tool>")
    assert complete_reply('<call_tool name="search">Kestrow') == '<call_tool name="search">Kestrow</call_tool>'
    assert complete_reply("<answer>Ammel  ") == "<answer>Ammel</answer>"
    assert complete_reply(TURN1) == TURN1


def test_invalid_turn_gets_the_scaffold_reminder_and_budget_message():
    traj, _ = run([TURN1, "no tags", TURN2, TURN2.replace("Kestrow</call", "Elsewhere</call"), TURN3],
                       max_search_calls=2)
    assert traj.steps[1].parse_error and traj.steps[1].observation == REMINDER
    assert traj.steps[3].observation == BUDGET and traj.steps[3].tool_call is None
    assert traj.final_answer == "Ammel"
    issues = validate_scaffold(traj)
    assert ("tool_syntax", "step 1: 0 <call_tool> tags (0 well-formed); exactly one is required") in issues


@pytest.mark.parametrize("raws, answer, reason, detail", [
    ([TURN1.replace("<rubric>", "<rubrik>"), TURN2, TURN3], "Ammel", "stage_boundary", "plan stage: missing <rubric>"),
    ([TURN1, TURN2.replace("<state_evaluation>", "<evaluation>").replace("</state_evaluation>", "</evaluation>"),
      TURN3], "Ammel", "stage_boundary", "step 1: no <state_evaluation>"),
    ([TURN1, TURN2, TURN3.replace("<writing_plan>Answer Ammel.</writing_plan>", "")], "Ammel", "stage_boundary",
     "missing <writing_plan>"),
    ([PLAN_TEXT + "<answer>Ammel</answer>"], "Ammel", "stage_boundary", "answered in the first reply"),
    ([TURN1, TURN2 + '<call_tool name="search">x</call_tool>', TURN3], "Ammel", "tool_syntax", "exactly one"),
    ([TURN1, TURN2.replace('name="search"', 'name="google_search"'), TURN3], "Ammel", "tool_syntax", "bad call"),
    ([TURN1 + "<tool_output>made up</tool_output>", TURN2, TURN3], "Ammel", "tool_syntax", "wrote a <tool_output>"),
    ([TURN1, TURN2, TURN3.replace("d-Kestrow", "d-99")], "Ammel", "citation", "cites d-99, which no tool returned"),
    ([TURN1, TURN2, TURN3.replace('<cite id="d-Kestrow">the Ammel</cite>', '<cite id="">the Ammel</cite>')], "Ammel",
     "citation", "empty citation"),
    ([TURN1, TURN2, TURN3.replace("Ammel", "Danube")], "Danube", "grounding", "'Danube' is in no tool output"),
    ([TURN1, TURN2], None, "stage_boundary", "never reaches the <answer> stage"),
])
def test_rejection_reasons(raws, answer, reason, detail):
    traj = hand_trajectory(raws, OBS[: len(raws) - 1] + [""] if answer else OBS[: len(raws)], answer, DOCS)
    found = scaffold_problems(traj)
    assert any(r == reason and detail in d for r, d in found), found
    good = hand_trajectory([TURN1, TURN2, TURN3], OBS, "Ammel", DOCS)
    assert scaffold_problems(good) == []


def test_forced_answer_is_recorded_and_policy_failure_ends_the_episode():
    traj, policy = run([TURN1, TURN2, TURN3.removesuffix("</answer>")], max_turns=2)
    assert traj.finish_reason == "max_turns" and traj.final_answer == "Ammel"
    assert traj.steps[-1].stage == "answer" and traj.steps[-1].final_answer == "Ammel"
    assert "no lookups left" in policy.requests[-1][0][-1].content
    assert split_stages(scaffold_text(traj)).blocks["review"] == REVIEW_TEXT
    failed, _ = run([TURN1, TransientLLMError("down")])
    assert failed.finish_reason == "llm_failure" and len(failed.steps) == 1


def test_guidance_block_precedes_the_question_and_is_recorded():
    def guidance(question):
        return "<reference_examples>lesson</reference_examples>", {"mode": "within", "hit": True}

    traj, policy = run([TURN1, TURN2, TURN3], guidance=guidance, history_format="chat")
    first_user = policy.requests[0][0][1].content
    assert first_user.startswith("<reference_examples>lesson</reference_examples>\n\nQuestion: Which river")
    assert traj.metadata["retrieval"] == {"mode": "within", "hit": True}
    later = policy.requests[1][0]
    assert [m.role for m in later] == ["system", "user", "assistant", "user"]
    assert later[-1].content.startswith("<tool_output>") and "born in Kestrow" in later[-1].content


# -------------------------------------------------------------------- stage tags on trained tokens

TOK = CharTokenizer("".join(chr(c) for c in range(32, 127)) + "\n")


def render(messages: list[Message], add_generation_prompt: bool) -> str:
    return "".join(f"<{m.role}>{m.content}</>\n" for m in messages) + ("<assistant>" if add_generation_prompt else "")


class ReplayEngine:
    """Replies in order; like the real engines, the ids keep the stop string and the text drops it."""

    def __init__(self, replies):
        self.replies = list(replies)

    def generate(self, prompts, sampling):
        out = []
        for p in prompts:
            reply = self.replies.pop(0)
            cut = min((reply.find(s) + len(s) for s in sampling.stop_strings if s in reply), default=len(reply))
            ids = TOK.encode(reply[:cut])
            text = reply[:cut]
            for s in sampling.stop_strings:
                text = text.removesuffix(s)
            out.append(Generation(list(p), ids, [-0.5] * len(ids), "stop", text))
        return out


@pytest.mark.parametrize("history_format", ["chat", "scratchpad"])
def test_stage_k_tokens_carry_segment_id_k(history_format):
    settings = AgentParams(history_format=history_format, max_turns=4, max_search_calls=3, max_tokens=400)
    rollout = make_agent_rollout(lambda p: AGENTS.get("scaffold")(p, Tools(), settings), TOK, render=render)
    from components.training.engines.rollout import SamplingParams

    (episode,) = rollout(ReplayEngine([TURN1, TURN2, TURN3]), [Q], 1, SamplingParams())
    trained = [(s.segment_id, TOK.decode(s.token_ids)) for row in episode.rows for s in row if s.trainable]
    by_stage: dict[int, str] = {}
    for seg, text in trained:
        by_stage[seg] = by_stage.get(seg, "") + text
    assert by_stage == {0: PLAN_TEXT, 1: '\n<call_tool name="search">Ossian Threll</call_tool>' + TURN2,
                        2: REVIEW_TEXT, 3: "<answer>Ammel</answer>"}
    observations = [TOK.decode(s.token_ids) for row in episode.rows for s in row if not s.trainable]
    assert any("<tool_output>" in o and "born in Kestrow" in o for o in observations)


# -------------------------------------------------------------------- B.2.3: consecutive tool errors

FAILED = ('<think>Open the page for more.</think>\n<state_evaluation>Town settled (d-Ossian Threll). River open.'
          '</state_evaluation>\n<call_tool name="browse">{doc}</call_tool>')


def tool_error_episode(pattern):
    """A scaffold episode from ``pattern``: ``ok`` turns are TURN1 then TURN2 (their searches work), ``err``
    turns browse an id the corpus lacks (the toolbox marks the call as an error), and TURN3 answers."""
    steps, good = [], iter([(TURN1, "Ossian Threll", OBS[0]), (TURN2, "Kestrow", OBS[1])])
    for i, kind in enumerate(pattern):
        if kind == "ok":
            raw, query, obs = next(good)
            call = ToolCall(name="search", arguments={"query": query}, observation=obs)
        else:
            doc = f"d-40{i}"
            raw, obs = FAILED.format(doc=doc), f"Error: no document with id {doc!r}."
            call = ToolCall(name="browse", arguments={"doc_id": doc}, observation=obs,
                            error=f"unknown document id {doc!r}")
        steps.append(Step(index=i, raw=raw, observation=obs, tool_call=call))
    steps.append(Step(index=len(steps), raw=TURN3, final_answer="Ammel"))
    return Trajectory(question_id=Q.id, question=Q.question, steps=steps, final_answer="Ammel", docs_seen=DOCS)


@pytest.mark.parametrize("pattern, rejected", [
    (["ok", "ok"], False),
    (["ok", "err", "ok"], False),                 # one failed round, then a recovery: kept (B.2.3)
    (["ok", "err", "ok", "err"], False),          # two failed rounds, never in a row: kept
    (["ok", "err", "err", "ok"], True),           # two in a row: rejected, even though the episode recovers
    (["ok", "err", "err", "err", "ok"], True),
])
def test_two_or_more_consecutive_tool_errors_reject_a_scaffold_episode(pattern, rejected):
    traj = tool_error_episode(pattern)
    assert [s.tool_call.error is not None for s in traj.steps[:-1]] == [k == "err" for k in pattern]
    found = scaffold_problems(traj)
    assert [r for r, _ in found] == (["tool_errors"] if rejected else [])
    kept, dropped = select([(traj, Q, "teacher")], min_f1=1.0, agent="scaffold")
    assert (len(kept), len(dropped)) == ((0, 1) if rejected else (1, 0))
    if rejected:
        assert dropped[0].reason == "tool_errors" and dropped[0].reasons == ["tool_errors"]
        run = [str(i) for i, k in enumerate(pattern) if k == "err"]
        assert f"steps {', '.join(run)}: {len(run)} tool errors in a row" in dropped[0].detail


def test_a_turn_without_a_call_does_not_break_a_run_of_tool_errors():
    traj = tool_error_episode(["ok", "err", "err", "ok"])
    unread = Step(index=2, raw="<think>Hmm.</think>", parse_error="no <call_tool> and no <answer>",
                  observation="Write a <call_tool> or an <answer>.")
    steps = [*traj.steps[:2], unread, *[s.model_copy(update={"index": s.index + 1}) for s in traj.steps[2:]]]
    found = consecutive_tool_errors(traj.model_copy(update={"steps": steps}))
    assert found == [("tool_errors", "steps 1, 3: 2 tool errors in a row (first: unknown document id 'd-401')")]


def test_the_tool_error_reason_sits_with_the_scaffold_reasons():
    assert REASONS.index("citation") + 1 == REASONS.index("tool_errors") == REASONS.index("repeated_call") - 1
    assert SCAFFOLD_REASONS.index("tool_errors") < SCAFFOLD_REASONS.index("grounding")
