"""EM/F1 against hand-computed values (SQuAD normalisation, HotpotQA yes/no rule, several golds)."""

import math

import pytest

from components.evaluation.metrics import aggregate, exact_match, f1_score, normalize_answer, score


def test_normalize_lowercases_strips_punctuation_articles_and_spaces():
    assert normalize_answer("  The Eiffel   Tower! ") == "eiffel tower"
    assert normalize_answer("A cat, an owl & the dog.") == "cat owl dog"
    # articles are whole words only: "another" and "theme" stay
    assert normalize_answer("another theme") == "another theme"
    # punctuation is removed, not replaced by a space: "U.S." -> "us", "well-known" -> "wellknown"
    assert normalize_answer("U.S. well-known") == "us wellknown"


def test_exact_match():
    assert exact_match("The Eiffel Tower!", "eiffel tower") == 1.0
    assert exact_match("Eiffel", ["Eiffel Tower"]) == 0.0
    assert exact_match("1961", ["1960", "1961"]) == 1.0
    assert exact_match(None, ["x"]) == 0.0


def test_f1_partial_overlap():
    # pred "big red dog" (3 tokens), gold "red dog" (2): common = 2
    # P = 2/3, R = 2/2 = 1, F1 = 2 * (2/3) * 1 / (2/3 + 1) = (4/3) / (5/3) = 0.8
    assert f1_score("the big red dog", "red dog") == pytest.approx(0.8)
    assert exact_match("the big red dog", "red dog") == 0.0


def test_f1_counts_repeated_tokens_once_each():
    # pred {dog:2, cat:1}, gold {dog:1, cat:2}: common = min counts = dog 1 + cat 1 = 2
    # P = 2/3, R = 2/3, F1 = 2/3
    assert f1_score("dog dog cat", "dog cat cat") == pytest.approx(2 / 3)


def test_f1_takes_max_over_golds():
    # vs "obama": P = 1/2, R = 1 -> F1 = 2*(1/2)/(3/2) = 2/3
    # vs "president barack obama": P = 2/2, R = 2/3 -> F1 = 2*(2/3)/(5/3) = 0.8
    assert f1_score("Barack Obama", ["Obama", "President Barack Obama"]) == pytest.approx(0.8)


def test_f1_no_overlap_is_zero():
    assert f1_score("Paris", "London") == 0.0


def test_yes_no_rule():
    assert f1_score("no", "yes") == 0.0
    assert f1_score("Yes.", "yes") == 1.0
    # gold is "yes" and the prediction normalises to something else: 0, not the token F1 of
    # P = 1/3, R = 1 -> 0.5 that plain F1 would give
    assert f1_score("yes it is", "yes") == 0.0
    # prediction is "no", gold is a phrase containing "no": 0 as well
    assert f1_score("no", "no way") == 0.0
    assert f1_score("noanswer", "the answer") == 0.0


def test_empty_after_normalisation():
    # both normalise to "": they agree (SQuAD v2 convention); one empty: 0
    assert f1_score("a an the", "The") == 1.0
    assert exact_match("a an the", "The") == 1.0
    assert f1_score("the", "dog") == 0.0


def test_none_prediction_and_missing_golds():
    assert score(None, ["x"]) == {"em": 0.0, "f1": 0.0}
    with pytest.raises(ValueError):
        exact_match("x", [])


def test_score_and_aggregate():
    rows = [
        score("the big red dog", "red dog"),  # em 0, f1 0.8
        score("Paris", ["paris", "Paris, France"]),  # em 1, f1 1
        {"em": 0.0, "f1": 0.2, "judge": None, "note": "text"},
        {"em": True, "f1": float("nan"), "judge": 1.0},
    ]
    out = aggregate(rows)
    assert out["n"] == 4
    assert out["em"] == pytest.approx((0 + 1 + 0 + 1) / 4)
    # f1: NaN skipped -> (0.8 + 1 + 0.2) / 3
    assert out["f1"] == pytest.approx(2.0 / 3)
    # judge: None skipped -> 1.0 / 1
    assert out["judge"] == 1.0
    assert "note" not in out
    assert aggregate([]) == {"n": 0}
    assert not any(isinstance(v, float) and math.isnan(v) for v in out.values())
