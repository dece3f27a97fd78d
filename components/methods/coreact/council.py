"""The expert council of Co-ReAct 3.1: permuted listwise judging of a slate, strict parsing, Borda consensus. Every
judge sees the slate under its own random permutation with neutral labels (X, Y, Z, W, then V, U, ...) and returns
a best-to-worst ranking with a short rationale; a judge whose call fails or whose reply does not parse gives an
invalid vote, recorded with its error and left out of the Borda count (never a score), and a branching point is
kept only when at least ``min_valid`` judges gave a valid ranking (:func:`judge_slate`). With ``orders`` > 1 each
judge ranks the slate once in each of that many balanced orders (the paper's council ranks once: why here more,
docs/methods/coreact.md).

    votes, consensus, scores, kept = await judge_slate(   # render_prefix: components.judges.render
        judges, question, render_prefix(steps), [c.action for c in slate], rng_seed=17, min_valid=2)
    consensus[0]          # slate position of the council's best action
    agreement(votes)      # Kendall tau between judges, label of each judge's top pick
"""

from __future__ import annotations

import asyncio
import itertools
import math
import random
import re
from collections import Counter
from collections.abc import Callable, Iterable, Sequence
from typing import Any, NamedTuple

from scipy.stats import kendalltau

from components.judges.call import Failure, JudgeCall, Judgment, Unparsed, ask
from components.judges.orders import balanced_orders
from components.judges.render import render_prefix, untrusted  # noqa: F401 - a script imports render_prefix here
from components.llm.base import ChatModel, Message, Sampling
from components.llm.json_reply import json_objects
from components.schemas import JudgeVote, Question

BASE_LABELS = ["X", "Y", "Z", "W"] + [c for c in "VUTSRQPONMLKJIHGFEDCBA"]

SYSTEM_PROMPT = (
    "You review the work of a question-answering agent that searches a document collection. "
    "You compare possible next steps and rank them by how much each one helps reach a correct, "
    "well-supported answer."
)


def neutral_labels(k: int) -> list[str]:
    if not 1 <= k <= len(BASE_LABELS):
        raise ValueError(f"slates of 1..{len(BASE_LABELS)} candidates are supported, got {k}")
    return BASE_LABELS[:k]


def ranking_schema(labels: Sequence[str]) -> dict[str, Any]:
    """JSON schema of a judge reply, for backends with structured output. It asks for exactly k plain
    labels: grammar-constrained decoders (llama.cpp, vLLM) then cannot stop after the top one or two,
    which small judges otherwise do. Ties stay possible in free-text replies, which the parser accepts."""
    return {
        "type": "object",
        "properties": {
            "rationale": {"type": "string", "description": "One or two sentences on what decided the order."},
            "ranking": {
                "type": "array", "minItems": len(labels), "maxItems": len(labels), "uniqueItems": True,
                "description": "Every label once, from best to worst.",
                "items": {"type": "string", "enum": list(labels)},
            },
        },
        "required": ["rationale", "ranking"],
        "additionalProperties": False,
    }


def reference_notes(question: Question) -> str:
    """The gold answer and, when the question has one, its hop chain: what a reference-guided judge is
    shown (``collect.judge_reference``). The agent and the rubric generator never see it."""
    answer = f'The correct answer is "{question.answers[0]}".'
    if not question.gold_chain:
        return answer
    hops = "\n".join(f"{i}. {hop.question} -> {hop.answer}" for i, hop in enumerate(question.gold_chain, 1))
    return f"{answer} It follows from these facts, found in this order:\n{hops}"


def build_messages(question: str, prefix_text: str, shown: Sequence[tuple[str, str]],
                   reference: str | None = None) -> list[Message]:
    """The listwise ranking prompt; ``shown`` is (label, action) in the order the judge sees them, each action
    :func:`~components.judges.render.untrusted` (``prefix_text`` comes from :func:`render_prefix`, which is).
    ``reference`` (see ``reference_notes``) adds what the judge may use but the agent has not seen."""
    labels = [lab for lab, _ in shown]
    candidates = "\n".join(f"[{lab}] {untrusted(' '.join(action.split()))}" for lab, action in shown)
    history = prefix_text.strip() or "(nothing yet: this is the first step)"
    notes = (
        f"Reference notes, for you only (the agent has not seen them):\n{reference.strip()}\n"
        "Use them to tell which step gets the agent closer to the next fact it is missing; a final answer "
        "that disagrees with the reference is a bad step.\n\n"
    ) if reference else ""
    user = (
        f"Question:\n{question}\n\n"
        f"{notes}"
        f"What the agent has done so far:\n{history}\n\n"
        f"Candidate next actions (the labels are arbitrary and say nothing about quality):\n{candidates}\n\n"
        f"Rank all {len(labels)} candidates from the most useful next step to the least useful. "
        "A useful step looks up a fact the answer still depends on, follows the chain of facts the "
        "question needs, does not repeat a search whose results are already in the history, and "
        "answers only once the evidence supports the answer.\n\n"
        "Reply with one JSON object and nothing else, in this form:\n"
        '{"rationale": "<one or two sentences>", "ranking": ["<best label>", ..., "<worst label>"]}\n'
        f"Use each of the labels {', '.join(labels)} exactly once. If two candidates are equally good, put "
        'their labels together in an inner list, e.g. [["<label>", "<label>"], ...].'
    )
    return [Message(role="system", content=SYSTEM_PROMPT), Message(role="user", content=user)]


# ---------------------------------------------------------------- parsing


class ParsedRanking(NamedTuple):
    groups: list[list[str]] | None  # tie groups of labels, best first; None when invalid
    rationale: str
    error: str | None


_SEP = r"(?:>>?|=+|,|->|→|≻)"
_TOKEN = r"[\[\(\"'`*]*\s*[A-Za-z]\s*[\]\)\"'`*]*"
_LEAD = re.compile(  # a "Final ranking:" style prefix before a ranking line
    r"^\s*[#>*\-\s]*[\"']?(?:final\s+)?(?:ranking|answer|order)[\"']?\s*[:=]\s*", re.IGNORECASE
)
_LINE = re.compile(rf"^\s*{_TOKEN}(?:\s*{_SEP}\s*{_TOKEN})+\s*\.?\s*$")


def _clean(token: Any) -> str:
    return str(token).strip().strip("[]()\"'`* .").upper()


def _split_ranking_string(s: str) -> list[list[str]]:
    groups = re.split(r"\s*(?:>>?|,|->|→|≻)\s*", s.strip().rstrip("."))
    return [[t for t in re.split(r"\s*=+\s*", g) if t.strip()] for g in groups if g.strip()]


def _groups_from_json(value: Any) -> list[list[str]] | str:
    """Tie groups from a JSON ranking value, or an error message."""
    if isinstance(value, str):
        return _split_ranking_string(value)
    if not isinstance(value, list):
        return f"'ranking' must be a list or a string, got {type(value).__name__}"
    groups = []
    for item in value:
        if isinstance(item, list):
            if not item or not all(isinstance(t, str) for t in item):
                return "a tie group must be a non-empty list of labels"
            groups.append(list(item))
        elif isinstance(item, str):
            groups.extend(_split_ranking_string(item) if re.search(r"[>=,]", item) else [[item]])
        else:
            return f"unexpected ranking item {item!r}"
    return groups


def _validate(groups: list[list[str]], labels: Sequence[str]) -> tuple[list[list[str]] | None, str | None]:
    cleaned = [[_clean(t) for t in g] for g in groups]
    flat = [t for g in cleaned for t in g]
    unknown = [t for t in flat if t not in labels]
    if unknown:
        return None, f"unknown label {unknown[0]!r} (expected {', '.join(labels)})"
    repeated = [t for t, c in Counter(flat).items() if c > 1]
    if repeated:
        return None, f"label {repeated[0]!r} appears more than once"
    missing = [lab for lab in labels if lab not in flat]
    if missing:
        return None, f"partial ranking: missing {', '.join(missing)}"
    return cleaned, None


def parse_ranking(text: str, labels: Sequence[str]) -> ParsedRanking:
    """Parse a judge reply: a JSON object with 'ranking' (fenced or with text around), else the last
    line that is only labels joined by '>', '=', ',' or '->'. A JSON 'ranking' that fails validation
    makes the reply invalid (no fallback to other text)."""
    if not text or not text.strip():
        return ParsedRanking(None, "", "empty reply")
    for obj in json_objects(text, repair_truncated=True):  # a reply cut just before its last brace counts
        if "ranking" not in obj:
            continue
        rationale = str(obj.get("rationale") or obj.get("reason") or obj.get("explanation") or "")
        groups = _groups_from_json(obj["ranking"])
        if isinstance(groups, str):
            return ParsedRanking(None, rationale, groups)
        valid, error = _validate(groups, labels)
        return ParsedRanking(valid, rationale, error)
    lines = text.strip().splitlines()
    for n in range(len(lines) - 1, -1, -1):
        line = _LEAD.sub("", lines[n])
        line = line.replace("**", "").strip()
        if _LINE.match(line):
            rationale = "\n".join(lines[:n] + lines[n + 1:]).strip()
            valid, error = _validate(_split_ranking_string(line), labels)
            return ParsedRanking(valid, rationale, error)
    return ParsedRanking(None, "", "no ranking found in the reply")


# ---------------------------------------------------------------- judging


def permutations_for(n_judges: int, k: int, rng_seed: int) -> list[list[int]]:
    """One random permutation of the slate per judge, reproducible from ``rng_seed``."""
    rng = random.Random(rng_seed)
    return [rng.sample(range(k), k) for _ in range(n_judges)]


def ranking_parser(labels: Sequence[str]) -> Callable[[str], ParsedRanking]:
    """The parse function of a council call: a valid :class:`ParsedRanking`, or :class:`Unparsed` with the
    parser's error (and the rationale, which the invalid vote keeps)."""
    def parse(text: str) -> ParsedRanking:
        parsed = parse_ranking(text, labels)
        if parsed.groups is None:
            raise Unparsed(parsed.error, partial=parsed.rationale)
        return parsed

    return parse


def ranking_call(messages: list[Message], labels: Sequence[str], sampling: Sampling) -> JudgeCall[ParsedRanking]:
    """One judge's ranking of one shown order, under :func:`ranking_schema` (structured output)."""
    return JudgeCall(messages, ranking_parser(labels), sampling, schema=ranking_schema(labels))


def vote_from_reply(judge: str, permutation: list[int], labels: list[str], result: Judgment) -> JudgeVote:
    """Turn a judgment into a vote; a failure is an invalid vote with its error (and, when the reply did not
    parse, the rationale it gave)."""
    base = {"judge": judge, "permutation": permutation, "labels": labels, "latency_s": result.latency_s}
    if isinstance(result, Failure):
        if result.kind == "call_failed":
            return JudgeVote(**base, valid=False, error=f"judge call failed: {result.describe()}")
        return JudgeVote(**base, rationale=result.partial or "", valid=False, error=result.reason)
    parsed = result.value
    ranking = [[permutation[labels.index(lab)] for lab in g] for g in parsed.groups]
    return JudgeVote(**base, ranking=ranking, rationale=parsed.rationale, valid=True)


def borda(votes: Sequence[JudgeVote], k: int) -> list[float]:
    """Borda score per slate position over the valid votes: with k candidates a ranking gives k-1 points to its
    first place down to 0 for its last, and a tie group shares the mean of the points of the places it spans."""
    scores = [0.0] * k
    for vote in votes:
        if not vote.valid:
            continue
        if sorted(p for g in vote.ranking for p in g) != list(range(k)):
            raise ValueError(f"vote of {vote.judge!r} is marked valid but does not rank 0..{k - 1} once each")
        place = 0
        for group in vote.ranking:
            points = sum(k - 1 - p for p in range(place, place + len(group))) / len(group)
            for pos in group:
                scores[pos] += points
            place += len(group)
    return scores


def consensus_order(scores: Sequence[float]) -> list[int]:
    """Slate positions by Borda score, best first; equal scores keep slate order."""
    return sorted(range(len(scores)), key=lambda p: (-scores[p], p))


class CouncilOutcome(NamedTuple):
    votes: list[JudgeVote]
    consensus: list[int]
    scores: list[float]
    kept: bool


def council_calls(n_judges: int, k: int, rng_seed: int, orders: int = 1) -> list[tuple[int, list[int]]]:
    """(judge index, permutation) of every call: one random permutation per judge (:func:`permutations_for`),
    or with ``orders`` > 1 the first ``min(orders, k)`` balanced orders of a permutation drawn per judge."""
    if orders == 1:
        return list(enumerate(permutations_for(n_judges, k, rng_seed)))
    return [(i, perm) for i in range(n_judges) for perm in balanced_orders(f"{rng_seed}:{i}", k)[:orders]]


async def judge_slate(
    judges: Sequence[ChatModel], question: str, prefix_text: str, slate_actions: Sequence[str],
    rng_seed: int, min_valid: int = 2, sampling: Sampling | None = None, reference: str | None = None,
    orders: int = 1,
) -> CouncilOutcome:
    """Ask every judge concurrently, ``orders`` times each; Borda over the valid votes; keep only when
    ``min_valid`` judges gave at least one valid vote. ``reference`` goes into every judge's prompt
    (reference-guided judging; None: the paper's council). With ``orders`` > 1 the orders are cyclic shifts of the
    judge's own drawn permutation (:mod:`components.judges.orders`): every action is shown once at every position
    when ``orders`` equals the slate's size, so a judge that ranks by position alone adds the same points to every
    action. Each order is a vote of that judge."""
    if orders < 1:
        raise ValueError(f"orders must be at least 1, got {orders}")
    k = len(slate_actions)
    labels = neutral_labels(k)
    calls = council_calls(len(judges), k, rng_seed, orders)
    sampling = sampling or Sampling(temperature=0.0, max_tokens=512)
    prompts = [
        build_messages(question, prefix_text, [(labels[j], slate_actions[p]) for j, p in enumerate(perm)], reference)
        for _, perm in calls
    ]
    results = await asyncio.gather(*(ask(judges[i], ranking_call(m, labels, sampling))
                                     for (i, _), m in zip(calls, prompts, strict=True)))
    # the role (e.g. council_judges[1]) tells judges apart even when two share one backend model
    names = [getattr(j, "role", None) or getattr(j, "name", f"judge{i}") for i, j in enumerate(judges)]
    votes = [vote_from_reply(names[i], perm, labels, r) for (i, perm), r in zip(calls, results, strict=True)]
    scores = borda(votes, k)
    kept = len({i for (i, _), v in zip(calls, votes, strict=True) if v.valid}) >= min_valid
    return CouncilOutcome(votes, consensus_order(scores), scores, kept)


# ---------------------------------------------------------------- agreement


def rank_vector(vote: JudgeVote, k: int) -> list[int]:
    """Place (0 = best) of each slate position; tied positions share a place."""
    places = [0] * k
    for place, group in enumerate(vote.ranking):
        for pos in group:
            places[pos] = place
    return places


class Agreement(NamedTuple):
    mean_tau: float | None      # mean pairwise Kendall tau-b between judges (None: no usable pair)
    n_pairs: int                # pairs of judges that entered the mean
    winner_labels: Counter      # label under which each valid vote saw the consensus winner
    top_labels: Counter         # labels each valid vote put in its first tie group
    mean_self_tau: float | None = None  # mean tau between two orders of one judge (None: one order each)


def _mean_tau(pairs: Iterable[tuple[Sequence[float], Sequence[float]]]) -> tuple[float | None, int]:
    taus = [float(t) for a, b in pairs if not math.isnan(t := kendalltau(a, b).statistic)]
    return (sum(taus) / len(taus) if taus else None), len(taus)


def agreement(votes: Sequence[JudgeVote], scores: Sequence[float] | None = None) -> Agreement:
    """Inter-judge agreement and position-bias counts for one slate (sum the Counters over many). A judge
    that voted in several orders is compared by its Borda scores over them; ``mean_self_tau`` compares its
    orders with each other (near 0: it ranks by position, not by the actions)."""
    valid = [v for v in votes if v.valid]
    k = len(valid[0].permutation) if valid else 0
    by_judge: dict[str, list[JudgeVote]] = {}
    for v in valid:
        by_judge.setdefault(v.judge, []).append(v)
    judge_scores = [borda(vs, k) for vs in by_judge.values()]
    mean_tau, n_pairs = _mean_tau(itertools.combinations(judge_scores, 2))
    mean_self_tau, _ = _mean_tau((rank_vector(a, k), rank_vector(b, k)) for vs in by_judge.values()
                                 for a, b in itertools.combinations(vs, 2))
    winner_labels: Counter = Counter()
    top_labels: Counter = Counter()
    if valid:
        winner = consensus_order(scores if scores is not None else borda(valid, k))[0]
        for v in valid:
            winner_labels[v.labels[v.permutation.index(winner)]] += 1
            top_labels.update(v.labels[v.permutation.index(p)] for p in v.ranking[0])
    return Agreement(mean_tau, n_pairs, winner_labels, top_labels, mean_self_tau)
