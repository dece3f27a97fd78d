"""The judgment kinds the simulated judge (:mod:`components.llm.backends.simulated`) answers from the world oracle,
each recognised by its caller's own system prompt (imported from where it is defined, so a reworded prompt is
still recognised) and answered in the format its caller parses. The methods' code is unchanged: they call the
one judge interface as always; only the backend behind the role differs.

In the lab a criterion is checked by the oracle: the names it mentions (the titles the question's gold chain looks
up, and the facts each hop finds) must all appear in what the attempt found (its actions and observations); a
criterion that mentions none of them asks for the whole chain (every hop's fact found). Kinds:

- ``answer_correct`` (components/judges/answer.py): the prediction against the references in the prompt (exact
  match, token F1 >= 0.8, or the reference inside a prediction at most three words longer), as
  ``{"correct": true|false}``;
- ``arbor_winner`` (ARBOR's pairwise judge, winner form): the attempt that meets the criterion when the other does
  not, else TIE, as ``{"winner": ...}``;
- ``arbor_verdict`` and ``arbor_single`` (its verdicts and single forms): whether the attempt asked about meets
  the criterion, as ``yes`` / ``no``;
- ``coreact_checklist`` (Co-ReAct's verifier, checklist mode): every criterion satisfied when the proposed action
  is the gold chain's next one (the paragraph of the first hop whose fact the history does not show yet, or the last
  search refined; a browse of a gold paragraph; the right answer);
- ``arbor_induction``: from each contrast, a rubric naming the first gold fact the better attempt found and the
  worse did not ("finds Torvel Ashmere": checkable by the oracle); a flip writes it from the worse side;
- ``arbor_consolidation``: the drafts merge into one general standard, "follows the chain" (every fact found).

Not simulated yet (they fail as ``call_failed``, never a score): Co-ReAct's council ranking (slates), rubric
evaluator and criterion-mode verifier, ARBOR's RaR checklist and rating, RubricEM's stage scores and reflection
judge, ARCO's teacher step scores.

    from components.llm.backends.simulated import SimulatedJudge, Oracle, Dial
    judge = SimulatedJudge(Oracle(questions), Dial(flip_rate=0.2))
"""

from __future__ import annotations

import json
import re

from components.evaluation.metrics import exact_match, f1_score, normalize_answer
from components.judges import answer
from components.judges.render import LOOKALIKES
from components.llm.backends.simulated import KINDS, Judgment, JudgmentKind, Oracle
from components.llm.base import Message
from components.methods.arbor import induction
from components.methods.arbor import pairwise_judge as arbor
from components.methods.coreact import verifier as coreact_verifier
from components.schemas import Question
from components.world.oracle import hop_titles

__all__ = ["criterion_met", "found_facts", "mentions", "plain", "run_questions"]

_PLAIN = str.maketrans({v: k for k, v in LOOKALIKES.items()})


def plain(text: str) -> str:
    """``text`` with :func:`components.judges.render.untrusted`'s look-alike characters mapped back."""
    return text.translate(_PLAIN)


def run_questions(params) -> list[Question]:
    """The questions a run's judges may be asked about: the lab world's, and the run's prepared splits when the
    prepare stage wrote them."""
    from components.io import read_jsonl
    from components.lab.policy import lab_seed
    from components.lab.world import build_lab_world
    from components.run_files import out_path

    questions = list(build_lab_world(params, lab_seed(params)).questions)
    for split in ("train", "dev", "test"):
        path = out_path(params, "data", f"{split}.jsonl")
        if path.exists():
            questions += read_jsonl(path, Question)
    return questions


def _names(question: Question) -> list[str]:
    return list(dict.fromkeys([*hop_titles(question), *(h.answer for h in question.gold_chain)]))


def mentions(text: str, name: str) -> bool:
    """``name`` as whole words in ``text``, case ignored (Morelrara is not in "a Morelraran engineer")."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE) is not None


def found_facts(question: Question, attempt: str) -> int:
    """How many of the gold chain's hop facts the attempt's text shows."""
    return sum(mentions(attempt, h.answer) for h in question.gold_chain)


def criterion_met(question: Question, criterion: str, attempt: str) -> bool:
    """The lab's reading of a criterion (module doc)."""
    named = [n for n in _names(question) if len(n) > 3 and mentions(criterion, n)]
    if named:
        return all(mentions(attempt, n) for n in named)
    return found_facts(question, attempt) == len(question.gold_chain)


def _question(messages: list[Message], oracle: Oracle) -> Question:
    q = oracle.find(plain(messages[-1].content))
    if q is None:
        from components.llm.base import PermanentLLMError

        raise PermanentLLMError("simulated judge: the prompt's question is not one the oracle knows")
    return q


def _system_is(prompt: str):
    return lambda messages: bool(messages) and messages[0].role == "system" and messages[0].content == prompt


def _between(text: str, start: str, *ends: str) -> str:
    at = text.index(start) + len(start)
    stops = [text.find(e, at) for e in ends if text.find(e, at) >= 0]
    return text[at:min(stops)] if stops else text[at:]


# -- answer correctness ------------------------------------------------------------------------------------
def _same_thing(prediction: str, reference: str) -> bool:
    """The reference's words, in order, inside a prediction at most three words longer (extra harmless words), or
    token F1 >= 0.8."""
    pred, ref = normalize_answer(prediction).split(), normalize_answer(reference).split()
    inside = bool(ref) and any(pred[i:i + len(ref)] == ref for i in range(len(pred) - len(ref) + 1))
    return (inside and len(pred) - len(ref) <= 3) or f1_score(prediction, [reference]) >= 0.8


def _read_answer(messages: list[Message], oracle: Oracle) -> Judgment:
    content = plain(messages[-1].content)
    refs = _between(content, "Reference answers: ", "\n").split(" | ")
    prediction = _between(content, "Predicted answer: ")
    truth = bool(exact_match(prediction, refs)) or any(_same_thing(prediction, r) for r in refs)
    return Judgment(truth, lambda v: json.dumps({"correct": bool(v)}), attempts=[prediction])


KINDS.register("answer_correct")(JudgmentKind("answer_correct", _system_is(answer.JUDGE_SYSTEM), _read_answer))


# -- ARBOR's pairwise judge ---------------------------------------------------------------------------------
def _arbor_parts(content: str, pair: bool) -> tuple[list[str], str]:
    criterion_end = ("\n\nDoes attempt",)
    criterion = _between(content, "Criterion: ", *criterion_end)
    if pair:
        a = _between(content, "Attempt A:\n", "\n\nAttempt B:\n")
        b = _between(content, "Attempt B:\n", "\n\nReference notes", "\nCriterion: ")
        return [a, b], criterion
    return [_between(content, "Attempt:\n", "\n\nReference notes", "\nCriterion: ")], criterion


def _winner(flags: list[bool]) -> str:
    return "A" if flags[0] and not flags[1] else "B" if flags[1] and not flags[0] else "TIE"


def _read_winner(messages: list[Message], oracle: Oracle) -> Judgment:
    q = _question(messages, oracle)
    attempts, criterion = _arbor_parts(plain(messages[-1].content), pair=True)
    truth = _winner([criterion_met(q, criterion, a) for a in attempts])
    return Judgment(truth, lambda v: json.dumps({"winner": v}), attempts=attempts, gold_turns=len(q.gold_chain) + 1)


def _read_verdict(messages: list[Message], oracle: Oracle) -> Judgment:
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    attempts, criterion = _arbor_parts(content, pair=True)
    about = 0 if content.rstrip().endswith("Does attempt A meet the criterion? Answer yes or no.") else 1
    return Judgment(criterion_met(q, criterion, attempts[about]), lambda v: "yes" if v else "no", attempts=attempts,
                    about=about, gold_turns=len(q.gold_chain) + 1)


def _read_single(messages: list[Message], oracle: Oracle) -> Judgment:
    q = _question(messages, oracle)
    attempts, criterion = _arbor_parts(plain(messages[-1].content), pair=False)
    return Judgment(criterion_met(q, criterion, attempts[0]), lambda v: "yes" if v else "no", attempts=attempts,
                    gold_turns=len(q.gold_chain) + 1)


KINDS.register("arbor_winner")(JudgmentKind("arbor_winner", _system_is(arbor.JUDGE_SYSTEM), _read_winner))
KINDS.register("arbor_verdict")(JudgmentKind("arbor_verdict", _system_is(arbor.VERDICT_SYSTEM), _read_verdict))
KINDS.register("arbor_single")(JudgmentKind("arbor_single", _system_is(arbor.SINGLE_SYSTEM), _read_single))


# -- Co-ReAct's verifier, checklist mode --------------------------------------------------------------------
_ACTION = re.compile(r"^(search|browse|finish)\[(.*)\]$", re.DOTALL)


def _good_action(q: Question, history: str, action: str) -> bool:
    m = _ACTION.match(action.strip())
    if not m:
        return False
    kind, arg = m.group(1), m.group(2).strip()
    searched = re.findall(r"action: search\[(.*?)\]", history)
    if kind == "finish":
        return bool(exact_match(arg, q.answers))
    if kind == "browse":
        return arg in {h.doc_id for h in q.gold_chain}
    titles = hop_titles(q)
    # the paragraph of the first hop whose fact the history does not show yet
    wanted = [next((t for h, t in zip(q.gold_chain, titles) if not mentions(history, h.answer)), None)]
    if searched and searched[-1] in titles and normalize_answer(searched[-1]) != normalize_answer(arg):
        wanted.append(searched[-1])  # the same hop again, refined ("Corumbre city" after "Corumbre")
    return any(t is not None and normalize_answer(t) in normalize_answer(arg) for t in wanted)


def _read_checklist(messages: list[Message], oracle: Oracle) -> Judgment:
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    n = int(re.search(r"Checklist \((\d+) criteria\)", content).group(1))
    history = _between(content, "What the agent has done so far:\n", "\n\nAgent's reasoning: ")
    action = _between(content, "Proposed action: ", "\n\nChecklist")
    good = _good_action(q, history, action)
    reason = "follows the gold chain" if good else "does not take the next step of the chain"
    return Judgment(good, lambda v: json.dumps({"verdicts": [{"satisfied": bool(v), "reason": reason}] * n}),
                    attempts=[action])


KINDS.register("coreact_checklist")(JudgmentKind("coreact_checklist", _system_is(coreact_verifier.SYSTEM_PROMPT),
                                                 _read_checklist))


# -- ARBOR's rubric induction and consolidation -------------------------------------------------------------
def _fact_rubric(q: Question, hop: int) -> dict[str, str]:
    h = q.gold_chain[hop]
    return {"title": f"finds {h.answer}", "description": f"reads the paragraph that says {h.question} {h.answer}",
            "counter_description": f"never reaches the paragraph that names {h.answer}"}


def _contrasts(content: str) -> list[tuple[str, str]]:
    pairs = []
    for block in content.split("=== Contrast ")[1:]:
        hi = _between(block, "--- Higher-scoring attempt ---\n", "\n--- Lower-scoring attempt ---")
        lo = _between(block, "--- Lower-scoring attempt ---\n", "\n\n=== Contrast ", "\n\nExisting rubrics")
        pairs.append((hi, lo))
    if not pairs and "--- Attempt 1 ---" in content:  # unlabelled: the oracle ranks them by the facts they found
        attempts = [_between(b, "---\n", "\n\n--- Attempt ", "\n\nExisting rubrics")
                    for b in content.split("--- Attempt ")[1:]]
        pairs = [(a, b) for a in attempts for b in attempts if a is not b]
    return pairs


def _read_induction(messages: list[Message], oracle: Oracle) -> Judgment:
    """A rubric naming the first gold fact the better attempt of a contrast found and the worse did not (none when
    no contrast differs in a fact, or the existing rubrics already name it). A flip writes it from the worse
    attempt's side: a fact it found and the better did not, when there is one."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    existing = _between(content, "Existing rubrics (do not repeat):\n", "\n\nWrite between")
    limit = int(re.search(r"Write between 1 and (\d+) rubrics", content).group(1))
    pairs = _contrasts(content)

    def write(verdict) -> str:
        rubrics = []
        for hi, lo in pairs:
            better, worse = (hi, lo) if verdict != "B" else (lo, hi)
            for k, h in enumerate(q.gold_chain):
                if mentions(better, h.answer) and not mentions(worse, h.answer) and not mentions(
                        existing, f"finds {h.answer}"):
                    rubric = _fact_rubric(q, k)
                    if rubric not in rubrics:
                        rubrics.append(rubric)
                    break
        return json.dumps({"rubrics": rubrics[:limit]})

    return Judgment("A", write, attempts=[hi for hi, _ in pairs[:1]] + [lo for _, lo in pairs[:1]],
                    gold_turns=len(q.gold_chain) + 1)


GENERAL = {"title": "follows the chain", "description": "finds each fact the question's chain needs, one hop at a time, "
           "and answers from the last one", "counter_description": "stops before the chain's last fact is found"}


def _read_consolidation(messages: list[Message], oracle: Oracle) -> Judgment:
    """The question-specific drafts merge into the one standard the oracle checks on any question: every fact of
    the chain found (a criterion that names no fact, :func:`criterion_met`); none when it is already in use."""
    content = plain(messages[-1].content)
    in_use = GENERAL["title"] in _between(content, "Standards already in use (do not duplicate):\n",
                                          "\n\nCandidate rubrics")
    return Judgment(not in_use, lambda v: json.dumps({"rubrics": [GENERAL] if v else []}))


KINDS.register("arbor_induction")(JudgmentKind("arbor_induction", _system_is(induction.INDUCTION_SYSTEM),
                                               _read_induction))
KINDS.register("arbor_consolidation")(JudgmentKind("arbor_consolidation", _system_is(induction.CONSOLIDATION_SYSTEM),
                                                   _read_consolidation))
