"""Scores read from token probabilities: the expectation against hand-computed values, renormalisation over the
labels found among the alternatives, multi-token labels and the lead before a label, the text fallback and how it
is counted, and the three judges wired to it (Co-ReAct's criterion verifier, ARBOR's pairwise judge, the answer
judge)."""

import asyncio
import math

import pytest

from components.judges.answer import judge_answers
from components.judges.call import Choice, JudgeCall, Tally, ask, label_probabilities
from components.llm.accounting import Accounting
from components.llm.backends.scripted import ScriptedChatModel, WithLogprobs
from components.llm.base import Sampling, TokenLogprob, user
from components.llm.middleware import ReliableChatModel
from components.llm.params import MiddlewareParams
from components.methods.arbor.memory import RubricText
from components.methods.arbor.pairwise_judge import WINNER, parse_winner, score_group
from components.methods.coreact.rubric_eval import YES_NO, parse_yes_no
from components.methods.coreact.verifier import verify_action
from components.schemas import Criterion, Question, Rubric
from tests.arbor.helpers import COMMON

YES_NO_TEXT = Choice({"yes": 1.0, "no": 0.0})


def tok(token: str, *top: tuple[str, float]) -> TokenLogprob:
    """A sampled token with alternatives given as probabilities (stored as log-probabilities)."""
    alts = tuple((t, math.log(p)) for t, p in top)
    chosen = dict(alts).get(token, 0.0)
    return TokenLogprob(token=token, logprob=chosen, top=alts)


def plain(*tokens: str) -> list[TokenLogprob]:
    return [TokenLogprob(token=t, logprob=0.0, top=((t, 0.0),)) for t in tokens]


def winner_tokens(label_token: TokenLogprob, before: str = ' "') -> list[TokenLogprob]:
    return [*plain('{"', "winner", '":', before), label_token, *plain('"}')]


# ---------------------------------------------------------------- the expectation, by hand


def test_yes_no_expectation_is_the_renormalised_probability_of_yes():
    sampled, probs = label_probabilities(YES_NO_TEXT, [tok("Yes", ("Yes", 0.7), ("No", 0.2), ("The", 0.1))])
    assert sampled == "yes"
    assert probs == pytest.approx({"yes": 0.7 / 0.9, "no": 0.2 / 0.9})


def test_three_labels_in_a_json_field_weight_their_values():
    tokens = winner_tokens(tok("A", ("A", 0.5), ("B", 0.2), ("T", 0.2), ("C", 0.1)), before=' "')
    sampled, probs = label_probabilities(WINNER, tokens)
    assert sampled == "A"
    assert probs == pytest.approx({"A": 0.5 / 0.9, "B": 0.2 / 0.9, "TIE": 0.2 / 0.9})  # "T" begins TIE only
    verdict = asyncio.run(ask(model_with([WithLogprobs('{"winner": "A"}', tokens)]),
                              JudgeCall([user("?")], parse_winner, choice=WINNER)))
    assert verdict.scored_from == "probability"
    assert verdict.expected == pytest.approx((0.5 * 1.0 + 0.2 * 0.0 + 0.2 * 0.5) / 0.9)  # 0.6667
    assert verdict.value == "A" and verdict.label_probs == pytest.approx(probs)


def test_labels_missing_from_the_alternatives_get_zero_and_the_rest_renormalise():
    tokens = winner_tokens(tok("B", ("B", 0.6), ("A", 0.3), ("Neither", 0.1)))
    sampled, probs = label_probabilities(WINNER, tokens)
    assert sampled == "B" and probs == pytest.approx({"A": 1 / 3, "B": 2 / 3, "TIE": 0.0})


def test_the_sampled_token_counts_even_when_the_server_left_it_out_of_the_alternatives():
    token = TokenLogprob(token="no", logprob=math.log(0.3), top=(("yes", math.log(0.6)),))
    assert label_probabilities(YES_NO_TEXT, [token]) == ("no", pytest.approx({"yes": 2 / 3, "no": 1 / 3}))


def test_alternatives_that_begin_the_same_label_add_up_and_the_lead_is_dropped():
    # the quote came in the label's token: alternatives with and without it, any case, count for their label
    tokens = [*plain('{"', "winner", '":'), tok(' "TIE', (' "TIE', 0.4), (' "A', 0.2), ("A", 0.1), (' "b', 0.1),
                                                 (' "', 0.2))]
    sampled, probs = label_probabilities(WINNER, tokens)
    assert sampled == "TIE"
    assert probs == pytest.approx({"A": 0.3 / 0.8, "B": 0.1 / 0.8, "TIE": 0.4 / 0.8})


def test_a_label_of_several_tokens_is_read_at_its_first():
    # TIE sampled as "T" + "IE": the position is its first token; "The" does not begin a label
    tokens = [*plain('{"', "winner", '":', ' "'), tok("T", ("T", 0.5), ("A", 0.3), ("The", 0.1), ("B", 0.1)),
              *plain("IE", '"}')]
    sampled, probs = label_probabilities(WINNER, tokens)
    assert sampled == "TIE"
    assert probs == pytest.approx({"A": 0.3 / 0.9, "B": 0.1 / 0.9, "TIE": 0.5 / 0.9})


def test_a_token_that_could_begin_two_labels_counts_for_neither():
    choice = Choice({"yes": 1.0, "yellow": 0.0, "no": 0.0})
    assert choice.match("ye") is None and choice.match("y") is None
    assert choice.match("Yes,") == "yes" and choice.match("yesterday") is None and choice.match("**No") == "no"


def test_a_bare_reply_is_read_at_its_first_word():
    tokens = [*plain("**"), tok("Yes", ("Yes", 0.6), ("No", 0.4)), *plain("**", ".")]
    assert label_probabilities(YES_NO_TEXT, tokens) == ("yes", pytest.approx({"yes": 0.6, "no": 0.4}))


def test_no_label_position_or_no_label_there_reads_nothing():
    assert label_probabilities(WINNER, plain("I", " think", " A")) is None  # no winner field
    assert label_probabilities(YES_NO_TEXT, plain("Maybe")) is None
    assert label_probabilities(WINNER, plain('{"winner": ')) is None  # cut off before the label


# ---------------------------------------------------------------- ask: when probabilities are used, and the fallback


def model_with(replies, scoring="probability") -> ReliableChatModel:
    model = ReliableChatModel(ScriptedChatModel(replies), role="judge", settings=MiddlewareParams(cache=False),
                              accounting=Accounting(), scoring=scoring)
    return model


def yes_no_call():
    from components.judges.call import reasons
    return JudgeCall([user("Does it?")], reasons(parse_yes_no), Sampling(temperature=0.0, max_tokens=4), choice=YES_NO)


def test_probability_scoring_asks_for_logprobs_and_counts_the_verdict():
    model = model_with([WithLogprobs("Yes", [tok("Yes", ("Yes", 0.55), ("No", 0.45))])])
    tally = Tally()
    verdict = asyncio.run(ask(model, yes_no_call(), tally))
    sent = model.inner.requests[0][1]
    assert sent.logprobs and sent.top_logprobs == YES_NO.top_logprobs
    assert verdict.value is True and verdict.expected == pytest.approx(0.55) and verdict.scored_from == "probability"
    assert tally.scoring() == {"scored_from_probability": 1, "scored_from_text": 0}
    metrics = model.accounting.metrics()
    assert metrics["llm.judge.scored_from_probability"] == 1 and metrics["llm.judge.logprob_missing"] == 0


def test_a_backend_without_logprobs_falls_back_to_the_text_and_says_so():
    model = model_with(["No."])  # a reply without tokens: the scripted backend, like gemini or hf, has none
    tally = Tally()
    verdict = asyncio.run(ask(model, yes_no_call(), tally))
    assert verdict.value is False and verdict.expected == 0.0 and verdict.scored_from == "text"
    assert verdict.label_probs is None
    assert tally.scoring() == {"scored_from_probability": 0, "scored_from_text": 1}
    metrics = model.accounting.metrics()
    assert metrics["llm.judge.logprob_missing"] == 1 and metrics["llm.judge.scored_from_text"] == 1


def test_tokens_that_disagree_with_the_parsed_label_fall_back_to_the_text():
    # the parser read "yes" from the text, the tokens say "No": the position cannot be trusted
    model = model_with([WithLogprobs("yes", [tok("No", ("No", 0.9), ("yes", 0.1))])])
    verdict = asyncio.run(ask(model, yes_no_call()))
    assert verdict.scored_from == "text" and verdict.expected == 1.0


def test_text_scoring_is_the_default_and_changes_nothing():
    model = model_with([WithLogprobs("Yes", [tok("Yes", ("Yes", 0.55), ("No", 0.45))])], scoring="text")
    tally = Tally()
    verdict = asyncio.run(ask(model, yes_no_call(), tally))
    sent = model.inner.requests[0][1]
    assert not sent.logprobs and sent == Sampling(temperature=0.0, max_tokens=4)
    assert verdict.expected == 1.0 and verdict.scored_from == "text"
    assert tally.scoring() == {} and tally.scored_from_text == 1
    assert not any("logprob" in k or "scored_from" in k for k in model.accounting.metrics())


def test_a_call_without_a_choice_has_no_expectation_and_asks_for_nothing():
    model = model_with(["Yes"])
    from components.judges.call import reasons
    verdict = asyncio.run(ask(model, JudgeCall([user("?")], reasons(parse_yes_no))))
    assert verdict.expected is None and verdict.scored_from is None
    assert not model.inner.requests[0][1].logprobs


def test_tallies_merge_their_scoring_counts():
    a, b = Tally(scored_from_probability=2, probability_asked=2), Tally(scored_from_text=1, probability_asked=1)
    a.merge(b)
    assert a.scoring() == {"scored_from_probability": 2, "scored_from_text": 1}


# ---------------------------------------------------------------- the wired judges


def test_criterion_verifier_scores_the_weighted_probability_of_yes():
    rubric = Rubric(criteria=[Criterion(text="looks up the director", weight=3.0),
                              Criterion(text="does not repeat a search", weight=1.0)])

    def reply(messages, sampling):
        if "Requirement: looks up" in messages[-1].content:
            return WithLogprobs("yes", [tok("yes", ("yes", 0.6), ("no", 0.4))])
        return WithLogprobs("no", [tok("no", ("no", 0.8), ("yes", 0.2))])

    verifier = ReliableChatModel(ScriptedChatModel(reply), role="verifier", settings=MiddlewareParams(cache=False),
                                 scoring="probability")
    v = asyncio.run(verify_action(verifier, "Q?", "", "think", "search[director]", rubric, tau=0.5, mode="criterion"))
    assert v.satisfied == [True, False]  # the sampled answers
    assert v.fraction == pytest.approx((3.0 * 0.6 + 1.0 * 0.2) / 4.0)  # 0.5, where the text said 0.75
    assert v.accepted is False
    verifier.scoring = "text"
    again = asyncio.run(verify_action(verifier, "Q?", "", "think", "search[director]", rubric, tau=0.5,
                                      mode="criterion"))
    assert again.fraction == pytest.approx(0.75) and again.accepted is True


def test_pairwise_judge_maps_a_swapped_expectation_back():
    rubric = RubricText(**COMMON)

    def reply(messages, sampling):  # whichever order: the first shown attempt wins with probability 0.7
        return WithLogprobs('{"winner": "A"}', winner_tokens(tok("A", ("A", 0.7), ("B", 0.2), ("TIE", 0.1))))

    judge = ReliableChatModel(ScriptedChatModel(reply), role="rubric_evaluator",
                              settings=MiddlewareParams(cache=False), scoring="probability")
    expected_a = 0.7 + 0.1 * 0.5
    for key in ("k1", "k2", "k3", "k4", "k5", "k6"):
        result = asyncio.run(score_group(judge, "Q?", ["t0", "t1"], [(0, 1)], rubric, key))
        swapped = "t1" in judge.inner.requests[-1][0][-1].content.split("Attempt B")[0]
        assert result.outcomes[(0, 1)] == pytest.approx(1 - expected_a if swapped else expected_a)
        assert result.tally.scoring() == {"scored_from_probability": 1, "scored_from_text": 0}


def test_answer_judge_gives_the_probability_of_correct_when_asked():
    questions = [Question(id="q", question="?", answers=["The Lantern"], source="world")]
    true_of = {"The Lantern": 0.8, "Lake Vostok": 0.05, "17 March 1802": 0.3, "none of the references": 0.01}

    def reply(messages, sampling):  # the probability of true depends on the reference shown: decoys included
        p = true_of[messages[-1].content.split("Reference answers: ")[1].split("\n")[0]]
        tokens = [*plain('{"', "correct", '":'), tok(" true" if p >= 0.5 else " false", (" true", p), (" false", 0.95 - p), ("true", 0.05)),
                  *plain("}")]
        return WithLogprobs('{"correct": true}' if p >= 0.5 else '{"correct": false}', tokens)

    judge = ReliableChatModel(ScriptedChatModel(reply), role="answer_judge", settings=MiddlewareParams(cache=False),
                              scoring="probability")
    [verdict] = asyncio.run(judge_answers(judge, questions, ["Lantern film"]))
    # 0.85 from the reference (" true" and "true" both count), capped by the decoys at 1 - (0.3 + 0.05) = 0.65
    assert verdict == pytest.approx(0.65) and len(judge.inner.requests) == 4
    judge.scoring = "text"
    assert asyncio.run(judge_answers(judge, questions, ["Lantern film"])) == [True]
    true_of["17 March 1802"] = 0.7  # a decoy passed: the text verdict is withdrawn, the probability capped
    assert asyncio.run(judge_answers(judge, questions, ["Lantern film"])) == [False]
    judge.scoring = "probability"
    assert asyncio.run(judge_answers(judge, questions, ["Lantern film"])) == [pytest.approx(1 - (0.7 + 0.05))]


# ---------------------------------------------------------------- score sheets: a label at every field or element


def sheet_tokens(text: str, choice: Choice, dists: list[dict[str, float]]) -> list[TokenLogprob]:
    """``text`` as tokens, each label of ``choice`` a token of its own whose alternatives are the next of
    ``dists`` (the sampled digit first), everything else plain."""
    starts = choice.locate_each(text)
    assert len(starts) == len(dists)
    out, at = [], 0
    for start, dist in zip(starts, dists):
        if start > at:
            out += plain(text[at:start])
        out.append(tok(text[start], *dist.items()))
        at = start + 1
    return out + plain(text[at:])


def test_every_label_of_a_sheet_is_located_in_fields_and_in_nested_arrays():
    fields = Choice({"0": 0.0, "1": 1.0, "2": 2.0}, field="score", every=True, label=list)
    text = '{"scores": [{"index": 0, "justification": "a \\"score\\": 1", "score": 2}, {"index": 1, "score":"0"}]}'
    assert [text[i] for i in fields.locate_each(text)] == ["2", "0"]  # not "scores", not the escaped quote
    rows = Choice({"0": 0.0, "1": 1.0, "2": 2.0}, field="scores", every=True, label=list)
    text = '{"scores": [[2, 1], [ 0 ,"2"], []], "note": [1]}'
    assert [text[i] for i in rows.locate_each(text)] == ["2", "1", "0", "2"]
    with pytest.raises(ValueError, match="every=True needs"):
        Choice({"0": 0.0}, every=True)


SHEET = Choice({"0": 0.0, "1": 1.0, "2": 2.0}, field="score", every=True,
               label=lambda sheet: [s["score"] for s in sheet["scores"]])


def sheet_call():
    import json

    return JudgeCall([user("Score it.")], json.loads, choice=SHEET)


def test_each_score_of_a_sheet_is_its_expectation_by_hand():
    text = '{"scores": [{"index": 0, "score": 2}, {"index": 1, "score": 1}, {"index": 2, "score": 0}]}'
    dists = [{"2": 0.6, "1": 0.3, "0": 0.1}, {"1": 0.5, "2": 0.25, "x": 0.25}, {"0": 1.0}]
    tally = Tally()
    verdict = asyncio.run(ask(model_with([WithLogprobs(text, sheet_tokens(text, SHEET, dists))]), sheet_call(), tally))
    assert verdict.scored_from == "probability"
    # 2*0.6 + 1*0.3; (1*0.5 + 2*0.25) / 0.75 ("x" is no label); 0
    assert verdict.expected_each == pytest.approx((1.5, 4 / 3, 0.0))
    assert verdict.expected is None and tally.scoring() == {"scored_from_probability": 1, "scored_from_text": 0}


def test_a_sheet_falls_back_to_its_sampled_scores_when_any_label_is_not_where_the_verdict_says():
    text = '{"scores": [{"index": 0, "score": 2}, {"index": 1, "score": 1}]}'
    dists = [{"2": 0.6, "1": 0.4}, {"0": 0.9, "1": 0.1}]  # the second token reads "0", the verdict says 1
    tokens = sheet_tokens(text, SHEET, dists)
    tokens[-2] = tok("0", *dists[1].items())
    tally = Tally()
    verdict = asyncio.run(ask(model_with([WithLogprobs(text, tokens)]), sheet_call(), tally))
    assert verdict.scored_from == "text" and verdict.expected_each == (2.0, 1.0)
    assert tally.scoring() == {"scored_from_probability": 0, "scored_from_text": 1}
    text_only = asyncio.run(ask(model_with([text], scoring="text"), sheet_call()))
    assert text_only.scored_from == "text" and text_only.expected_each == (2.0, 1.0)
