"""scripts/long_docstrings.py on a small tree: it lists the module docstring past the limit with its paragraphs, and
exits 1 only when there is one. Under a second.

    .venv/bin/python -m pytest -q tests/test_long_docstrings.py
"""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
spec = importlib.util.spec_from_file_location("long_docstrings", ROOT / "scripts" / "long_docstrings.py")
long_docstrings = importlib.util.module_from_spec(spec)
spec.loader.exec_module(long_docstrings)


def test_only_the_docstring_past_the_limit_is_listed(tmp_path, capsys):
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg" / "short.py").write_text('"""One paragraph.\n\n    python -m pkg.short\n"""\n')
    (tmp_path / "pkg" / "long.py").write_text('"""First.\n\nSecond\nstill second.\n\nThird.\n"""\nx = 1\n')
    (tmp_path / "pkg" / "none.py").write_text("x = 1\n")
    assert long_docstrings.long_ones([tmp_path / "pkg"], max_lines=3) == [(6, 3, tmp_path / "pkg" / "long.py")]
    assert long_docstrings.main([str(tmp_path / "pkg"), "--max-lines", "3"]) == 1
    assert "6 lines   3 paragraphs" in capsys.readouterr().out
    assert long_docstrings.main([str(tmp_path / "pkg"), "--max-lines", "6"]) == 0
    assert "0 of 3 module docstrings over 6 lines" in capsys.readouterr().out
