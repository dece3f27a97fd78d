"""perf/ and scripts/ build on components only: none of their Python files imports ``tasks`` or ``flows`` (a stage
is run as a subprocess, ``python -m tasks.<stage>``, if at all), so a stage's internals can change without
breaking a benchmark or a probe. import-linter does not see these folders (they are not packages); the files
are parsed here instead, imports inside functions included.

The UI screenshots, which need the flows layer's Prefect server, live in flows/ (``python -m flows.ui_screenshots``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
FILES = sorted([*ROOT.glob("perf/*.py"), *ROOT.glob("scripts/*.py")])
LAYERS = ("tasks", "flows")


def layer_imports(path: Path) -> set[str]:
    """The modules under ``tasks`` or ``flows`` that ``path`` imports, anywhere in the file."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), filename=str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and node.module:
            names = [node.module]
        else:
            continue
        found |= {n for n in names if n.split(".")[0] in LAYERS}
    return found


def test_there_are_files_to_check():
    assert any(p.parent.name == "perf" for p in FILES) and any(p.parent.name == "scripts" for p in FILES)


@pytest.mark.parametrize("path", FILES, ids=lambda p: str(p.relative_to(ROOT)))
def test_perf_and_scripts_import_no_task_or_flow(path):
    name = str(path.relative_to(ROOT))
    found = layer_imports(path)
    assert not found, f"{name} imports {sorted(found)}: import components instead"


def test_the_check_sees_every_form_of_import(tmp_path):
    source = tmp_path / "x.py"
    source.write_text("import os\nimport tasks.runtime as rt\ndef f():\n    from flows import pipeline\n"
                      "from components.io import read_json\nfrom tasks import sft\n")
    assert layer_imports(source) == {"tasks.runtime", "flows", "tasks"}
