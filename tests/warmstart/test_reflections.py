"""Reflection rows of the warm start: the teacher's reflections rejection-sampled in the meta-policy's format,
and the SFT row a kept reflection becomes."""

import asyncio
import json

from components.judges.render import scaffold_text
from components.llm.backends.scripted import ScriptedChatModel
from components.llm.base import PermanentLLMError
from components.methods.rubricem.reflection import (
    DRAFT_REQUEST,
    EXAMPLE_RUBRICS,
    INSTRUCTIONS,
    POLICY_SYSTEM,
    ReflectionDraft,
    parse_reflection,
    render_draft,
)
from components.methods.rubricem.warmstart_reflections import (
    ReflectionRow,
    reflection_sft_row,
    teacher_reflections,
)
from components.schemas import Question, Step, Trajectory

DRAFT = {"critical_requirements": "both hops.", "approach": "search the person first.",
         "pitfalls": "stopping after hop one.", "takeaways": ["Resolve the first hop before the second."]}


def draft(**changes) -> str:
    """The teacher's structured reply."""
    return json.dumps({**DRAFT, **changes})


VALID = ("<reflection_rubrics>\nCritical requirements: both hops.\nApproach: search the person first.\n"
         "Pitfalls: stopping after hop one.\n</reflection_rubrics>\n<reflection_takeaways>\n"
         "1. Resolve the first hop before the second.\n</reflection_takeaways>")
SCAFFOLD_RUN_ON = ("<reflection_rubrics>\nCritical requirements: hop one.</think>\n"
                   "<call_tool name=\"search\">Tamiis Galstead</call_tool>")


def attempt(qid: str, answer: str | None, gold: str = "Falelle Tamgard") -> tuple[Trajectory, Question, str]:
    question = Question(id=qid, question=f"Who is the grandmother in {qid}?", answers=[gold], source="world")
    steps = [Step(index=0, raw="<plan>two hops</plan><call_tool name=\"search\">X</call_tool>", observation="[1] X ..."),
             Step(index=1, raw=f"<answer>{answer}</answer>", final_answer=answer)]
    return (Trajectory(question_id=qid, question=question.question, steps=steps, final_answer=answer,
                       finish_reason="answer"), question, "teacher")


class Bar:
    """Counts what a tqdm bar would be advanced by."""

    n = 0

    def update(self, k: int) -> None:
        self.n += k


def run(teacher, attempts, n, samples=2, progress=None):
    return asyncio.run(teacher_reflections(teacher, attempts, n=n, samples=samples, temperature=0.7, seed=3,
                                           max_tokens=256, progress=progress))


def test_first_valid_sample_is_kept_and_every_rejection_has_its_reason():
    replies = {  # (question id, greedy?) -> reply
        ("q-format", True): SCAFFOLD_RUN_ON, ("q-format", False): draft(),
        ("q-leak", True): draft(critical_requirements="the answer is Falelle Tamgard"), ("q-leak", False): draft(),
        ("q-own", True): draft(pitfalls="it said Torys Varworth"),
        ("q-own", False): draft(takeaways=["Torys Varworth was a guess."]),
        ("q-ok", True): draft(),
    }

    def respond(messages, sampling):
        qid = next(k for k, _ in replies if f"grandmother in {k}?" in messages[1].content)
        return replies[(qid, sampling.temperature == 0)]

    teacher = ScriptedChatModel(respond)
    attempts = [attempt("q-format", "Torys Varworth"), attempt("q-leak", "Falelle Tamgard"),
                attempt("q-own", "Torys Varworth"), attempt("q-ok", "Falelle Tamgard")]
    bar = Bar()
    rows, rejected = run(teacher, attempts, n=4, progress=bar)

    assert bar.n == 4  # one tick per attempt reflected on, kept or not
    assert sorted(r.question.id for r in rows) == ["q-format", "q-leak", "q-ok"]
    assert all(r.reflection == VALID for r in rows)
    assert {r.question.id: r.attempt_correct for r in rows} == {"q-format": False, "q-leak": True, "q-ok": True}
    assert sorted((r.question_id, r.sample, r.reason) for r in rejected) == [
        ("q-format", 0, "format"), ("q-leak", 0, "names_answer"), ("q-own", 0, "names_answer"),
        ("q-own", 1, "names_answer")]
    # greedy first, then a seeded sample; a valid greedy reply costs one call
    calls = [(m[1].content.split("grandmother in ")[1][:5], s.temperature, s.seed) for m, s in teacher.requests]
    assert calls.count(("q-ok?", 0.0, None)) == 1 and len(calls) == 7
    assert all(seed is not None for _, t, seed in calls if t > 0)
    # each attempt is shown as the meta-policy is shown it during training, but without the worked example
    by_id = {q.id: t for t, q, _ in attempts}
    assert POLICY_SYSTEM.startswith(INSTRUCTIONS) and EXAMPLE_RUBRICS not in INSTRUCTIONS
    for messages, sampling in teacher.requests:
        assert messages[0].content == INSTRUCTIONS
        qid = next(k for k in by_id if f"grandmother in {k}?" in messages[1].content)
        assert scaffold_text(by_id[qid]).strip() in messages[1].content
        # ... and answers under structured output, with the one sentence that asks for the JSON draft
        assert messages[1].content.endswith(DRAFT_REQUEST) and sampling.json_schema["required"] == list(DRAFT)


def test_the_draft_is_rendered_into_the_two_blocks_and_a_bad_draft_is_a_format_rejection():
    assert render_draft(ReflectionDraft.model_validate_json(draft(approach="search\n  the person first."))) == VALID
    two = render_draft(ReflectionDraft(**{**DRAFT, "takeaways": ["One.", "Two."]}))
    assert two.endswith("1. One.\n2. Two.\n</reflection_takeaways>") and parse_reflection(two).valid
    replies = iter([draft(takeaways=[]), draft(critical_requirements="...", approach="...", pitfalls="...")])
    rows, rejected = run(ScriptedChatModel(lambda m, s: next(replies)), [attempt("q1", "A")], n=1)
    assert rows == [] and [r.reason for r in rejected] == ["format", "format"]
    assert "not a reflection draft: takeaways" in rejected[0].detail
    assert "only repeats the format's placeholders" in rejected[1].detail  # the rendered text's own checks

def test_failed_calls_are_counted_and_never_kept():
    teacher = ScriptedChatModel(lambda m, s: PermanentLLMError("bad request"))
    rows, rejected = run(teacher, [attempt("q1", "A")], n=1, samples=2)
    assert rows == []
    assert [(r.reason, r.sample) for r in rejected] == [("call_failed", 0), ("call_failed", 1)]
    assert "bad request" in rejected[0].detail


def test_attempts_are_drawn_with_the_seed():
    teacher = ScriptedChatModel(lambda m, s: draft())
    attempts = [attempt(f"q{i}", "A") for i in range(10)]
    first, _ = run(teacher, attempts, n=4)
    again, _ = run(ScriptedChatModel(lambda m, s: draft()), attempts, n=4)
    assert [r.question.id for r in first] == [r.question.id for r in again]
    assert len({r.question.id for r in first}) == 4
    assert run(teacher, attempts, n=0) == ([], [])
    assert len(run(teacher, attempts[:2], n=5)[0]) == 2


def test_sft_row_trains_only_the_reflection_and_its_end_of_turn():
    def render(messages, generation_prompt):
        text = "".join(f"<|{m.role}|>{m.content}<|end|>" for m in messages)
        return text + ("<|assistant|>" if generation_prompt else "")

    traj, question, _ = attempt("q1", "Torys Varworth")
    row = ReflectionRow(question=question, attempt=scaffold_text(traj), reflection=VALID, source="teacher",
                        attempt_correct=False)
    (prompt, prompt_trained), (reply, reply_trained) = reflection_sft_row(row, render)
    assert (prompt_trained, reply_trained) == (False, True)
    assert prompt.startswith(f"<|system|>{POLICY_SYSTEM}<|end|><|user|>Question: {question.question}")
    assert scaffold_text(traj).strip() in prompt and prompt.endswith("<|assistant|>")
    assert reply == VALID + "<|end|>"
    assert parse_reflection(reply.removesuffix("<|end|>"), ["Falelle Tamgard", "Torys Varworth"]).valid
    # with observation_chars the prompt shows each tool output cut, as training will; the row keeps it whole
    long_traj = traj.model_copy(deep=True)
    long_traj.steps[0].observation = "[1] X " + "many words " * 100
    row = row.model_copy(update={"attempt": scaffold_text(long_traj)})
    (short, _), (same_reply, _) = reflection_sft_row(row, render, observation_chars=40)
    (whole, _), _ = reflection_sft_row(row, render)
    assert "many words " * 100 in whole and "many words " * 5 not in short and " [...]" in short
    assert same_reply == reply and len(short) < len(whole) - 900
