"""The sft stage's reflection rows: read from the sft_data folder of the same warm start, trained on the
reflection only, and left out (counted) when longer than sft.max_length."""

from components.io import write_jsonl
from components.methods.rubricem.warmstart_reflections import REFLECTIONS_FILE, ReflectionRow
from components.params_cli import PARAMS_PATH
from components.params_load import load_params
from components.run_spec import run_spec
from components.schemas import Question
from tasks.sft import reflection_examples

REFLECTION = "<reflection_rubrics>\nR.\n</reflection_rubrics>\n<reflection_takeaways>\n1. T.\n</reflection_takeaways>"


class CharTokenizer:
    def encode(self, text, add_special_tokens=False):
        return [ord(c) for c in text]


def render(messages, generation_prompt):
    return "".join(f"[{m.role}]{m.content}[end]" for m in messages) + ("[assistant]" if generation_prompt else "")


def row(attempt: str) -> ReflectionRow:
    q = Question(id="q1", question="Who?", answers=["A"], source="world")
    return ReflectionRow(question=q, attempt=attempt, reflection=REFLECTION, source="oracle", attempt_correct=True)


def test_reflection_rows_train_the_reflection_and_skip_the_too_long(tmp_path):
    params = load_params(PARAMS_PATH, overrides=[f"run.out_dir={tmp_path}", "sft.max_length=4000"])
    assert reflection_examples(params, "sft_scaffold", CharTokenizer(), render) == ([], 0)   # no file: none
    folder = run_spec(params).warm_start_folder("sft_data", "sft_scaffold")
    folder.mkdir(parents=True)
    write_jsonl(folder / REFLECTIONS_FILE, [row("short attempt"), row("x" * 4000)])
    examples, too_long = reflection_examples(params, "sft_scaffold", CharTokenizer(), render)
    assert too_long == 1 and len(examples) == 1
    trained = "".join(chr(i) for i, m in zip(examples[0].input_ids, examples[0].loss_mask) if m)
    assert trained == REFLECTION + "[end]"
    assert "short attempt" in "".join(chr(i) for i in examples[0].input_ids)
    # another warm start's folder is not read
    assert reflection_examples(params, "sft", CharTokenizer(), render) == ([], 0)
