"""Fault injection (issue 48): every judgment of the four methods and the answer judge, asked through the
``openai`` backend and the real reliability middleware of a loopback server that fails 30% of the calls
(:mod:`tests.reliability.faults`: 429, 500, timeouts, truncated / malformed / empty bodies, answers out of range or
of the wrong length, empty or cut-off answers).

For each judge, with small scripted inputs and one group whose every call fails:

- it completes (no exception leaves the judge);
- transient failures are retried: the middleware's retries equal the attempts the server saw after each call's
  first;
- calls that still fail are recorded with their kind: the judge's own record of failures (its tally, invalid votes,
  errors) equals, kind by kind where it keeps kinds, the calls whose last attempt the server failed: no record is
  lost;
- no failed call becomes a score: every sample is either what the same judge says over an honest model (the same
  inputs, no faults) or the judge's "no score" value (None, an invalid vote, a failure), never a 0 or any other
  number in its place, and the number of unscored samples follows from the failed calls;
- the documented fallback of a group whose judging failed entirely holds; a failed verification never counts as
  a pass.

``pytest -s tests/reliability/test_fault_injection.py`` prints the fault table.
"""

from __future__ import annotations

import asyncio
import json
import re
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field

import pytest

from components.evaluation.metrics import normalize_answer
from components.judges.answer import judge_answers
from components.judges.call import Tally
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import ChatModel
from components.methods.arbor.contrast import InductionPlan
from components.methods.arbor.induction import consolidate, induce
from components.methods.arbor.memory import Draft, RubricText
from components.methods.arbor.pairwise_graph import edge_scores, sparse_graph
from components.methods.arbor.pairwise_judge import score_group
from components.methods.arbor.rar import rate, write_checklist
from components.methods.arco.criteria import annotate, trajectory_steps
from components.methods.coreact.council import judge_slate
from components.methods.coreact.generator_reward import RubricReward
from components.methods.coreact.params import RubricGeneratorParams
from components.methods.coreact.rubric_eval import evaluate_actions, evaluate_criteria, evaluate_slate
from components.methods.coreact.verifier import verify_action
from components.methods.rubricem.reflection import Reflection, ReflectionJudge
from components.methods.rubricem.stagewise_judge import StagewiseJudge
from components.schemas import (
    BranchingPoint,
    Candidate,
    Criterion,
    Question,
    Rubric,
    Step,
    ToolCall,
    Trajectory,
)
from components.training.grpo.episodes import Episode, StepContext
from tests.reliability.faults import ANSWER, DOOMED, KINDS, FaultServer, Judge
from tests.rubricem.trajectories import episode_trajectory

RATE, SEED = 0.3, 48
ROWS: list[Row] = []


@dataclass
class Row:
    """One judge's line of the fault table."""

    judge: str
    server: FaultServer
    samples: int
    affected: int
    outcome: str
    recorded: dict[str, int] = field(default_factory=dict)  # failures the judge recorded, by kind when it keeps them

    @property
    def lost(self) -> int:
        return sum(self.server.failed_calls().values()) - sum(self.recorded.values())


@pytest.fixture(scope="module", autouse=True)
def fault_table():
    yield
    if not ROWS:
        return
    short = {"http_429": "429", "http_500": "500", "timeout": "timeout", "truncated_body": "cut body",
             "malformed_body": "bad body", "empty_body": "empty body", "out_of_range": "out of range",
             "wrong_length": "wrong len", "empty_answer": "empty ans", "truncated_answer": "cut ans",
             "doomed": "doomed 500"}
    head = ["judge", *short.values(), "calls", "retried", "failed (call/unparsed)", "samples affected", "outcome",
            "records lost"]
    lines = ["| " + " | ".join(head) + " |", "|" + "---|" * len(head)]
    for r in ROWS:
        injected, failed = r.server.injected(), r.server.failed_calls()
        cells = [r.judge, *(str(injected.get(k, 0)) for k in short), str(len(r.server.attempts)),
                 str(r.server.retries()), f"{failed['call_failed']}/{failed['unparsed']}",
                 f"{r.affected}/{r.samples}", r.outcome, str(r.lost)]
        lines.append("| " + " | ".join(cells) + " |")
    print(f"\n\nFault table: {RATE:.0%} of calls faulted (seed {SEED}), middleware max_attempts 4\n" + "\n".join(lines))


def check(row: Row, by_kind: bool = True) -> None:
    """What every judge must show: faults happened and were retried, every failed call is on record, none lost."""
    server = row.server
    assert server.injected(), "no fault was injected"
    assert server.retries() == server.retried_attempts() > 0  # the middleware counted every retry
    failed = server.failed_calls()
    if by_kind:
        assert row.recorded == failed, (row.recorded, failed)
    assert row.lost == 0, f"{row.judge}: {row.lost} failed calls were not recorded"
    ROWS.append(row)


def run(server: FaultServer, make: Callable) -> object:
    async def main():
        try:
            return await make()
        finally:
            await server.aclose()

    return asyncio.run(main())


def honest(judge: Judge) -> ChatModel:
    """The same judge without faults, in process: what each sample is worth when its call succeeds."""
    return ScriptedChatModel(lambda messages, sampling: judge.good([m.model_dump() for m in messages]), name="honest")


def user_of(messages: list[dict]) -> str:
    return messages[-1]["content"]


def doomed(text: str) -> str:
    return f"{DOOMED}: {text}"


# ------------------------------------------------------------------------------------------ the answer judge


def answer_good(messages):
    text = user_of(messages)
    refs = re.search(r"Reference answers: (.*)", text).group(1).split(" | ")
    prediction = re.search(r"Predicted answer: (.*)", text).group(1)
    return json.dumps({"correct": any(normalize_answer(r) in normalize_answer(prediction) for r in refs)})


ANSWER_JUDGE = Judge(answer_good, lambda kind, m, good: '{"correct": "maybe"}' if kind == "out_of_range"
                     else '{"correct": [true, false]}')


def test_answer_judge():
    questions = [Question(id=f"q{i}", question=f"Who founded company {i}?", answers=[f"Founder {i}"], source="world")
                 for i in range(30)]
    questions.append(Question(id="qd", question=doomed("who?"), answers=["Ada"], source="world"))
    predictions = [f"it was Founder {i} himself" if i % 2 == 0 else f"someone named Other {i}" for i in range(30)]
    predictions.append("Ada Lovelace")
    truth = [i % 2 == 0 for i in range(30)] + [True]
    with FaultServer(ANSWER_JUDGE, rate=RATE, seed=SEED) as server:
        tally = Tally()
        verdicts = run(server, lambda: judge_answers(server.model("answer_judge"), questions, predictions, tally))
    assert all(v is None or v == t for v, t in zip(verdicts, truth, strict=True))  # no failure became a verdict
    assert verdicts[-1] is None  # the doomed question is unjudged (left out of the accuracy), not wrong
    assert sum(v is None for v in verdicts) == sum(server.failed_calls().values())
    check(Row("answer judge", server, len(verdicts), sum(v is None for v in verdicts),
              "completed; unjudged left out of accuracy", tally.by_kind()))


# ------------------------------------------------------------------------------------------ Co-ReAct


def council_good(messages):
    shown = re.findall(r"^\[([A-Z])\] (.*)$", user_of(messages), re.MULTILINE)
    return json.dumps({"rationale": "by name", "ranking": [label for label, _ in sorted(shown, key=lambda s: s[1])]})


def council_bad(kind, messages, good):
    reply = json.loads(good)
    reply["ranking"] = reply["ranking"][:-1] + (["Q"] if kind == "out_of_range" else [])  # unknown label / 3 of 4
    return json.dumps(reply)


def test_council_judge_slate():
    judge = Judge(council_good, council_bad)
    slates = [[f"search[topic {s} {c}]" for c in "dbca"] for s in range(10)]
    questions = [f"Question {s}?" for s in range(9)] + [doomed("question 9?")]
    honest_order = [3, 1, 2, 0]  # the slate positions of a, b, c, d: best first by action name
    with FaultServer(judge, rate=RATE, seed=SEED) as server:
        judges = [server.model(f"council_judges[{i}]", name=f"judge-{i}") for i in range(3)]

        async def all_slates():
            return await asyncio.gather(*(judge_slate(judges, q, "", a, rng_seed=s, min_valid=2)
                                          for s, (q, a) in enumerate(zip(questions, slates, strict=True))))

        outcomes = run(server, all_slates)
    invalid = Counter()
    for out in outcomes:
        valid = [v for v in out.votes if v.valid]
        for v in out.votes:
            if v.valid:
                assert v.ranking == [[p] for p in honest_order]
            else:
                assert v.ranking == [] and v.error
                invalid["call_failed" if v.error.startswith("judge call failed") else "unparsed"] += 1
        assert out.kept == (len(valid) >= 2)
        assert out.scores == [len(valid) * (3 - honest_order.index(p)) for p in range(4)]  # Borda of valid votes
    assert not outcomes[-1].kept and not any(v.valid for v in outcomes[-1].votes)  # doomed: the point is dropped
    dropped = sum(not o.kept for o in outcomes)
    check(Row("council.judge_slate", server, len(outcomes), sum(any(not v.valid for v in o.votes) for o in outcomes),
              f"completed; {dropped} slate(s) dropped (< 2 valid judges)", dict(invalid)))


CRITERIA = Rubric(criteria=[Criterion(text="Looks up the film", weight=2.0),
                            Criterion(text="Uses a search action", weight=1.0)])


def meets(criterion: str, action: str) -> bool:
    return "film" in action if "film" in criterion else action.startswith("search")


def criteria_of(text: str) -> list[str]:
    return re.findall(r"^\d+\. \(weight [\d.]+\) (.*)$", text, re.MULTILINE)


def evaluator_good(messages):
    system, text = messages[0]["content"], user_of(messages)
    if "single word yes or no" in system:
        requirement = re.search(r"Requirement: (.*)", text).group(1)
        action = re.search(r"Proposed next action: (.*)", text).group(1)
        return "yes" if meets(requirement, action) else "no"
    criteria = criteria_of(text)
    if "labelled A, B, C" in system:
        actions = re.findall(r"^[A-Z]\. (.*)$", text, re.MULTILINE)
        return json.dumps({"verdicts": [[meets(c, a) for a in actions] for c in criteria]})
    action = re.search(r"Proposed next action:\n(.*)", text).group(1)
    return json.dumps({"satisfied": [meets(c, action) for c in criteria]})


def evaluator_bad(kind, messages, good):
    if good in ("yes", "no"):
        return "perhaps" if kind == "out_of_range" else "y e s"
    reply = json.loads(good)
    key = next(iter(reply))
    if kind == "wrong_length":
        reply[key] = reply[key][:-1]
    elif key == "satisfied":
        reply[key][-1] = 7
    else:
        reply[key][-1] = [7] * len(reply[key][-1])
    return json.dumps(reply)


EVALUATOR = Judge(evaluator_good, evaluator_bad)


def slate(i: int) -> list[str]:
    return [f"search[film {i}]", f"browse[film-d{i}]", f"search[person {i}]", f"finish[x{i}]"]


@pytest.mark.parametrize("mode", ["action", "slate", "criterion"])
def test_rubric_eval(mode):
    questions = [f"Who directed film {i}?" for i in range(7)] + [doomed("who directed it?")]

    def evaluate(model, question, i):
        if mode == "action":
            return evaluate_actions(model, question, "", slate(i), CRITERIA, tally=tally)
        if mode == "slate":
            return evaluate_slate(model, question, "", slate(i), CRITERIA, orders=[[0, 1, 2, 3], [2, 3, 0, 1]],
                                  tally=tally)
        return evaluate_criteria(model, question, "", slate(i), CRITERIA, tally=tally)

    async def every(model):
        return await asyncio.gather(*(evaluate(model, q, i) for i, q in enumerate(questions)))

    tally = Tally()
    truth = asyncio.run(every(honest(EVALUATOR)))
    tally = Tally()
    with FaultServer(EVALUATOR, rate=RATE, seed=SEED) as server:
        scored = run(server, lambda: every(server.model("rubric_evaluator")))
    pairs = [(got, want) for gots, wants in zip(scored, truth, strict=True) for got, want in zip(gots, wants, strict=True)]
    assert all(got.score is None or got.score == want.score for got, want in pairs)
    assert all(got.score is None and got.error for got in scored[-1])  # doomed: the whole slate is unscored
    unscored = sum(got.score is None for got, _ in pairs)
    failed_prompts = server.failed_prompts()
    if mode == "action":  # one call per action
        assert unscored == len(failed_prompts)
    elif mode == "criterion":  # an action with any failed criterion call is unscored
        failed_actions = {(p.split("\n", 2)[1], re.search(r"Proposed next action: (.*)", p).group(1))
                          for p in failed_prompts}
        assert unscored == len(failed_actions)
    else:  # one failed order leaves the whole slate unscored
        assert unscored == 4 * len({p.split("\n", 2)[1] for p in failed_prompts})
    check(Row(f"rubric_eval ({mode})", server, len(pairs), unscored,
              "completed; unscored actions left out", tally.by_kind()))


def verifier_good(messages):
    system, text = messages[0]["content"], user_of(messages)
    if "single word yes or no" in system:
        return evaluator_good(messages)
    action = re.search(r"Proposed action: (.*)", text).group(1)
    return json.dumps({"verdicts": [{"satisfied": meets(c, action), "reason": "as seen"} for c in criteria_of(text)]})


def verifier_bad(kind, messages, good):
    if good in ("yes", "no"):
        return evaluator_bad(kind, messages, good)
    reply = json.loads(good)
    if kind == "wrong_length":
        reply["verdicts"] = reply["verdicts"][:-1]
    else:
        reply["verdicts"][-1]["satisfied"] = "maybe"
    return json.dumps(reply)


VERIFIER = Judge(verifier_good, verifier_bad)


@pytest.mark.parametrize("mode", ["checklist", "criterion"])
def test_verifier(mode):
    cases = [(f"Who directed film {i}?", a) for i in range(5) for a in slate(i)]
    cases.append((doomed("who directed it?"), "search[film 9]"))

    async def every(model):
        return await asyncio.gather(*(verify_action(model, q, "", "thinking", a, CRITERIA, tau=0.5, mode=mode)
                                      for q, a in cases))

    truth = asyncio.run(every(honest(VERIFIER)))
    with FaultServer(VERIFIER, rate=RATE, seed=SEED) as server:
        verdicts = run(server, lambda: every(server.model("verifier")))
    for got, want in zip(verdicts, truth, strict=True):
        if got.failed:  # a failed verification is no pass and no rejection
            assert got.accepted is None and got.fraction is None and not got.satisfied
        else:
            assert (got.accepted, got.fraction) == (want.accepted, want.fraction)
    assert verdicts[-1].failed and verdicts[-1].accepted is None  # doomed: never accepted
    assert truth[-1].accepted is True  # ... although the honest verifier would have passed it
    failed = [v for v in verdicts if v.failed]
    if mode == "checklist":  # one call per verification
        assert len(failed) == sum(server.failed_calls().values())
    else:  # one call per criterion: a verification with any failed call fails
        failed_actions = {(p.split("\n", 2)[1], re.search(r"Proposed next action: (.*)", p).group(1))
                          for p in server.failed_prompts()}
        assert len(failed) == len(failed_actions)
    recorded = {"call_failed": sum(v.failed_calls for v in verdicts), "unparsed": sum(v.unparsed for v in verdicts)}
    check(Row(f"verifier ({mode})", server, len(verdicts), len(failed),
              "completed; failed = unverified, never accepted", recorded))


def test_a_failed_verification_does_not_count_as_a_pass():
    """agent.py: a verifier whose every call fails leaves the draft unverified (accepted None, recorded with its
    error, counted as a verifier failure), neither accepted nor rejected."""
    from components.methods.coreact.agent import CoReActAgent
    from components.methods.coreact.guided_metrics import verification_stats
    from components.methods.coreact.rubric_generator import RubricGenerator
    from tests.coreact.scripted_agents import SETTINGS, DictToolbox, generator, policy

    question = Question(id="qd", question=doomed("where was the director of Nightfall Harbor born?"),
                        answers=["Kestrow"], source="world")

    def turns(i, context):
        return "Thought: look\nAction: search[Nightfall Harbor]" if i == 0 else "Thought: done\nAction: finish[Kestrow]"

    with FaultServer(VERIFIER, rate=RATE, seed=SEED) as server:
        agent = CoReActAgent(policy(turns), DictToolbox(), SETTINGS, verifier=server.model("verifier"),
                             generator=RubricGenerator(generator(), max_criteria=4, max_chars=160))
        trajectory = run(server, lambda: agent.run(question, seed=1))
    draft = trajectory.metadata["guided"]["steps"][0]["drafts"][0]
    assert draft["accepted"] is None and draft["fraction"] is None and draft["error"].startswith("verifier call failed")
    stats = verification_stats([trajectory])
    assert stats["verified_steps"] == 0 and stats["verifier_failures"] == 1 and stats["verification_failures"] == 0
    assert trajectory.metadata["guided"]["cost"]["verifier"]["failures"] == 1


def test_generator_reward():
    rubrics = [json.dumps({"criteria": [{"criterion": f"Looks up the film {w}", "weight": 2},
                                        {"criterion": f"Uses a search action {w}", "weight": 1}]})
               for w in ("first", "named", "asked about", "in the question")]

    def point(p: int, question: str) -> BranchingPoint:
        return BranchingPoint(question_id=f"q{p}", question=question, depth=0, slate=[0, 1, 2, 3],
                              candidates=[Candidate(action=a, model="m", temperature=0.4) for a in slate(p)],
                              borda_scores=[3.0, 1.0, 2.0, 0.0], consensus=[0, 2, 1, 3])

    points = [point(p, f"Who directed film {p}?") for p in range(5)] + [point(5, doomed("who directed it?"))]
    episodes = [Episode(prompt={"prompt": "p", "point": pt}, group=g, rows=[], text=r)
                for g, pt in enumerate(points) for r in rubrics]
    ctx = StepContext(step=1, groups=[e.group for e in episodes])

    truth = asyncio.run(RubricReward(honest(EVALUATOR), RubricGeneratorParams())(episodes, ctx))
    with FaultServer(EVALUATOR, rate=RATE, seed=SEED) as server:
        reward = RubricReward(server.model("rubric_evaluator"), RubricGeneratorParams())
        out = run(server, lambda: reward(episodes, ctx))
    assert all(r is None or r == t for r, t in zip(out.scores, truth.scores, strict=True))
    assert all(t is not None and t > 0.75 for t in truth.scores)  # rho = 1 for every rubric
    assert out.scores[-len(rubrics):] == [None] * len(rubrics)  # doomed: every rubric leaves its group
    failed_rubrics = {(p.split("\n", 2)[1], p.split("Checklist", 1)[1]) for p in server.failed_prompts()}
    assert sum(r is None for r in out.scores) == len(failed_rubrics)
    recorded = {"call_failed": int(out.metrics["evaluator/call_failures"]),
                "unparsed": int(out.metrics["evaluator/unparsed"])}
    check(Row("generator_reward", server, len(out.scores), sum(r is None for r in out.scores),
              "completed; unscored rubrics leave the group", recorded))


# ------------------------------------------------------------------------------------------ ARBOR


def pairwise_good(messages):
    text = user_of(messages)
    a = int(re.search(r"Attempt A:\n.*?quality=(\d+)", text, re.DOTALL).group(1))
    b = int(re.search(r"Attempt B:\n.*?quality=(\d+)", text, re.DOTALL).group(1))
    return json.dumps({"winner": "A" if a > b else "B" if b > a else "TIE"})


PAIRWISE = Judge(pairwise_good, lambda kind, m, good: '{"winner": "C"}' if kind == "out_of_range"
                 else '{"winner": ["A", "B"]}')


def test_pairwise_judge_score_group():
    rubric = RubricText(title="Follows the chain", description="Each query uses the last result.",
                        counter_description="Queries ignore the results.")
    qualities = [[3, 1, 2, 2, 0], [0, 4, 1, 3, 2], [2, 2, 2, 1, 3], [1, 0, 3, 4, 2], [4, 3, 2, 1, 0],
                 [1, 2, 3, 0, 4], [2, 0, 1, 3, 4]]
    questions = [f"Who directed film {g}?" for g in range(len(qualities) - 1)] + [doomed("who directed it?")]

    def texts(g):
        return [f"Turn 1\nThought: quality={q} (attempt {g}.{i})\nFinal answer: a{i}" for i, q in enumerate(qualities[g])]

    async def every(model):
        return await asyncio.gather(*(score_group(model, q, texts(g), sparse_graph(qualities[g]), rubric, key=f"k{g}")
                                      for g, q in enumerate(questions)))

    truth = asyncio.run(every(honest(PAIRWISE)))
    with FaultServer(PAIRWISE, rate=RATE, seed=SEED) as server:
        groups = run(server, lambda: every(server.model("pairwise_judge")))
    tally, removed = Tally(), 0
    for got, want in zip(groups, truth, strict=True):
        tally.merge(got.tally)
        assert all(v is None or v == want.outcomes[e] for e, v in got.outcomes.items())
        assert got.scores == edge_scores(len(got.scores), got.outcomes)  # the scores come from judged edges only
        removed += got.removed_edges
    assert groups[-1].scores == [None] * len(qualities[-1])  # doomed: no trajectory of the group is scored
    assert removed == sum(server.failed_calls().values())
    affected = sum(s is None or s != t for got, want in zip(groups, truth) for s, t in zip(got.scores, want.scores))
    check(Row("pairwise_judge.score_group", server, sum(len(q) for q in qualities), affected,
              f"completed; {removed} edges removed, doomed group unscored", tally.by_kind()))


def writer_good(messages):
    return json.dumps({"rubrics": [{"title": "Follows the chain", "description": "Uses each result.",
                                    "counter_description": "Ignores the results."}]})


WRITER = Judge(writer_good, lambda kind, m, good: good.replace('"Follows the chain"', '""') if kind == "out_of_range"
               else good.replace(', "counter_description": "Ignores the results."', ""))


def test_induction():
    plan = InductionPlan(kind="pairs", reason="contrast", pairs=[(0, 1)])
    questions = [f"Who directed film {q}?" for q in range(14)] + [doomed("who directed it?")]
    drafts = [Draft(id=f"d{i}", rubric=RubricText(title=f"Rubric {i}", description="Does it.",
                                                   counter_description="Does not."), question_id=f"q{i}",
                    question=f"Question {i}?", step=1, variance=0.1, pearson=None) for i in range(6)]

    async def every(model, tally):
        induced = await asyncio.gather(*(induce(model, q, ["Turn 1 good", "Turn 1 bad"], [1.0, 0.0], plan, [], 3, tally)
                                         for q in questions))
        merged = await asyncio.gather(*(consolidate(model, drafts[i:i + 3], [], 2, tally) for i in range(4)))
        return list(induced) + list(merged)

    truth = asyncio.run(every(honest(WRITER), Tally()))
    tally = Tally()
    with FaultServer(WRITER, rate=RATE, seed=SEED) as server:
        written = run(server, lambda: every(server.model("rubric_inducer"), tally))
    assert all(w is None or w == t for w, t in zip(written, truth, strict=True))
    assert written[len(questions) - 1] is None  # doomed: the group induces nothing
    assert sum(w is None for w in written) == sum(server.failed_calls().values())
    check(Row("induction (induce + consolidate)", server, len(written), sum(w is None for w in written),
              "completed; failed calls add no rubric", tally.by_kind()))


def rar_good(messages):
    if "grading checklists" in messages[0]["content"]:
        return json.dumps({"items": ["Finds the director", "Finds the birthplace", "Answers with the town"]})
    return json.dumps({"rating": int(re.search(r"quality=(\d+)", user_of(messages)).group(1))})


def rar_bad(kind, messages, good):
    if '"items"' in good:
        return '{"items": ["", ""]}' if kind == "out_of_range" else '{"items": []}'
    return '{"rating": 11}' if kind == "out_of_range" else '{"rating": [8, 9]}'


def test_rar():
    judge = Judge(rar_good, rar_bad)
    questions = [Question(id=f"q{i}", question=f"Who directed film {i}?", answers=[f"D{i}"], source="world")
                 for i in range(9)] + [Question(id="qd", question=doomed("who?"), answers=["D"], source="world")]

    async def every(model, tally):
        items = await asyncio.gather(*(write_checklist(model, q, 3, 5, tally) for q in questions))
        ratings = await asyncio.gather(*(rate(model, q.question, f"Turn 1\nThought: quality={r}", ["Finds it"], tally)
                                         for q in questions for r in (2, 7, 10)))
        return list(items), list(ratings)

    truth = asyncio.run(every(honest(judge), Tally()))
    tally = Tally()
    with FaultServer(judge, rate=RATE, seed=SEED) as server:
        items, ratings = run(server, lambda: every(server.model("rar_judge"), tally))
    assert all(i is None or i == t for i, t in zip(items, truth[0], strict=True))
    assert all(r is None or r == t for r, t in zip(ratings, truth[1], strict=True))
    assert items[-1] is None and ratings[-3:] == [None] * 3  # doomed: no checklist, no score
    unscored = sum(i is None for i in items) + sum(r is None for r in ratings)
    assert unscored == sum(server.failed_calls().values())
    check(Row("rar (checklist + rate)", server, len(items) + len(ratings), unscored,
              "completed; unscored trajectories left out", tally.by_kind()))


# ------------------------------------------------------------------------------------------ RubricEM


def stagewise_good(messages):
    if "You write grading rubrics" in messages[0]["content"]:
        stage = {"positive_rubrics": [{"title": "Grounded", "description": "Uses the evidence.", "weight": 2}],
                 "negative_rubrics": []}
        return json.dumps({f"stage_{k}": stage for k in range(1, 5)})
    rubrics = re.findall(r"^(\d+)\. \[", user_of(messages), re.MULTILINE)
    return json.dumps({"scores": [{"index": int(i), "justification": "it does", "score": 2} for i in rubrics]})


def stagewise_bad(kind, messages, good):
    reply = json.loads(good)
    if "scores" in reply:
        if kind == "out_of_range":
            reply["scores"][-1]["score"] = 7
        else:
            reply["scores"] = reply["scores"][:-1]
    elif kind == "out_of_range":
        reply["stage_2"]["positive_rubrics"][0]["weight"] = 7
    else:
        del reply["stage_4"]
    return json.dumps(reply)


def test_stagewise_judge():
    judge = Judge(stagewise_good, stagewise_bad)
    questions = [Question(id=f"q{g}", question=f"Which river flows through town {g}?", answers=["Ammel"],
                          source="world") for g in range(5)]
    questions.append(Question(id="qd", question=doomed("which river?"), answers=["Ammel"], source="world"))
    groups = [(q, [episode_trajectory(f"attempt {g}.{i}", question=q) for i in range(4)])
              for g, q in enumerate(questions)]
    with FaultServer(judge, rate=RATE, seed=SEED) as server:
        stagewise = StagewiseJudge(generator=server.model("rubric_generator"), evaluator=server.model("rubric_evaluator"))
        results, metrics = run(server, lambda: stagewise.judge_groups(groups, step=1))
    every = [r for group in results for r in group]
    for r in every:
        assert r.scores[3] == 1.0  # the answer stage's persistent F1 is always there
        if r.failed or r.asked == 0:  # the fallback: the answer score only, the other stages masked (None)
            assert r.scores[:3] == [None, None, None]
        else:
            assert r.scores == [1.0] * 4  # every rubric scored 2 by the honest judge, none turned into a 0
    assert all(r.failed for r in results[-1]) or metrics["judge/generation_failures"] >= 1
    assert all(r.asked == 0 or r.failed for r in results[-1])  # doomed group: nothing but its answer scores
    recorded = {"failures": int(metrics["judge/generation_failures"] + metrics["judge/scoring_failures"])}
    assert recorded["failures"] == sum(server.failed_calls().values())
    kinds = {k.removeprefix("judge/failure/"): v for k, v in metrics.items() if k.startswith("judge/failure/")}
    assert sum(v for k, v in kinds.items() if k.startswith("call_")) == server.failed_calls()["call_failed"]
    fell_back = sum(r.failed or r.asked == 0 for r in every)
    check(Row("stagewise_judge", server, len(every), fell_back,
              f"completed; {fell_back} trajectories fell back to the answer score", recorded), by_kind=False)


def reflection_good(messages):
    numbers = re.findall(r"^--- Reflection (\d+) ---$", user_of(messages), re.MULTILINE)
    ratings = {"diagnostic_accuracy": 0.5, "specificity": 0.5, "scope": 0.5}
    return json.dumps({"candidates": [{"index": int(n), "within": ratings, "cross": ratings} for n in numbers]})


def reflection_bad(kind, messages, good):
    reply = json.loads(good)
    if kind == "out_of_range":
        reply["candidates"][-1]["cross"] = {**reply["candidates"][-1]["cross"], "scope": 1.7}
    else:
        reply["candidates"] = reply["candidates"][:-1]
    return json.dumps(reply)


def test_reflection_judge():
    judge = Judge(reflection_good, reflection_bad)
    questions = [Question(id=f"q{i}", question=f"Which river flows through town {i}?", answers=["Ammel"],
                          source="world") for i in range(11)]
    questions.append(Question(id="qd", question=doomed("which river?"), answers=["Ammel"], source="world"))
    candidates = [[Reflection(rubrics=f"Critical requirements: the town of {i}.", takeaways=f"1. Lesson {i}.{j}.")
                   for j in range(3)] for i in range(len(questions))]

    async def every(model):
        reflection_judge = ReflectionJudge(model)
        return await asyncio.gather(*(reflection_judge.score(q, "<think>searching</think>", "plan 1.00", c)
                                      for q, c in zip(questions, candidates, strict=True)))

    with FaultServer(judge, rate=RATE, seed=SEED) as server:
        scored = run(server, lambda: every(server.model("reflection_judge")))
    for scores, error in scored:
        if error is None:
            assert scores == [pytest.approx(0.5)] * 3
        else:  # every candidate of the call unscored, never 0
            assert scores == [None] * 3
    assert scored[-1][1] is not None
    errors = [error for _, error in scored if error is not None]
    assert len(errors) == sum(server.failed_calls().values())
    recorded = {"call_failed": sum(e.startswith("call failed") for e in errors),
                "unparsed": sum(not e.startswith("call failed") for e in errors)}
    check(Row("reflection judge", server, 3 * len(scored), 3 * len(errors),
              "completed; candidates of a failed call unscored", recorded))


# ------------------------------------------------------------------------------------------ ARCO


def teacher_good(messages):
    steps = re.findall(r"^Step (\d+)", user_of(messages), re.MULTILINE)
    return json.dumps({"steps": [{"step": int(s), "criteria": [f"criterion a{s}", f"criterion b{s}"]} for s in steps]})


def teacher_bad(kind, messages, good):
    reply = json.loads(good)
    if kind == "out_of_range":
        reply["steps"][0]["step"] = 0
    else:
        reply["steps"] = reply["steps"][:-1]
    return json.dumps(reply)


def test_arco_annotate():
    judge = Judge(teacher_good, teacher_bad)
    questions = [Question(id=f"q{i}", question=f"Which river flows through town {i}?", answers=["Ammel"],
                          source="world") for i in range(14)]
    questions.append(Question(id="qd", question=doomed("which river?"), answers=["Ammel"], source="world"))

    def steps(i):
        made = [Step(index=t, raw="", thought=f"hop {t} of {i}", action=f"search[town {i} hop {t}]",
                     tool_call=ToolCall(name="search", arguments={"query": "x"}, observation=f"[1] (d{t}) text {i}"),
                     observation=f"[1] (d{t}) text {i}") for t in range(2)]
        made.append(Step(index=2, raw="", thought="done", action="finish[Ammel]", final_answer="Ammel"))
        return trajectory_steps(Trajectory(question_id=f"q{i}", question="?", steps=made, final_answer="Ammel",
                                           finish_reason="answer"))

    async def every(model):
        return await asyncio.gather(*(annotate(model, q, steps(i), k=2) for i, q in enumerate(questions)))

    truth = asyncio.run(every(honest(judge)))
    with FaultServer(judge, rate=RATE, seed=SEED) as server:
        annotated = run(server, lambda: every(server.model("arco_teacher")))
    for (got, why), (want, _) in zip(annotated, truth, strict=True):
        assert (got is None and why) or (got == want and why is None)
    assert annotated[-1][0] is None
    errors = [why for got, why in annotated if got is None]
    assert len(errors) == sum(server.failed_calls().values())
    recorded = {"call_failed": sum(e.startswith("call failed") for e in errors),
                "unparsed": sum(e.startswith("unparsed") for e in errors)}
    check(Row("arco criteria.annotate", server, len(annotated), len(errors),
              "completed; unannotated trajectories skipped", recorded))


def test_every_fault_kind_was_injected():
    """Over the runs above, the 30% share reached every kind of fault."""
    seen = Counter()
    for row in ROWS:
        seen.update(row.server.injected())
    assert set(KINDS) | {"doomed"} <= set(seen), set(KINDS) - set(seen)
    assert any(row.server.failed_calls()["call_failed"] for row in ROWS)  # some calls exhausted their retries
    assert set(ANSWER) <= set(seen)
