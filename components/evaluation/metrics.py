"""Answer metrics for multi-hop QA: SQuAD-style normalisation, exact match and token F1 against several
gold answers, with HotpotQA's yes/no rule, plus ``aggregate`` to average per-question scores.

    from components.evaluation.metrics import score, aggregate
    rows = [score("the Eiffel Tower", ["Eiffel Tower"]), score("no", ["yes"])]
    aggregate(rows)   # {'n': 2, 'em': 0.5, 'f1': 0.5}

Normalisation (``normalize_answer``) follows the official SQuAD v1.1 script: lowercase, drop ASCII
punctuation, drop the articles a/an/the, collapse whitespace. F1 follows HotpotQA's official script:
if the normalised prediction or the normalised gold is one of yes / no / noanswer and the two differ,
F1 is 0 (no partial credit for "no" against "yes, it is"). With several gold answers (the canonical
answer and its aliases) each metric takes the maximum over the golds. A missing prediction (None)
scores 0 on both metrics; it is a wrong answer, not a failed measurement.
"""

from __future__ import annotations

import math
import re
import string
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence

_PUNCTUATION = set(string.punctuation)
_ARTICLES = re.compile(r"\b(a|an|the)\b")
_SPECIAL = ("yes", "no", "noanswer")


def normalize_answer(text: str) -> str:
    """Lowercase, remove punctuation, remove articles, collapse whitespace (SQuAD v1.1 order)."""
    text = text.lower()
    text = "".join(ch for ch in text if ch not in _PUNCTUATION)
    text = _ARTICLES.sub(" ", text)
    return " ".join(text.split())


def _golds(golds: str | Sequence[str]) -> list[str]:
    golds = [golds] if isinstance(golds, str) else list(golds)
    if not golds:
        raise ValueError("at least one gold answer is needed")
    return golds


def _f1_single(prediction: str, gold: str) -> float:
    pred_norm, gold_norm = normalize_answer(prediction), normalize_answer(gold)
    if pred_norm in _SPECIAL and pred_norm != gold_norm:
        return 0.0
    if gold_norm in _SPECIAL and pred_norm != gold_norm:
        return 0.0
    pred_tokens, gold_tokens = pred_norm.split(), gold_norm.split()
    if not pred_tokens or not gold_tokens:
        # SQuAD v2 convention: two empty answers agree, one empty answer scores 0
        return float(pred_tokens == gold_tokens)
    common = Counter(pred_tokens) & Counter(gold_tokens)
    num_same = sum(common.values())
    if num_same == 0:
        return 0.0
    precision = num_same / len(pred_tokens)
    recall = num_same / len(gold_tokens)
    return 2 * precision * recall / (precision + recall)


def exact_match(prediction: str | None, golds: str | Sequence[str]) -> float:
    """1.0 if the normalised prediction equals any normalised gold, else 0.0."""
    golds = _golds(golds)
    if prediction is None:
        return 0.0
    pred = normalize_answer(prediction)
    return float(any(pred == normalize_answer(g) for g in golds))


def f1_score(prediction: str | None, golds: str | Sequence[str]) -> float:
    """Token F1 between the normalised prediction and the best-matching gold (HotpotQA yes/no rule)."""
    golds = _golds(golds)
    if prediction is None:
        return 0.0
    return max(_f1_single(prediction, g) for g in golds)


def exact_match_yes_no_first3(prediction: str | None, golds: str | Sequence[str]) -> float:
    """ARCO's reported EM variant (not standard EM, which :func:`exact_match` keeps): standard EM, and also
    correct when a gold answer is yes/no and the first yes/no word among the first three normalised tokens
    of the prediction is that word ("Yes, both are American" against "yes" counts; "no" against "yes"
    does not). Report it beside standard EM, under its own name."""
    golds = _golds(golds)
    if prediction is None or exact_match(prediction, golds):
        return exact_match(prediction, golds)
    head = [t for t in normalize_answer(prediction).split()[:3] if t in ("yes", "no")]
    return float(bool(head) and any(normalize_answer(g) == head[0] for g in golds))


def score(prediction: str | None, golds: str | Sequence[str]) -> dict[str, float]:
    """Both metrics for one question: ``{'em': ..., 'f1': ...}``."""
    return {"em": exact_match(prediction, golds), "f1": f1_score(prediction, golds)}


def aggregate(rows: Iterable[Mapping[str, object]]) -> dict[str, float]:
    """Mean of every numeric field over the rows that have it, plus ``n`` (the number of rows).

    Non-numeric values are ignored, and so are None and NaN: a question with no score (a failed judge,
    say) leaves that metric's mean over the others rather than counting as 0. Booleans count as 0/1.
    A metric that no row scored is absent from the result.
    """
    rows = list(rows)
    sums: dict[str, float] = {}
    counts: dict[str, int] = {}
    for row in rows:
        for key, value in row.items():
            if isinstance(value, bool):
                value = float(value)
            if not isinstance(value, (int, float)) or math.isnan(value):
                continue
            sums[key] = sums.get(key, 0.0) + float(value)
            counts[key] = counts.get(key, 0) + 1
    out: dict[str, float] = {"n": len(rows)}
    for key, total in sums.items():
        if key != "n":
            out[key] = total / counts[key]
    return out
