"""flows/repro_check.py's page: the check rewrites its table and keeps the hand-written part below ``KEEP`` (what
holds on another CPU), which docs/results/reproduction.md has. About 2 s (the flow's imports).

    .venv/bin/python -m pytest -q tests/flows/test_repro_check_page.py
"""

from __future__ import annotations

from flows import repro_check

RESULT = {"date": "2026-12-02", "commit": "abc1234", "pulled": [], "identical": 1, "checked": 1,
          "rows": [{"stage": "prepare", "path": "outputs/data/test.jsonl", "kind": "output", "original": "1" * 32,
                    "fresh_clone": "1" * 32, "identical": True}], "seconds": {"prepare": 3.5}}


def test_the_table_is_rewritten_and_the_hand_written_part_kept(tmp_path):
    page = tmp_path / "reproduction.md"
    page.write_text(f"# old table\n\n| stale |\n\n{repro_check.KEEP}\n## On another CPU\n\nby hand\n")
    repro_check.write_page(RESULT, "-m flows.repro_check", page)
    text = page.read_text()
    assert "| stale |" not in text and "| prepare | `outputs/data/test.jsonl` |" in text and "at commit `abc1234`" in text
    assert text.endswith(f"\n{repro_check.KEEP}\n## On another CPU\n\nby hand\n")
    repro_check.write_page(RESULT, "-m flows.repro_check", page)
    assert page.read_text() == text  # a second run leaves the same page

    bare = tmp_path / "new.md"
    repro_check.write_page(RESULT, "-m flows.repro_check", bare)
    assert repro_check.KEEP not in bare.read_text()


def test_the_page_in_the_tree_says_which_stages_hold_on_another_cpu():
    text = repro_check.PAGE.read_text()
    kept = text[text.index(repro_check.KEEP):]
    for stage in ("`prepare` | byte-identical", "`sft_data` | byte-identical", "`evaluate@sft` | EM 0.54"):
        assert stage in kept
