"""flows/repro_check.py's page and labels: the check rewrites its table (each output identical, within tolerance or
changed, from its locked bytes found in this checkout, a DVC cache or the remote) and keeps the hand-written part
below ``KEEP`` (what holds on another CPU), which docs/results/reproduction.md has. About 2 s (the flow's imports).

    .venv/bin/python -m pytest -q tests/flows/test_repro_check_page.py
"""

from __future__ import annotations

import hashlib
import json

from flows import repro_check

RESULT = {"date": "2026-12-02", "commit": "abc1234", "pulled": [], "identical": 1, "within tolerance": 1,
          "changed": 1, "checked": 3,
          "rows": [{"stage": "prepare", "path": "outputs/data/test.jsonl", "kind": "output", "original": "1" * 32,
                    "fresh_clone": "1" * 32, "identical": True, "label": "identical", "compared": "md5",
                    "difference": ""},
                   {"stage": "sft", "path": "outputs/sft/loss.csv", "kind": "output", "original": "2" * 32,
                    "fresh_clone": "3" * 32, "identical": False, "label": "within tolerance",
                    "compared": "CSV numbers to 6 decimals", "difference": "largest difference 1e-07"},
                   {"stage": "evaluate@sft", "path": "outputs/eval/sft/metrics.json", "kind": "output",
                    "original": "4" * 32, "fresh_clone": "5" * 32, "identical": False, "label": "changed",
                    "compared": "JSON numbers within 1e-06",
                    "difference": "largest difference 0.02 at `em` (0.52 vs 0.54)"}],
          "seconds": {"prepare": 3.5}}


def test_the_table_is_rewritten_and_the_hand_written_part_kept(tmp_path):
    page = tmp_path / "reproduction.md"
    page.write_text(f"# old table\n\n| stale |\n\n{repro_check.KEEP}\n## On another CPU\n\nby hand\n")
    repro_check.write_page(RESULT, "-m flows.repro_check", page)
    text = page.read_text()
    assert "| stale |" not in text and "| prepare | `outputs/data/test.jsonl` |" in text and "at commit `abc1234`" in text
    assert "**1 identical, 1 within tolerance, 1 changed**" in text
    assert "[`reproduction.json`](reproduction.json)" in text  # the figures main() writes beside the page
    assert "| within tolerance | CSV numbers to 6 decimals | largest difference 1e-07 |" in text
    assert "| **changed** | JSON numbers within 1e-06 | largest difference 0.02 at `em` (0.52 vs 0.54) |" in text
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


def cache_put(cache, data: bytes) -> str:
    digest = hashlib.md5(data).hexdigest()
    (cache / "files" / "md5" / digest[:2]).mkdir(parents=True, exist_ok=True)
    (cache / "files" / "md5" / digest[:2] / digest[2:]).write_bytes(data)
    return digest


def test_each_output_is_labelled_from_its_locked_bytes(tmp_path):
    remote, clone = tmp_path / "remote", tmp_path / "clone"
    locked_metrics = json.dumps({"em": 0.52, "f1": 0.6}).encode()
    metrics_md5 = cache_put(remote, locked_metrics)
    files = {"a.bin": b"weights", "b.json": json.dumps({"loss": 1.0}).encode()}
    listing = json.dumps([{"md5": cache_put(remote, data), "relpath": name} for name, data in files.items()])
    folder_md5 = cache_put(remote, listing.encode()) + ".dir"
    (remote / "files" / "md5" / folder_md5[:2] / folder_md5[2:-4]).rename(
        remote / "files" / "md5" / folder_md5[:2] / folder_md5[2:])

    def label(path, md5, fresh: dict[str, bytes]):
        for name, data in fresh.items():
            (clone / name).parent.mkdir(parents=True, exist_ok=True)
            (clone / name).write_bytes(data)
        return repro_check.verdict(path, md5, "f" * 32, clone, tmp_path / "locked", [remote])

    out = "outputs/x/metrics.json"
    assert label(out, metrics_md5, {out: locked_metrics}).label == "identical"  # md5 differs, bytes do not
    assert label(out, metrics_md5, {out: json.dumps({"em": 0.52, "f1": 0.6 + 1e-9}).encode()}).label == "within tolerance"
    moved = label(out, metrics_md5, {out: json.dumps({"em": 0.54, "f1": 0.6}).encode()})
    assert moved.label == "changed" and "`em` (0.52 vs 0.54)" in moved.difference
    assert "not at hand" in label(out, "0" * 32, {}).difference

    adapter = "outputs/x/adapter"
    fresh = {f"{adapter}/{name}": data for name, data in files.items()}
    assert label(adapter, folder_md5, fresh).label == "identical"
    fresh[f"{adapter}/b.json"] = json.dumps({"loss": 1.0 + 1e-9}).encode()
    assert label(adapter, folder_md5, fresh).label == "within tolerance"
    assert label("outputs/x/never.json", metrics_md5, {}).difference == "not written in the clone"
