"""The judgment kinds the simulated judge (:mod:`components.llm.backends.simulated`) answers from the world oracle,
one for every judgment the four methods make (answer correctness; ARBOR's pairwise, induction, consolidation and
RaR judgments; Co-ReAct's rubric generator, verifier, council, rubric evaluator and best-of-N scorer; RubricEM's
stage rubrics, stage scores and reflection ratings; ARCO's teacher criteria): each is recognised by its caller's
own system prompt (imported from where it is defined, so a reworded prompt is still recognised), read against what
the attempt found of the question's gold chain (each reader's docstring says how) and answered in the format its
caller parses, so the methods' code is unchanged.

    from components.llm.backends.simulated import SimulatedJudge, Oracle, Dial
    judge = SimulatedJudge(Oracle(questions), Dial(flip_rate=0.2))
"""

from __future__ import annotations

import json
import re
import string

from components.evaluation.metrics import exact_match, f1_score, normalize_answer
from components.judges import answer
from components.judges.render import LOOKALIKES
from components.llm.backends.simulated import KINDS, Judgment, JudgmentKind, Oracle, Ranking, Score
from components.llm.base import Message
from components.methods.arbor import induction, rar
from components.methods.arbor import pairwise_judge as arbor
from components.methods.arco import criteria as arco_criteria
from components.methods.coreact import baselines, council, rubric_eval
from components.methods.coreact import rubric_generator as coreact_generator
from components.methods.coreact import verifier as coreact_verifier
from components.methods.coreact.oracle_rubrics import hop_rubric, next_hop
from components.methods.rubricem import reflection
from components.methods.rubricem import stagewise_judge as stagewise
from components.schemas import Question
from components.world.oracle import hop_titles

__all__ = ["action_meets", "action_value", "criterion_met", "found_facts", "hops_done", "lookups", "mentions", "plain", "rar_items",
           "reflection_rating", "run_questions", "stage_blocks", "stage_rubrics", "stage_score", "teacher_criteria"]

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

    questions = []  # the run's own splits first: a question's text found in two worlds is read as the run's
    for split in ("train", "dev", "test"):
        path = out_path(params.run, "data", f"{split}.jsonl")
        if path.exists():
            questions += read_jsonl(path, Question)
    return questions + list(build_lab_world(params, lab_seed(params)).questions)


def _names(question: Question) -> list[str]:
    return list(dict.fromkeys([*hop_titles(question), *(h.answer for h in question.gold_chain)]))


def mentions(text: str, name: str) -> bool:
    """``name`` as whole words in ``text``, case ignored (Morelrara is not in "a Morelraran engineer")."""
    return re.search(rf"(?<!\w){re.escape(name)}(?!\w)", text, re.IGNORECASE) is not None


def found_facts(question: Question, attempt: str) -> int:
    """How many of the gold chain's hop facts the attempt's text shows."""
    return sum(mentions(attempt, h.answer) for h in question.gold_chain)


HOP_STANDARDS = (  # general standards of one hop each, worded apart so ARBOR's de-duplication keeps them all
    {"title": "opens the chain", "description": "reads the page of the entity the question names and notes the fact "
     "that page gives for it", "counter_description": "answers without reading the named entity's page"},
    {"title": "takes a second step", "description": "follows the first fact found to its own page instead of "
     "answering from the opening page", "counter_description": "stops at the opening page"},
    {"title": "goes three pages deep", "description": "keeps tracing links until a third fact is in hand",
     "counter_description": "gives up after two pages"},
    {"title": "completes a long chain", "description": "traces a four-link trail to the end before any final reply",
     "counter_description": "replies with links still unfollowed"},
)


def hop_of(criterion: str) -> int | None:
    """The hop (1-based) of the :data:`HOP_STANDARDS` ``criterion`` is, by its title; None for any other."""
    return next((k for k, r in enumerate(HOP_STANDARDS, 1) if r["title"] in criterion.casefold()), None)


def criterion_met(question: Question, criterion: str, attempt: str) -> bool:
    """The lab's reading of a criterion: the names it mentions (the titles the question's gold chain looks up, and
    the facts each hop finds) must all appear in what the attempt found (its actions and observations); a general
    standard of one hop (:data:`HOP_STANDARDS`: "takes a second step") asks for that hop's fact of any question (met
    by every attempt of a question with fewer hops); a criterion that mentions none of them asks for the whole chain
    (every hop's fact found)."""
    named = [n for n in _names(question) if len(n) > 3 and mentions(criterion, n)]
    if named:
        return all(mentions(attempt, n) for n in named)
    k = hop_of(criterion)
    if k is not None:
        return k > len(question.gold_chain) or mentions(attempt, question.gold_chain[k - 1].answer)
    return found_facts(question, attempt) == len(question.gold_chain)


def _question(messages: list[Message], oracle: Oracle) -> Question:
    q = oracle.find(plain(messages[-1].content))
    if q is None:
        from components.llm.base import PermanentLLMError

        raise PermanentLLMError("simulated judge: the prompt's question is not one the oracle knows")
    return q


def _system_is(prompt: str):
    return lambda messages: bool(messages) and messages[0].role == "system" and messages[0].content == prompt


def _template_is(template: str):
    """A system prompt written from ``template`` (a ``str.format`` template), whatever its fields were filled with."""
    pattern = re.compile("".join(re.escape(literal) + (".*?" if field is not None else "")
                                 for literal, field, _, _ in string.Formatter().parse(template)) + r"\Z", re.DOTALL)
    return lambda messages: bool(messages) and messages[0].role == "system" and bool(pattern.match(messages[0].content))


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
    """components/judges/answer.py's judge: the prediction against the references in the prompt (exact match, token
    F1 >= 0.8, or the reference inside a prediction at most three words longer), as ``{"correct": ...}``."""
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
    """ARBOR's pairwise judge, winner form: the attempt that meets the criterion when the other does not, else TIE."""
    q = _question(messages, oracle)
    attempts, criterion = _arbor_parts(plain(messages[-1].content), pair=True)
    truth = _winner([criterion_met(q, criterion, a) for a in attempts])
    return Judgment(truth, lambda v: json.dumps({"winner": v}), attempts=attempts, gold_turns=len(q.gold_chain) + 1)


def _read_verdict(messages: list[Message], oracle: Oracle) -> Judgment:
    """Its verdicts form: whether the attempt asked about meets the criterion, yes or no."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    attempts, criterion = _arbor_parts(content, pair=True)
    about = 0 if content.rstrip().endswith("Does attempt A meet the criterion? Answer yes or no.") else 1
    return Judgment(criterion_met(q, criterion, attempts[about]), lambda v: "yes" if v else "no", attempts=attempts,
                    about=about, gold_turns=len(q.gold_chain) + 1)


def _read_single(messages: list[Message], oracle: Oracle) -> Judgment:
    """Its single form: whether the one attempt meets the criterion, yes or no."""
    q = _question(messages, oracle)
    attempts, criterion = _arbor_parts(plain(messages[-1].content), pair=False)
    return Judgment(criterion_met(q, criterion, attempts[0]), lambda v: "yes" if v else "no", attempts=attempts,
                    gold_turns=len(q.gold_chain) + 1)


KINDS.register("arbor_winner")(JudgmentKind("arbor_winner", _system_is(arbor.JUDGE_SYSTEM), _read_winner))
KINDS.register("arbor_verdict")(JudgmentKind("arbor_verdict", _system_is(arbor.VERDICT_SYSTEM), _read_verdict))
KINDS.register("arbor_single")(JudgmentKind("arbor_single", _system_is(arbor.SINGLE_SYSTEM), _read_single))


# -- Co-ReAct's verifier, checklist mode --------------------------------------------------------------------
_ACTION = re.compile(r"^(search|browse|finish)\[(.*)\]$", re.DOTALL)


def hops_done(q: Question, history: str) -> list[bool]:
    """Per hop, whether ``history`` shows it done: its paragraph's title and its fact both written there (the
    fact alone is not enough: two hops of a comparison may share one)."""
    return [mentions(history, h.answer) and mentions(history, t) for h, t in zip(q.gold_chain, hop_titles(q))]


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
    # the paragraph of the first hop the history has not done yet
    wanted = [next((t for t, done in zip(titles, hops_done(q, history)) if not done), None)]
    if searched and searched[-1] in titles and normalize_answer(searched[-1]) != normalize_answer(arg):
        wanted.append(searched[-1])  # the same hop again, refined ("Corumbre city" after "Corumbre")
    return any(t is not None and normalize_answer(t) in normalize_answer(arg) for t in wanted)


def _read_checklist(messages: list[Message], oracle: Oracle) -> Judgment:
    """Co-ReAct's verifier, checklist mode: every criterion satisfied when the proposed action is the gold chain's
    next one (the paragraph of the first hop not done yet, or the last search refined; a browse of a gold paragraph;
    the right answer)."""
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


def hop_standard(k: int) -> dict[str, str]:
    """The general standard a draft naming hop ``k``'s fact of its question generalises to (the last for longer)."""
    return HOP_STANDARDS[min(k, len(HOP_STANDARDS)) - 1]


def _drafted_hops(content: str, oracle: Oracle) -> list[int]:
    """The hops (1-based) whose facts the candidates name, each in its own question's chain, in order of first use."""
    hops = []
    for block in content.split("\nQuestion ")[1:]:
        question = oracle.find(block.split("\n", 1)[0])
        if question is None:
            continue
        for line in (x for x in block.splitlines() if x.startswith("- finds ")):  # a draft: its first hop named
            k = next((k for k, h in enumerate(question.gold_chain, 1) if mentions(line, f"finds {h.answer}")), None)
            if k is not None and k not in hops:
                hops.append(k)
    return hops


def _read_consolidation(messages: list[Message], oracle: Oracle) -> Judgment:
    """The question-specific drafts ("finds <a hop's fact>") merge into standards the oracle checks on any question:
    one per hop the drafts name (:func:`hop_standard`, :data:`HOP_STANDARDS`), then the whole chain (a criterion that
    names no fact, :func:`criterion_met`); those already in use are left out, and at most the prompt's limit are
    written. A flip writes none."""
    content = plain(messages[-1].content)
    in_use = _between(content, "Standards already in use (do not duplicate):\n", "\n\nCandidate rubrics")
    limit = int(re.search(r"Write between 1 and (\d+) new general standards", content).group(1))
    due = [r for r in [*map(hop_standard, sorted(_drafted_hops(content, oracle))), GENERAL]
           if r["title"] not in in_use][:limit]
    return Judgment(bool(due), lambda v: json.dumps({"rubrics": due if v else []}))


KINDS.register("arbor_induction")(JudgmentKind("arbor_induction", _system_is(induction.INDUCTION_SYSTEM),
                                               _read_induction))
KINDS.register("arbor_consolidation")(JudgmentKind("arbor_consolidation", _system_is(induction.CONSOLIDATION_SYSTEM),
                                                   _read_consolidation))


# -- a proposed action against the gold chain (Co-ReAct's council, rubric evaluator, criterion-mode verifier) ------
def _words_in(name: str, text: str) -> bool:
    name = normalize_answer(name)
    return bool(name) and f" {name} " in f" {normalize_answer(text)} "


def action_value(q: Question, history: str, action: str) -> float:
    """How far along the gold chain a proposed next action gets: a right answer n + 1 (n hops); a search or browse
    of hop k's paragraph, the hop not done yet (:func:`hops_done`), k + 1; of one done already (a repeat) 0.5; a
    search for no gold paragraph 0; a wrong answer or an unreadable action -1."""
    m = _ACTION.match(action.strip())
    if not m:
        return -1.0
    kind, arg = m.group(1), m.group(2).strip()
    if kind == "finish":
        return len(q.gold_chain) + 1.0 if exact_match(arg, q.answers) else -1.0
    titles = hop_titles(q)
    hops = [k for k, (h, t) in enumerate(zip(q.gold_chain, titles))
            if (h.doc_id == arg if kind == "browse" else _words_in(t, arg))]
    done = hops_done(q, history)
    new = [k for k in hops if not done[k]]
    return new[0] + 1.0 if new else 0.5 if hops else 0.0


def action_meets(q: Question, history: str, action: str, criterion: str) -> bool:
    """The lab's reading of a criterion about one proposed action: one that names gold names (the chain's titles
    and facts) is met by an action about one of them (a search or answer that writes it, a browse of its
    paragraph); one that names none asks for the chain's next step (the checklist verifier's reading)."""
    named = [n for n in _names(q) if len(n) > 3 and mentions(criterion, n)]
    if not named:
        return _good_action(q, history, action)
    m = _ACTION.match(action.strip())
    if not m:
        return False
    kind, arg = m.group(1), m.group(2).strip()
    if kind == "browse":
        arg = " ".join(f"{t} {h.answer}" for h, t in zip(q.gold_chain, hop_titles(q)) if h.doc_id == arg)
    return any(mentions(arg, n) for n in named)


def _system_in(*prompts: str):
    return lambda messages: bool(messages) and messages[0].role == "system" and messages[0].content in prompts


def _criteria(content: str) -> list[str]:
    """A Co-ReAct checklist's criteria (``render_rubric``'s numbered lines, weights dropped)."""
    block = content[content.index("criteria):\n") + len("criteria):\n"):]
    return [c.strip() for c in re.split(r"(?m)^\d+\. \(weight [-+\d.e]+\) ", block)[1:]]


def _atomic(q: Question, criteria: list[str]) -> int:
    """The criteria the oracle can check on an action by themselves: those that name a gold name."""
    return sum(any(len(n) > 3 and mentions(c, n) for n in _names(q)) for c in criteria)


def _with_count(reply: dict, q: Question, criteria: list[str], system_prompt: str) -> str:
    if system_prompt.endswith(rubric_eval.ATOMIC_COUNT):
        reply["atomic_count"] = _atomic(q, criteria)
    return json.dumps(reply)


def _read_council(messages: list[Message], oracle: Oracle) -> Judgment:
    """The slate ranked by :func:`action_value` (equal values tied), as the council's JSON ranking."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    history = _between(content, "What the agent has done so far:\n", "\n\nCandidate next actions")
    listed = _between(content, "say nothing about quality):\n", "\n\nRank all")
    shown = [re.match(r"\[(\w)\] (.*)$", line).groups() for line in listed.splitlines()]
    labels, actions = [lab for lab, _ in shown], [a for _, a in shown]

    def write(ranking: Ranking) -> str:
        groups = [labels[g[0]] if len(g) == 1 else [labels[i] for i in g] for g in ranking.groups]
        return json.dumps({"rationale": "ordered by how far along the question's chain each step gets",
                           "ranking": groups})

    return Judgment(Ranking.by([action_value(q, history, a) for a in actions]), write, attempts=actions)


def _read_evaluator(messages: list[Message], oracle: Oracle) -> Judgment:
    """Each criterion read by :func:`action_meets`, as ``{"satisfied": [...]}`` (and the atomic count when asked)."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    history = _between(content, "What the agent has done so far:\n", "\n\nProposed next action:\n")
    action = _between(content, "Proposed next action:\n", "\n\nChecklist (")
    criteria = _criteria(content)
    parts = [Judgment(action_meets(q, history, action, c), str, attempts=[action]) for c in criteria]
    return Judgment.of(parts, lambda v: _with_count({"satisfied": list(v)}, q, criteria, messages[0].content))


def _read_slate(messages: list[Message], oracle: Oracle) -> Judgment:
    """Every (criterion, action) read by :func:`action_meets`, one verdict each, about the action shown there."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    history = _between(content, "What the agent has done so far:\n", "\n\nProposed next actions (")
    listed = _between(content, "\n\nProposed next actions (", "\n\nChecklist (")
    actions = [re.sub(r"^[A-Z]\. ", "", line) for line in listed.splitlines()[1:]]
    criteria = _criteria(content)
    parts = [Judgment(action_meets(q, history, a, c), str, attempts=actions, about=i)
             for c in criteria for i, a in enumerate(actions)]
    k = len(actions)
    return Judgment.of(parts, lambda v: _with_count({"verdicts": [list(v[r * k:(r + 1) * k]) for r in range(len(criteria))]},
                                                    q, criteria, messages[0].content))


def _read_requirement(messages: list[Message], oracle: Oracle) -> Judgment:
    """The rubric evaluator's criterion mode (the criterion-mode verifier's too): :func:`action_meets`, yes or no."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    history = _between(content, "What the agent has done so far:\n", "\n\nRequirement: ")
    criterion = _between(content, "Requirement: ", "\n\nProposed next action: ")
    action = _between(content, "Proposed next action: ", "\n\nDoes the proposed action")
    return Judgment(action_meets(q, history, action, criterion), lambda v: "yes" if v else "no", attempts=[action])


def _read_best_of_n(messages: list[Message], oracle: Oracle) -> Judgment:
    """Best-of-N's scorer: 1 + 9 x the share of the chain's facts the steps show when the final answer is right,
    1 when it is wrong (nothing supports it), as ``{"score": ...}``."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    steps = _between(content, "The agent's steps:\n", "\n\nFinal answer: ")
    answer_given = _between(content, "\n\nFinal answer: ")
    share = found_facts(q, steps) / len(q.gold_chain) if exact_match(answer_given, q.answers) else 0.0
    return Judgment(Score(1 + round(9 * share), 1, 10), lambda v: json.dumps({"score": int(v.value)}),
                    attempts=[steps])


def _read_generator(messages: list[Message], oracle: Oracle) -> Judgment:
    """Co-ReAct's rubric generator: the oracle rubric of the next step (:func:`~components.methods.coreact.
    oracle_rubrics.next_hop` on the history shown, written by ``hop_rubric``). A flip writes a wrong hop's: the
    hop before (a repeat; at the answer step, the last hop again), or at the first step the chain's last hop (a
    jump to a name not found yet)."""
    q = _question(messages, oracle)
    history = _between(plain(messages[-1].content), "What the agent has done so far:\n",
                       "\n\nWrite the checklist for the agent's next action.")
    k, n = next_hop(q, history), len(q.gold_chain)
    return Judgment(True, lambda v: hop_rubric(q, k if v else (k - 1) % n))


KINDS.register("coreact_best_of_n")(JudgmentKind("coreact_best_of_n", _system_is(baselines.SCORER_SYSTEM),
                                                 _read_best_of_n))
KINDS.register("coreact_council")(JudgmentKind("coreact_council", _system_is(council.SYSTEM_PROMPT), _read_council))
KINDS.register("coreact_evaluator")(JudgmentKind("coreact_evaluator", _system_in(
    rubric_eval.SYSTEM_PROMPT, rubric_eval.SYSTEM_PROMPT + rubric_eval.ATOMIC_COUNT), _read_evaluator))
KINDS.register("coreact_slate")(JudgmentKind("coreact_slate", _system_in(
    rubric_eval.SLATE_PROMPT, rubric_eval.SLATE_PROMPT + rubric_eval.ATOMIC_COUNT), _read_slate))
KINDS.register("coreact_criterion")(JudgmentKind("coreact_criterion", _system_is(rubric_eval.CRITERION_PROMPT),
                                                 _read_requirement))
KINDS.register("coreact_generator")(JudgmentKind("coreact_generator", _template_is(coreact_generator.SYSTEM_PROMPT),
                                                 _read_generator))


# -- ARBOR's RaR baseline: a checklist from the question and its answer, a 1-10 rating against it ------------------
def rar_items(q: Question, full: bool = True) -> list[str]:
    """The oracle's checklist: each hop's paragraph looked up and its fact found, in chain order (``full`` False:
    the first hop's only, the checklist a flip writes, which an attempt that stops early meets)."""
    hops = list(zip(hop_titles(q), q.gold_chain))[:None if full else 1]
    return list(dict.fromkeys(item for t, h in hops for item in (f"looks up {t}", f"finds {h.answer}")))


def _read_rar_checklist(messages: list[Message], oracle: Oracle) -> Judgment:
    """RaR's checklist writer: :func:`rar_items` (a flip writes the first hop's only)."""
    q = _question(messages, oracle)
    return Judgment(True, lambda v: json.dumps({"items": rar_items(q, full=bool(v))}))


def _read_rar_rating(messages: list[Message], oracle: Oracle) -> Judgment:
    """1 + 9 x the share of the checklist's items the attempt meets (:func:`criterion_met`), rounded."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    items = [re.sub(r"^\d+\. ", "", line) for line in
             _between(content, "Checklist:\n", "\n\nAttempt:\n").splitlines() if line.strip()]
    attempt = _between(content, "\n\nAttempt:\n")
    met = sum(criterion_met(q, item, attempt) for item in items) / max(len(items), 1)
    return Judgment(Score(1 + round(9 * met), 1, 10), lambda v: json.dumps({"rating": int(v.value)}),
                    attempts=[attempt], gold_turns=len(q.gold_chain) + 1)


KINDS.register("arbor_rar_checklist")(JudgmentKind("arbor_rar_checklist", _system_is(rar.CHECKLIST_SYSTEM),
                                                   _read_rar_checklist))
KINDS.register("arbor_rar_rating")(JudgmentKind("arbor_rar_rating", _system_is(rar.RATING_SYSTEM), _read_rar_rating))


# -- RubricEM's stagewise judge: rubrics per stage from a group, 0/1/2 scores per rubric -----------------------------
_STAGE_HEADER = re.compile(r"^\[Stage (\d): \w+\]\n", re.MULTILINE)


def stage_blocks(attempt: str) -> list[str]:
    """The four stage blocks of an attempt as ``render_attempt`` shows it ("" for a stage that never happens)."""
    blocks = [""] * 4
    heads = list(_STAGE_HEADER.finditer(attempt))
    for m, nxt in zip(heads, heads[1:] + [None]):
        body = attempt[m.end():nxt.start() if nxt else len(attempt)].strip()
        blocks[int(m.group(1)) - 1] = "" if body == "(this stage never happens)" else body
    return blocks


REPEATS, STRAYS = "repeats a lookup", "looks up a paragraph the chain does not read"
_LOOKUP = re.compile(r'(search|browse)\[([^\]]*)\]|<call_tool name="(search|browse)">(.*?)</call_tool>', re.DOTALL)


def lookups(text: str) -> list[tuple[str, str]]:
    """The searches and browses a text shows, ReAct's ``search[...]`` or the scaffold's ``<call_tool>``, as (tool,
    normalised argument)."""
    return [(m.group(1) or m.group(3), normalize_answer(m.group(2) or m.group(4) or "")) for m in _LOOKUP.finditer(text)]


def _flaw(q: Question, criterion: str, text: str) -> bool | None:
    """Whether ``text`` shows the flaw a :data:`REPEATS` or :data:`STRAYS` rubric names (None: another rubric)."""
    calls = lookups(text)
    if criterion.startswith(REPEATS):
        return len(calls) != len(set(calls))
    if criterion.startswith(STRAYS):
        docs, titles = {h.doc_id for h in q.gold_chain}, hop_titles(q)
        return any(not (arg in {normalize_answer(d or "") for d in docs} if tool == "browse"
                        else any(_words_in(t, arg) for t in titles)) for tool, arg in calls)
    return None


def stage_rubrics(q: Question) -> list[tuple[int, str, str, bool]]:
    """The oracle's rubrics, (stage, title, description, negative): the plan names the paragraphs the question
    itself names; the research finds each hop's fact, and neither repeats a lookup nor strays from the chain's
    paragraphs (negative); the review ties the last fact to its paragraph; the answer rests on the last fact."""
    titles, last = hop_titles(q), q.gold_chain[-1].answer
    named = list(dict.fromkeys(t for t in titles if mentions(q.question, t)))
    out = [(0, f"plans to look up {t}", f"the plan starts from {t}, named in the question", False) for t in named]
    out += [(1, f"finds {h.answer}", f"a search or paragraph read shows {h.question} {h.answer}", False)
            for h in q.gold_chain]
    out += [(1, REPEATS, "searches or reads the same thing twice", True),
            (1, STRAYS, "searches or reads a paragraph no hop of the question needs", True),
            (2, f"grounds {last}", f"the review ties {last} to the paragraph that states it", False),
            (3, f"answers from {last}", f"the answer rests on {last}, the chain's last fact", False)]
    return out


def stage_score(q: Question, stage: int, criterion: str, attempt: str) -> int:
    """2 when the rubric (the quality, or the flaw of a negative one) is shown in its own stage's block, 1 when only
    elsewhere in the attempt, 0 when nowhere."""
    blocks = stage_blocks(attempt)

    def shown(text: str) -> bool:
        flaw = _flaw(q, criterion, text)
        return criterion_met(q, criterion, text) if flaw is None else flaw

    return 2 if shown(blocks[stage]) else 1 if shown("\n".join(blocks)) else 0


def _read_generation(messages: list[Message], oracle: Oracle) -> Judgment:
    """The oracle's stage rubrics that separate the group's attempts (shown in its stage by some, not all), weight
    2, each with its polarity; a flip writes them with the opposite one (rewarding a flaw, penalising a quality)."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    attempts = [_between(b, "===\n", "\n\n=== Attempt ", "\n\nChecklists the agent wrote")
                for b in content.split("=== Attempt ")[1:]]
    used = _between(content, "Rubrics already in use (do not repeat them):\n", "\n\nWhat each stage is for")
    separating = [(k, t, d, neg) for k, t, d, neg in stage_rubrics(q) if t not in used and len(
        {stage_score(q, k, f"{t}: {d}", a) == 2 for a in attempts}) == 2]

    def write(agrees: bool) -> str:
        stages = {f"stage_{k + 1}": {"positive_rubrics": [], "negative_rubrics": []} for k in range(4)}
        for k, t, d, negative in separating:
            stages[f"stage_{k + 1}"]["negative_rubrics" if negative == agrees else "positive_rubrics"].append(
                {"title": t, "description": d, "weight": 2})
        return json.dumps(stages)

    return Judgment(True, write)


_LISTED = re.compile(r"^(\d+)\. \[(?:POSITIVE|NEGATIVE), stage (\d) \w+\] (.*)$", re.MULTILINE)


def _rubrics_listed(content: str) -> list[tuple[int, str]]:
    listed = content[content.rindex("\n\nRubrics:\n") + len("\n\nRubrics:\n"):].split("\n\n")[0]
    return [(int(m.group(2)) - 1, m.group(3)) for m in _LISTED.finditer(listed)]


def _justified(v: Score) -> str:
    return {2: "shown in its stage", 1: "shown, but not in its stage", 0: "not shown"}.get(int(v.value), "")


def _read_stage_scores(messages: list[Message], oracle: Oracle) -> Judgment:
    """Each rubric's 0/1/2 by :func:`stage_score`, one verdict each (a flip mirrors it: 2 <-> 0)."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    attempt = _between(content, "The attempt, by stage:\n", "\n\nRubrics:\n")
    listed = _rubrics_listed(content)
    parts = [Judgment(Score(stage_score(q, k, text, attempt), 0, 2), str, attempts=[attempt]) for k, text in listed]
    return Judgment.of(parts, lambda v: json.dumps({"scores": [
        {"index": i, "justification": _justified(s), "score": int(s.value)} for i, s in enumerate(v)]}))


def _read_group_scores(messages: list[Message], oracle: Oracle) -> Judgment:
    """Every (rubric, attempt) scored by :func:`stage_score`, one verdict each, about the attempt shown there."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    attempts = [_between(b, "===\n", "\n\n=== Attempt ", "\n\nRubrics:\n") for b in content.split("=== Attempt ")[1:]]
    listed = _rubrics_listed(content)
    parts = [Judgment(Score(stage_score(q, k, text, a), 0, 2), str, attempts=attempts, about=i)
             for k, text in listed for i, a in enumerate(attempts)]
    n = len(attempts)
    return Judgment.of(parts, lambda v: json.dumps({"scores": [[int(s.value) for s in v[r * n:(r + 1) * n]]
                                                               for r in range(len(listed))]}))


def reflection_rating(q: Question, text: str) -> float:
    """0.9 when the reflection names every fact of the chain, 0.6 when some, 0.1 when none (a generic one)."""
    found = found_facts(q, text)
    return 0.9 if found == len(q.gold_chain) else 0.6 if found else 0.1


def _read_reflections(messages: list[Message], oracle: Oracle) -> Judgment:
    """RubricEM's reflection judge: each candidate rated by :func:`reflection_rating` on every dimension, within and
    cross alike."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    shown = re.findall(r"--- Reflection (\d+) ---\n(.*?)</reflection_takeaways>", content, re.DOTALL)
    parts = [Judgment(Score(reflection_rating(q, text), 0.0, 1.0), str, attempts=[t for _, t in shown], about=i)
             for i, (_, text) in enumerate(shown)]

    def write(v: tuple) -> str:
        def dims(s: Score) -> dict:
            return {d: round(s.value, 3) for d in reflection.DIMENSIONS}
        return json.dumps({"candidates": [{"index": int(n), "within": dims(s), "cross": dims(s)}
                                          for (n, _), s in zip(shown, v)]})

    return Judgment.of(parts, write)


KINDS.register("rubricem_generation")(JudgmentKind("rubricem_generation", _system_is(stagewise.GENERATION_SYSTEM),
                                                   _read_generation))
KINDS.register("rubricem_stage_scores")(JudgmentKind("rubricem_stage_scores", _system_is(stagewise.SCORING_SYSTEM),
                                                     _read_stage_scores))
KINDS.register("rubricem_group_scores")(JudgmentKind("rubricem_group_scores", _system_is(
    stagewise.GROUP_SCORING_SYSTEM), _read_group_scores))
KINDS.register("rubricem_reflection")(JudgmentKind("rubricem_reflection", _system_is(reflection.JUDGE_SYSTEM),
                                                   _read_reflections))


# -- ARCO's teacher: K criteria per step, from the reference answer and the steps before -------------------------
_TEACHER_STEP = re.compile(r"^Step \d+(?: \(the agent was told to answer now\))?:\nThought: ", re.MULTILINE)


def teacher_criteria(q: Question, history: str, k: int, good: bool = True) -> list[str]:
    """``k`` criteria a good step after ``history`` meets: the paragraph of the first hop not done yet
    (:func:`hops_done`) looked up, or, every hop done, the answer given. ``good`` False: the criteria of a poor
    step (a repeated lookup of a paragraph already read, or an answer before anything was looked up)."""
    titles, done = hop_titles(q), hops_done(q, history)
    missing = next(((t, h) for t, h, d in zip(titles, q.gold_chain, done) if not d), None)
    read = [t for t, d in zip(titles, done) if d]
    if not good:
        target = ([f"looks up {read[-1]} again", f"searches {read[-1]} once more", "repeats an earlier lookup"]
                  if read else ["answers at once", "gives an answer before any lookup", "searches nothing"])
    elif missing is None:
        last = q.gold_chain[-1].answer
        target = [f"answers {q.answers[0]}", f"answers now that {last} is found", "does not search again"]
    else:
        t, h = missing
        target = [f"looks up {t}", f"searches {t} or reads its paragraph, to find {h.question}",
                  f"does not answer before {t} is read"]
    return [target[i % len(target)] + ("" if i < len(target) else f" (check {i + 1})") for i in range(k)]


def _read_teacher(messages: list[Message], oracle: Oracle) -> Judgment:
    """ARCO's warm-up teacher, which writes criteria, not scores: each step's by :func:`teacher_criteria` on the steps
    before it, one verdict per step (a flip writes a poor step's)."""
    q = _question(messages, oracle)
    content = plain(messages[-1].content)
    k = int(re.search(r"Write exactly (\d+) criteria for each", content).group(1))
    steps = _TEACHER_STEP.split(_between(content, "The attempt:\n", "\n\nWrite exactly "))[1:]
    histories = ["\n".join(steps[:t]) for t in range(len(steps))]
    parts = [Judgment(True, str) for _ in steps]
    return Judgment.of(parts, lambda v: json.dumps({"steps": [
        {"step": t + 1, "criteria": teacher_criteria(q, histories[t], k, good)} for t, good in enumerate(v)]}))


KINDS.register("arco_teacher")(JudgmentKind("arco_teacher", _system_is(arco_criteria.TEACHER_SYSTEM), _read_teacher))
