"""A reproduced output against the locked one, as another CPU sees it: ``identical`` (the same bytes), ``within
tolerance`` (a metrics JSON's numbers within :data:`METRICS_ABS_TOL`, a CSV's numbers equal to :data:`CSV_DECIMALS`
decimals, a JSONL of trajectories by its final answers) or ``changed`` with the largest difference; a folder is its
worst file. flows/repro_check.py writes the label of each output on docs/results/reproduction.md.

    from components.reporting.reproduction import compare
    compare(Path("locked/metrics.json"), Path("clone/outputs/eval/sft/metrics.json")).label   # "within tolerance"
"""

from __future__ import annotations

import csv
import io
import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

IDENTICAL, WITHIN, CHANGED = "identical", "within tolerance", "changed"
RANK = {IDENTICAL: 0, WITHIN: 1, CHANGED: 2}

# another CPU's float kernels move a mean over 50 questions far below this; one question moves it by 0.02
METRICS_ABS_TOL = 1e-6
# issue 76: sft's loss.csv from another CPU equals the locked one to six decimals, not to the byte
CSV_DECIMALS = 6
# a trajectory's tokens drift with the CPU's rounding; what the metrics count is its final answer, per question
ANSWER_KEY, ID_KEY = "final_answer", "question_id"


@dataclass(frozen=True)
class Verdict:
    """How a reproduced output compares with the locked one."""

    label: str
    """``identical``, ``within tolerance`` or ``changed``."""
    compared: str
    """What was compared, with its tolerance: ``bytes``, ``JSON numbers within 1e-06``, ..."""
    difference: str = ""
    """The largest difference found (empty when identical)."""


def compare(locked: Path, fresh: Path) -> Verdict:
    """``fresh`` against ``locked``: two files, or two folders compared file by file (the worst file's verdict).
    The format is read from ``fresh``'s name (``locked`` may be a cache file named by its md5)."""
    if locked.is_dir() or fresh.is_dir():
        return _compare_folders(locked, fresh)
    a, b = locked.read_bytes(), fresh.read_bytes()
    if a == b:
        return Verdict(IDENTICAL, "bytes")
    kind = {".json": _json, ".csv": _csv, ".jsonl": _jsonl}.get(fresh.suffix)
    if kind is not None:
        try:
            return kind(a.decode(), b.decode())
        except (ValueError, UnicodeDecodeError) as error:  # not the format its name says: bytes are all there is
            return Verdict(CHANGED, "bytes", f"bytes differ and do not parse as {fresh.suffix}: {error}")
    return Verdict(CHANGED, "bytes", f"bytes differ ({len(a)} vs {len(b)} bytes)")


def _compare_folders(locked: Path, fresh: Path) -> Verdict:
    files = {side: {p.relative_to(root).as_posix(): p for p in root.rglob("*") if p.is_file()} if root.is_dir()
             else {} for side, root in (("locked", locked), ("fresh", fresh))}
    only = sorted(set(files["locked"]) ^ set(files["fresh"]))
    if only:
        return Verdict(CHANGED, "file names", f"{len(only)} files on one side only, e.g. `{only[0]}`")
    verdicts = {name: compare(files["locked"][name], files["fresh"][name]) for name in sorted(files["locked"])}
    if not verdicts:
        return Verdict(IDENTICAL, "file names (empty folder)")
    name, worst = max(verdicts.items(), key=lambda item: RANK[item[1].label])
    if worst.label == IDENTICAL:
        return Verdict(IDENTICAL, f"bytes of {len(verdicts)} files")
    return Verdict(worst.label, f"{len(verdicts)} files; worst `{name}`: {worst.compared}",
                   f"`{name}`: {worst.difference}" if worst.difference else "")


def _numbers(a: Any, b: Any, where: str, diffs: list[tuple[float, str, Any, Any]]) -> None:
    """Append (|a - b|, where, a, b) for each pair of numbers; raise ValueError where the two differ otherwise."""
    if isinstance(a, bool) or isinstance(b, bool) or not isinstance(a, (int, float)) or not isinstance(b, (int, float)):
        if isinstance(a, dict) and isinstance(b, dict):
            if a.keys() != b.keys():
                raise ValueError(f"keys differ at `{where or '.'}`: {sorted(set(a) ^ set(b))[:3]}")
            for key in a:
                _numbers(a[key], b[key], f"{where}.{key}" if where else str(key), diffs)
        elif isinstance(a, list) and isinstance(b, list) and len(a) == len(b):
            for i, (x, y) in enumerate(zip(a, b)):
                _numbers(x, y, f"{where}[{i}]", diffs)
        elif a != b:
            raise ValueError(f"`{where or '.'}`: {a!r} vs {b!r}")
        return
    diffs.append((abs(a - b) if math.isfinite(a) and math.isfinite(b) else (0.0 if a == b else math.inf), where, a, b))


def _largest(diffs: list[tuple[float, str, Any, Any]]) -> str:
    gap, where, a, b = max(diffs, key=lambda d: d[0])
    return f"largest difference {gap:.3g} at `{where}` ({a} vs {b})"


def _json(a: str, b: str) -> Verdict:
    compared = f"JSON numbers within {METRICS_ABS_TOL:g}"
    diffs: list[tuple[float, str, Any, Any]] = []
    try:
        _numbers(json.loads(a), json.loads(b), "", diffs)
    except ValueError as error:
        return Verdict(CHANGED, compared, str(error))
    within = all(gap <= METRICS_ABS_TOL for gap, *_ in diffs)
    return Verdict(WITHIN if within else CHANGED, compared, _largest(diffs) if diffs else "whitespace only")


def _float(cell: str) -> float | None:
    try:
        return float(cell)
    except ValueError:
        return None


def _csv(a: str, b: str) -> Verdict:
    compared = f"CSV numbers to {CSV_DECIMALS} decimals"
    rows_a, rows_b = list(csv.reader(io.StringIO(a))), list(csv.reader(io.StringIO(b)))
    if len(rows_a) != len(rows_b):
        return Verdict(CHANGED, compared, f"{len(rows_a)} vs {len(rows_b)} rows")
    header = rows_a[0] if rows_a else []
    diffs: list[tuple[float, str, Any, Any]] = []
    equal = True
    for i, (row_a, row_b) in enumerate(zip(rows_a, rows_b)):
        if len(row_a) != len(row_b):
            return Verdict(CHANGED, compared, f"row {i}: {len(row_a)} vs {len(row_b)} cells")
        for j, (x, y) in enumerate(zip(row_a, row_b)):
            where = f"row {i}, {header[j] if j < len(header) else j}"
            fx, fy = _float(x), _float(y)
            if fx is None or fy is None:
                if x != y:
                    return Verdict(CHANGED, compared, f"{where}: {x!r} vs {y!r}")
                continue
            if x != y:
                diffs.append((abs(fx - fy), where, x, y))
                equal = equal and round(fx, CSV_DECIMALS) == round(fy, CSV_DECIMALS)
    return Verdict(WITHIN if equal else CHANGED, compared, _largest(diffs) if diffs else "formatting only")


def _jsonl(a: str, b: str) -> Verdict:
    records = [[json.loads(line) for line in text.splitlines() if line.strip()] for text in (a, b)]
    if not all(isinstance(r, dict) and ANSWER_KEY in r for side in records for r in side):
        lines = [text.splitlines() for text in (a, b)]
        differ = sum(x != y for x, y in zip(*lines)) + abs(len(lines[0]) - len(lines[1]))
        return Verdict(CHANGED, "JSONL lines", f"{differ} of {max(map(len, lines))} lines differ")
    compared = f"JSONL records by `{ANSWER_KEY}`, matched on `{ID_KEY}`"
    answers = [{r.get(ID_KEY, i): r[ANSWER_KEY] for i, r in enumerate(side)} for side in records]
    if answers[0].keys() != answers[1].keys():
        return Verdict(CHANGED, compared, f"{len(set(answers[0]) ^ set(answers[1]))} records on one side only")
    differ = [key for key in answers[0] if answers[0][key] != answers[1][key]]
    if not differ:
        return Verdict(WITHIN, compared, f"the same {len(answers[0])} final answers; other fields differ")
    key = differ[0]
    return Verdict(CHANGED, compared, f"{len(differ)} of {len(answers[0])} final answers differ, e.g. `{key}`: "
                                      f"{answers[0][key]!r} vs {answers[1][key]!r}")
