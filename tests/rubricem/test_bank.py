"""The rubric bank: exact (sha256) and similarity (FAISS inner product, top-k=2) retrieval, overwrite on
repeat, the two injection formats and the curriculum's modes, atomic save/restore (a process killed between
writing the temporary file and renaming it leaves the old bank intact)."""

import json
import os
import subprocess
import sys
import textwrap

import numpy as np
import pytest

from components.io import RecordError
from components.methods.rubricem.bank import BANK_FILE, PHASE_KEY, BankGuidance, RubricBank, question_key
from components.schemas import Question

A, B, C, D = ("Which river flows through Kestrow?", "Which river crosses Kestrow town?",
              "Who directed Nightfall Harbor?", "Where is the Ammel's source?")
E = "Which film did Ossian Threll write?"
VECTORS = {A: [1.0, 0.0, 0.0], B: [0.8, 0.6, 0.0], C: [0.0, 1.0, 0.0], D: [0.6, 0.0, 0.8], E: [0.0, 0.0, 1.0]}


class TableEmbedder:
    """Fixed unit vectors per question, so similarities are known by hand (A.B = .8, A.D = .6, A.C = 0)."""

    def __init__(self):
        self.calls = 0

    def encode(self, sentences):
        self.calls += 1
        return np.array([VECTORS[" ".join(s.split())] for s in sentences])


def filled_bank():
    bank = RubricBank(TableEmbedder(), top_k=2)
    for q in (B, C, D):
        bank.put(q, rubrics=f"rubrics of {q}", takeaways=f"lessons of {q}", step=1, score=0.5)
    return bank


def test_exact_match_is_by_sha256_and_a_repeat_overwrites():
    bank = filled_bank()
    assert question_key("Which  river crosses\nKestrow town? ") == question_key(B)
    assert bank.exact("Which river crosses Kestrow town?").takeaways == f"lessons of {B}"
    assert bank.exact(A) is None
    assert bank.put(B, rubrics="new rubrics", takeaways="new lessons", step=7, score=0.9) is True
    assert len(bank) == 3 and bank.exact(B).takeaways == "new lessons" and bank.exact(B).step == 7
    assert bank.put(A, rubrics="r", takeaways="t") is False and len(bank) == 4


def test_similarity_retrieval_top_k_excludes_the_question_itself():
    bank = filled_bank()
    hits = bank.similar(A)
    assert [e.question for e, _ in hits] == [B, D] and [s for _, s in hits] == pytest.approx([0.8, 0.6])
    bank.put(A, rubrics="r", takeaways="t")
    assert [e.question for e, _ in bank.similar(A)] == [B, D]  # its own entry is never a "similar question"
    assert [e.question for e, _ in bank.similar(C, k=1)] == [B]
    # an overwrite re-indexes: B's entry still found once, with its new text
    bank.put(B, rubrics="newer", takeaways="newer")
    assert next((e.question, e.rubrics) for e, _ in bank.similar(A)) == (B, "newer")
    assert RubricBank(TableEmbedder()).similar(A) == []


def question(text, phase=None):
    meta = {PHASE_KEY: phase} if phase else {}
    return Question(id=question_key(text)[:8], question=text, answers=["x"], source="world", metadata=meta)


def test_guidance_modes_and_injection_formats():
    bank = filled_bank()
    guide = BankGuidance(bank)
    block, info = guide(question(A, "cross"))
    assert info == {"mode": "cross", "hit": True, "items": 2, "similarity": [0.8, 0.6]}
    assert block.startswith("<reference_examples>\n") and block.endswith("</reference_examples>")
    assert block.index(f"## Similar question 1: {B}") < block.index("---") < block.index(f"## Similar question 2: {D}")
    assert f"lessons of {D}" in block and "### Rubrics:" in block and "### Takeaways:" in block
    # within: the question's own entry, or nothing when it has none yet
    block, info = guide(question(A, "within"))
    assert block is None and info == {"mode": "within", "hit": False, "items": 0}
    bank.put(A, rubrics="my rubrics", takeaways="my lessons")
    block, info = guide(question(A, "within"))
    assert info["hit"] and "very question before" in block and "my lessons" in block and "Similar question" not in block
    # cross never uses the question's own entry, even when one exists
    block, _ = guide(question(A, "cross"))
    assert "my lessons" not in block
    # no curriculum tag: the exact entry when there is one, else similar questions
    assert guide(question(A))[1]["mode"] == "within" and guide(question(E))[1]["mode"] == "cross"


def test_save_and_restore_round_trip(tmp_path):
    bank = filled_bank()
    bank.save(tmp_path / BANK_FILE)
    restored = RubricBank(embedder=None)  # no embedder needed: entries keep their embeddings
    restored.load(tmp_path / BANK_FILE)
    assert {e.key: e.model_dump() for e in restored.entries.values()} == {
        e.key: e.model_dump() for e in bank.entries.values()}
    assert [e.question for e, _ in restored.similar(B)] == [e.question for e, _ in bank.similar(B)]
    assert [p.name for p in tmp_path.iterdir()] == [BANK_FILE]  # no temporary file left behind


def test_bad_bank_files_name_the_file_and_field(tmp_path):
    path = tmp_path / BANK_FILE
    path.write_text(json.dumps({"format": 1, "entries": [{"key": "k", "question": "q"}]}))
    with pytest.raises(RecordError, match=rf"{BANK_FILE}.*rubrics"):
        RubricBank(None).load(path)
    path.write_text("{not json")
    with pytest.raises(RecordError, match="cannot read the rubric bank"):
        RubricBank(None).load(path)


KILL_BETWEEN_WRITE_AND_RENAME = textwrap.dedent("""
    import os, signal, sys
    import numpy as np
    from components.methods.rubricem.bank import RubricBank

    class One:
        def encode(self, sentences):
            return np.ones((len(sentences), 3))

    bank = RubricBank(One())
    bank.load(sys.argv[1])
    bank.put("A brand new question?", rubrics="new", takeaways="new")
    os.replace = lambda *args, **kwargs: os.kill(os.getpid(), signal.SIGKILL)  # dies right before the rename
    bank.save(sys.argv[1])
""")


def test_a_kill_between_the_temporary_write_and_the_rename_leaves_the_old_bank(tmp_path, repo_root):
    path = tmp_path / BANK_FILE
    old = filled_bank()
    old.save(path)
    before = path.read_bytes()
    proc = subprocess.run([sys.executable, "-c", KILL_BETWEEN_WRITE_AND_RENAME, str(path)], check=False,
                          cwd=repo_root,
                          env={**os.environ, "PYTHONPATH": str(repo_root)}, capture_output=True, timeout=120)
    assert proc.returncode == -9, proc.stderr.decode()[-2000:]
    temps = [p for p in tmp_path.iterdir() if p.name != BANK_FILE]
    assert len(temps) == 1 and "A brand new question?" in temps[0].read_text()  # the new bank was fully written
    assert path.read_bytes() == before  # ... but never replaced the old one
    restored = RubricBank(None)
    restored.load(path)
    assert len(restored) == 3 and restored.exact("A brand new question?") is None
    # the next save goes through and the stale temporary file does not disturb it
    restored.put(B, rubrics="r", takeaways="t")
    restored.save(path)
    again = RubricBank(None)
    again.load(path)
    assert again.exact(B).rubrics == "r"
