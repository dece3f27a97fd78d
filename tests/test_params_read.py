"""Every section of params.yaml (every top-level key) is read by the pipeline's code: a section nothing
reads is a setting that silently does nothing. The scan looks for ``<...params>.<section>`` attribute access (``params.collect``,
``self.params.llm``) in components/, tasks/ and flows/, outside components/params.py itself."""

from __future__ import annotations

import ast

from components.params import Params


def sections() -> set[str]:
    """Every top-level key of params.yaml: the sections and the scalars beside them (seed, profile)."""
    return set(Params.model_fields)


def _names_params(node: ast.expr) -> bool:
    tail = node.id if isinstance(node, ast.Name) else node.attr if isinstance(node, ast.Attribute) else ""
    return "params" in tail.lower()


def sections_read(source: str, candidates: set[str]) -> set[str]:
    return {node.attr for node in ast.walk(ast.parse(source))
            if isinstance(node, ast.Attribute) and node.attr in candidates and _names_params(node.value)}


def test_scan_finds_params_access_and_ignores_other_objects():
    source = "def f(params, run):\n    x = params.collect.n\n    y = self.params.llm\n    asyncio.run(run.data)\n"
    assert sections_read(source, {"collect", "llm", "run", "data", "agent"}) == {"collect", "llm"}


def test_every_params_section_is_read_by_pipeline_code(repo_root):
    wanted = sections()
    assert {"run", "data", "collect", "llm"} <= wanted  # the discovery itself works
    read: set[str] = set()
    for folder in ("components", "tasks", "flows"):
        for path in sorted((repo_root / folder).rglob("*.py")):
            if path != repo_root / "components" / "params.py":
                read |= sections_read(path.read_text(encoding="utf-8"), wanted)
    unread = wanted - read
    assert not unread, f"params sections read by nothing in components/, tasks/, flows/: {sorted(unread)}"
