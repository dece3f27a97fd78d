"""The council: prompt permutation round trip, strict ranking parser, Borda with ties and invalid
votes (hand-computed), failures as invalid votes, the min-valid filter, agreement statistics."""

from __future__ import annotations

import asyncio
import itertools
import json
import re

import pytest

from components.judges.call import Failure, read_reply
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import PermanentLLMError, TransientLLMError
from components.methods.coreact.council import (
    agreement,
    borda,
    build_messages,
    consensus_order,
    judge_slate,
    neutral_labels,
    parse_ranking,
    permutations_for,
    ranking_parser,
    ranking_schema,
    reference_notes,
    vote_from_reply,
)
from components.schemas import JudgeVote, Question, SubQuestion

LABELS = ["X", "Y", "Z", "W"]
SLATE = ["search[Nightfall Harbor]", "search[Mara Quill birthplace]", "browse[d3]", "answer[Vantor]"]


def run(coro):
    return asyncio.run(coro)


def vote(ranking, valid=True, judge="j"):
    return JudgeVote(judge=judge, permutation=[0, 1, 2, 3], labels=LABELS, ranking=ranking, valid=valid,
                     error=None if valid else "unparseable")


# ---------------------------------------------------------------- labels, prompt, permutation


def test_neutral_labels():
    assert neutral_labels(4) == ["X", "Y", "Z", "W"]
    assert neutral_labels(6) == ["X", "Y", "Z", "W", "V", "U"]
    with pytest.raises(ValueError):
        neutral_labels(0)


def test_schema_demands_a_full_ranking_of_the_labels():
    schema = ranking_schema(LABELS)
    assert schema["required"] == ["rationale", "ranking"]
    ranking = schema["properties"]["ranking"]
    assert ranking["items"]["enum"] == LABELS
    assert ranking["minItems"] == ranking["maxItems"] == len(LABELS) and ranking["uniqueItems"]


def _shown(messages):
    """(label, action) pairs in the order the prompt lists them."""
    return re.findall(r"^\[([A-Z])\] (.+)$", messages[-1].content, flags=re.MULTILINE)


def test_reference_notes_carry_the_answer_and_hops_in_order_and_only_when_given():
    q = Question(id="q", question="Where was the director of Nightfall Harbor born?", answers=["Kestrow", "K."],
                 source="world")
    assert reference_notes(q) == 'The correct answer is "Kestrow".'
    q.gold_chain = [SubQuestion(question="Who directed Nightfall Harbor?", answer="Mara Quill"),
                    SubQuestion(question="Where was Mara Quill born?", answer="Kestrow")]
    notes = reference_notes(q)
    assert notes.index("1. Who directed Nightfall Harbor? -> Mara Quill") < notes.index(
        "2. Where was Mara Quill born? -> Kestrow")
    shown = [(LABELS[j], SLATE[j]) for j in range(4)]
    guided, plain = build_messages(q.question, "", shown, notes)[-1].content, build_messages(q.question, "", shown)[-1].content
    assert notes in guided and "Kestrow" not in plain and "Reference" not in plain
    assert _shown(build_messages(q.question, "", shown, notes)) == _shown(build_messages(q.question, "", shown))


@pytest.mark.parametrize("perm", list(itertools.permutations(range(4))))
def test_permutation_round_trip_for_every_permutation(perm):
    perm = list(perm)
    messages = build_messages("Q?", "", [(LABELS[j], SLATE[p]) for j, p in enumerate(perm)])
    shown = _shown(messages)
    assert [lab for lab, _ in shown] == LABELS
    assert [a for _, a in shown] == [SLATE[p] for p in perm]
    # the judge ranks by content: true slate order 2 > 0 > 3 > 1, with 0 and 3 tied in a second reply
    label_of = {a: lab for lab, a in shown}
    strict = " > ".join(label_of[SLATE[p]] for p in [2, 0, 3, 1])
    v = vote_from_reply("j", perm, LABELS, read_reply(strict, ranking_parser(LABELS)))
    assert v.valid and v.ranking == [[2], [0], [3], [1]]
    tied = json.dumps({"ranking": [label_of[SLATE[2]], [label_of[SLATE[0]], label_of[SLATE[3]]],
                                   label_of[SLATE[1]]], "rationale": "r"})
    v = vote_from_reply("j", perm, LABELS, read_reply(tied, ranking_parser(LABELS)))
    assert v.valid and v.ranking == [[2], [0, 3], [1]] and v.rationale == "r"
    assert v.permutation == perm and v.labels == LABELS


def test_an_unparsed_reply_is_an_invalid_vote_that_keeps_its_rationale():
    result = read_reply('{"rationale": "Y is next", "ranking": ["Y", "X"]}', ranking_parser(LABELS))
    assert isinstance(result, Failure) and result.kind == "unparsed" and result.partial == "Y is next"
    v = vote_from_reply("j", [0, 1, 2, 3], LABELS, result)
    assert not v.valid and v.ranking == [] and v.rationale == "Y is next" and v.error == "partial ranking: missing Z, W"


def test_permutations_are_seeded():
    assert permutations_for(3, 4, 7) == permutations_for(3, 4, 7)
    assert all(sorted(p) == [0, 1, 2, 3] for p in permutations_for(5, 4, 7))
    assert len({tuple(p) for s in range(20) for p in permutations_for(3, 4, s)}) > 1


# ---------------------------------------------------------------- parser


@pytest.mark.parametrize("text, groups", [
    ('Thinking...\n```json\n{"ranking": ["Y", "X", "W", "Z"], "rationale": "Y is next"}\n```', "Y|X|W|Z"),
    ('Sure. {"rationale": "because", "ranking": ["Z", "W", "X", "Y"]} Hope this helps.', "Z|W|X|Y"),
    ('{"ranking": [["Y", "X"], "W", "Z"], "rationale": ""}', "YX|W|Z"),
    ('{"ranking": "Y = X > W > Z"}', "YX|W|Z"),
    ('{"ranking": ["Y = X", "W", "Z"]}', "YX|W|Z"),
    ("Y > X > W > Z", "Y|X|W|Z"),
    ("Y -> X -> W -> Z", "Y|X|W|Z"),
    ("Y, X, W, Z", "Y|X|W|Z"),
    ("Y = X > W > Z", "YX|W|Z"),
    ("X is weak because it repeats.\n**Final ranking:** [Y] > [X] = [W] > [Z]", "Y|XW|Z"),
    ("Ranking: y > x > w > z.", "Y|X|W|Z"),
    ('{"rationale": "cut off by the token limit", "ranking": ["W", "Z", "Y", "X"]', "W|Z|Y|X"),
    ('The order:\n"ranking": ["Y", "X", "W", "Z"]', "Y|X|W|Z"),
])
def test_parser_accepts(text, groups):
    parsed = parse_ranking(text, LABELS)
    assert parsed.error is None
    assert "|".join("".join(g) for g in parsed.groups) == groups


def test_parser_keeps_the_rationale():
    assert parse_ranking('{"ranking": ["Y","X","W","Z"], "rationale": "Y finds the director"}',
                         LABELS).rationale == "Y finds the director"
    assert parse_ranking("Y looks up the missing fact.\nY > X > W > Z", LABELS).rationale == \
        "Y looks up the missing fact."


@pytest.mark.parametrize("text, error", [
    ("Y > X > X > Z", "appears more than once"),
    ('{"ranking": ["Y", ["X", "Y"], "W", "Z"]}', "appears more than once"),
    ("Y > X > W", "missing Z"),
    ('{"ranking": ["Y", "X"], "rationale": "partial"}', "missing Z, W"),
    ("Y > X > W > Q", "unknown label 'Q'"),
    ('{"ranking": ["Y", "X", "W", "Candidate Z"]}', "unknown label"),
    ('{"ranking": 3}', "must be a list"),
    ("I think the first one is best.", "no ranking found"),
    ("", "empty reply"),
])
def test_parser_rejects(text, error):
    parsed = parse_ranking(text, LABELS)
    assert parsed.groups is None and error in parsed.error


# ---------------------------------------------------------------- Borda


def test_borda_with_ties_and_an_invalid_vote_by_hand():
    votes = [
        vote([[0], [1], [2], [3]]),          # 0:3  1:2  2:1  3:0
        vote([[1, 0], [3], [2]]),            # 0,1 share (3+2)/2 = 2.5;  3:1  2:0
        vote([], valid=False),               # a missing judge: ignored, not zero
        vote([[2], [0, 1, 3]]),              # 2:3;  0,1,3 share (2+1+0)/3 = 1
    ]
    scores = borda(votes, 4)
    assert scores == pytest.approx([6.5, 5.5, 4.0, 2.0])
    assert consensus_order(scores) == [0, 1, 2, 3]


def test_borda_tie_break_is_slate_order():
    scores = borda([vote([[3], [1], [2], [0]]), vote([[1], [3], [0], [2]])], 4)
    assert scores == [1.0, 5.0, 1.0, 5.0]
    assert consensus_order(scores) == [1, 3, 0, 2]


def test_borda_refuses_a_malformed_valid_vote():
    with pytest.raises(ValueError):
        borda([vote([[0], [1], [2]])], 4)


# ---------------------------------------------------------------- judge_slate


def ranks_by_content(order):
    """A scripted judge that reads the labelled actions from the prompt and ranks slate ``order``."""
    def responder(messages, sampling):
        label_of = {a: lab for lab, a in _shown(messages)}
        ranking = [label_of[SLATE[p]] for p in order]
        return json.dumps({"rationale": "content", "ranking": ranking})
    return responder


def test_two_valid_judges_keep_the_point():
    judges = [ScriptedChatModel(ranks_by_content([2, 0, 3, 1]), name="a"),
              ScriptedChatModel(ranks_by_content([2, 3, 0, 1]), name="b")]
    votes, consensus, scores, kept = run(judge_slate(judges, "Where was the director born?", "Step 1 ...",
                                                     SLATE, rng_seed=3, min_valid=2))
    assert kept and all(v.valid for v in votes) and [v.judge for v in votes] == ["a", "b"]
    # a: 2:3 0:2 3:1 1:0; b: 2:3 3:2 0:1 1:0 -> [3, 0, 6, 3]; 0 and 3 tie, slate order puts 0 first
    assert scores == [3.0, 0.0, 6.0, 3.0] and consensus == [2, 0, 3, 1]
    _, sampling = judges[0].requests[0]
    assert sampling.json_schema == ranking_schema(LABELS) and sampling.temperature == 0.0


def test_one_valid_judge_drops_the_point():
    judges = [ScriptedChatModel(["Y > X > W > Z"], name="good"),
              ScriptedChatModel(["I cannot decide, they all look fine."], name="garbage")]
    votes, _consensus, scores, kept = run(judge_slate(judges, "Q", "", SLATE, rng_seed=0, min_valid=2))
    assert not kept
    assert votes[0].valid and not votes[1].valid and votes[1].error == "no ranking found in the reply"
    assert votes[1].ranking == [] and sum(scores) == 6.0  # only the valid vote counted


@pytest.mark.parametrize("error", [PermanentLLMError("bad request", 400), TransientLLMError("timeout")])
def test_a_failed_judge_call_is_an_invalid_vote(error):
    judges = [ScriptedChatModel([error], name="down"), ScriptedChatModel(["X > Y > Z > W"], name="up")]
    votes, _, scores, kept = run(judge_slate(judges, "Q", "", SLATE, rng_seed=1, min_valid=1))
    down = votes[0]
    assert not down.valid and down.ranking == [] and "judge call failed" in down.error
    assert type(error).__name__ in down.error
    assert kept and sum(scores) == 6.0


def test_a_judge_that_raises_is_an_invalid_vote():
    judges = [ScriptedChatModel([], name="empty"), ScriptedChatModel(["X > Y > Z > W"])]
    votes, *_ = run(judge_slate(judges, "Q", "", SLATE, rng_seed=1, min_valid=1))
    assert not votes[0].valid and "AssertionError" in votes[0].error


def by_position(messages, sampling):
    """A judge that ranks by display order alone (the first label shown is best)."""
    return json.dumps({"rationale": "first", "ranking": [lab for lab, _ in _shown(messages)]})


def test_balanced_orders_cancel_a_position_judge_and_keep_what_a_content_judge_says():
    content = [2, 0, 3, 1]
    consensus_by_orders = {}
    for orders in (1, 4):
        consensus_by_orders[orders] = []
        for seed in range(20):
            judges = [ScriptedChatModel(by_position, name="position"),
                      ScriptedChatModel(ranks_by_content(content), name="content")]
            votes, consensus, scores, kept = run(judge_slate(judges, "Q", "", SLATE, rng_seed=seed, min_valid=2,
                                                             orders=orders))
            consensus_by_orders[orders].append(consensus)
            assert kept and len(votes) == 2 * orders and [len(j.requests) for j in judges] == [orders, orders]
            if orders == 4:
                # each judge saw every action once at every position (a Latin square of its orders)
                for name in ("position", "content"):
                    perms = [v.permutation for v in votes if v.judge == name]
                    assert all(sorted(col) == [0, 1, 2, 3] for col in zip(*perms))
                # position: 3+2+1+0 = 6 points to every action; content: 4 x (2:3, 0:2, 3:1, 1:0)
                assert scores == [14.0, 6.0, 18.0, 10.0]
                ag = agreement(votes, scores)
                # the position judge's Borda over its orders is flat, so no pair of judges is comparable; its
                # orders are cyclic shifts (tau 0, -1/3, 0, 0, -1/3, 0), the content judge's agree (tau 1)
                assert ag.mean_tau is None and ag.mean_self_tau == pytest.approx((6 - 2 / 3) / 12)
    assert all(c == content for c in consensus_by_orders[4])
    assert any(c != content for c in consensus_by_orders[1])  # one drawn order: position sways the winner


def test_a_judge_counts_towards_min_valid_when_one_of_its_orders_is_valid():
    def down_on(n_failures):
        replies = iter([TransientLLMError("timeout")] * n_failures)
        return lambda messages, sampling: next(replies, None) or by_position(messages, sampling)

    def judges(n_failures):
        return [ScriptedChatModel(ranks_by_content([2, 0, 3, 1]), name="a"),
                ScriptedChatModel(down_on(n_failures), name="b")]

    votes, _, _, kept = run(judge_slate(judges(3), "Q", "", SLATE, rng_seed=0, min_valid=2, orders=4))
    assert kept and sum(v.valid for v in votes if v.judge == "b") == 1
    votes, _, scores, kept = run(judge_slate(judges(4), "Q", "", SLATE, rng_seed=0, min_valid=2, orders=4))
    assert not kept and sum(v.valid for v in votes) == 4 and sum(scores) == 4 * 6  # a's four orders alone
    with pytest.raises(ValueError, match="orders"):
        run(judge_slate(judges(0), "Q", "", SLATE, rng_seed=0, orders=0))


# ---------------------------------------------------------------- agreement


def test_agreement_tau_and_label_counts():
    def v(name, perm, ranking):
        return JudgeVote(judge=name, permutation=perm, labels=LABELS, ranking=ranking, valid=True)

    a = v("a", [0, 1, 2, 3], [[0], [1], [2], [3]])
    b = v("b", [3, 2, 1, 0], [[0], [1], [2], [3]])
    c = v("c", [1, 0, 2, 3], [[3], [2], [1], [0]])
    bad = JudgeVote(judge="d", permutation=[0, 1, 2, 3], labels=LABELS, valid=False, error="x")
    ag = agreement([a, b, bad])
    assert ag.mean_tau == pytest.approx(1.0) and ag.n_pairs == 1
    assert ag.winner_labels == {"X": 1, "W": 1}  # slate position 0 was shown as X to a and as W to b
    ag = agreement([a, c])
    assert ag.mean_tau == pytest.approx(-1.0)
    # a gives 0:3 1:2 2:1 3:0 and c gives 3:3 2:2 1:1 0:0 -> all 3.0, so the winner is slate position 0,
    # shown as X to a and as Y to c; the judges' own first choices were shown as X (a) and W (c)
    assert ag.winner_labels == {"X": 1, "Y": 1}
    assert ag.top_labels == {"X": 1, "W": 1}
    assert agreement([bad]).mean_tau is None
