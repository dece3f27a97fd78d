"""The module docstrings longer than a paragraph and its run command: every ``.py`` file under the given folders whose
module docstring runs past ``--max-lines`` lines, longest first, with how many paragraphs it has, and a count of
all of them; exits 1 when there is one (the house style: a module docstring is one paragraph plus its run
command).

    .venv/bin/python scripts/long_docstrings.py                       # components tasks flows perf scripts, > 15 lines
    .venv/bin/python scripts/long_docstrings.py components/training --max-lines 12
"""

from __future__ import annotations

import argparse
import ast
import sys
from pathlib import Path

ROOTS = ("components", "tasks", "flows", "perf", "scripts")


def module_docstrings(roots: list[Path]) -> list[tuple[Path, str]]:
    """Each ``.py`` file under ``roots`` (sorted) with its module docstring, "" without one."""
    found = []
    for root in roots:
        for path in sorted(root.rglob("*.py")) if root.is_dir() else [root]:
            try:
                doc = ast.get_docstring(ast.parse(path.read_text()), clean=True) or ""
            except SyntaxError:
                continue
            found.append((path, doc))
    return found


def long_ones(roots: list[Path], max_lines: int) -> list[tuple[int, int, Path]]:
    """(lines, paragraphs, path) of every module docstring over ``max_lines`` lines, longest first."""
    rows = [(len(doc.splitlines()), len([p for p in doc.split("\n\n") if p.strip()]), path)
            for path, doc in module_docstrings(roots)]
    return sorted((r for r in rows if r[0] > max_lines), key=lambda r: (-r[0], str(r[2])))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("roots", nargs="*", type=Path, default=[Path(r) for r in ROOTS])
    parser.add_argument("--max-lines", type=int, default=15)
    args = parser.parse_args(argv)
    rows = long_ones(args.roots, args.max_lines)
    for lines, paragraphs, path in rows:
        print(f"{lines:4d} lines {paragraphs:3d} paragraphs  {path}")
    total = len(module_docstrings(args.roots))
    print(f"{len(rows)} of {total} module docstrings over {args.max_lines} lines")
    return 1 if rows else 0


if __name__ == "__main__":
    sys.exit(main())
