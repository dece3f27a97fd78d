"""The layers of docs/architecture.md, checked with import-linter (contracts in pyproject.toml): flows >
tasks > components; components free of Prefect, MLflow and DVC; adapter saving and digests a leaf; the four
method packages independent; the shared seams never importing a method; no task importing another; no import
loop between sibling packages or modules; the params sections leaves. The second test plants one bad import in a
copy of the tree and checks the contracts catch it, so a contract that could never fail would show here."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

LINT = Path(sys.executable).with_name("lint-imports")
pytestmark = pytest.mark.skipif(not LINT.exists(), reason="import-linter is not installed (the [dev] extra)")


def lint(root: Path) -> subprocess.CompletedProcess:
    return subprocess.run([str(LINT), "--no-cache"], check=False, cwd=root, capture_output=True, text=True,
                          timeout=300)


def test_contracts_hold(repo_root):
    result = lint(repo_root)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "broken" in result.stdout and "0 broken" in result.stdout


def copy_tree(repo_root: Path, dest: Path) -> Path:
    for name in ("components", "tasks", "flows"):
        shutil.copytree(repo_root / name, dest / name, ignore=shutil.ignore_patterns("__pycache__"))
    shutil.copy(repo_root / "pyproject.toml", dest / "pyproject.toml")
    return dest


@pytest.mark.parametrize(("module", "planted", "contract"), [
    ("components/methods/coreact/slates.py", "import components.methods.arbor.memory",
     "the four method packages never import each other"),
    ("components/training/grpo/advantages.py", "from components.methods.arco import decomposition",
     "the shared seams never import a method"),
    ("components/io.py", "import mlflow", "components are free of Prefect, MLflow and DVC"),
    ("components/adapters.py", "from components.embedded import lora_gguf", "adapter saving and digests are a leaf"),
    ("components/schemas.py", "import tasks.runtime", "flows compose tasks; tasks call components"),
    ("components/world/names.py", "import components.world.render", "no import loops"),
    ("tasks/train_policy.py", "import tasks.sft", "no task imports another task"),
    ("components/training/params.py", "import components.params", "params sections are leaves"),
])
def test_a_planted_import_breaks_its_contract(repo_root, tmp_path, module, planted, contract):
    root = copy_tree(repo_root, tmp_path)
    path = root / module
    path.write_text(path.read_text() + f"\n{planted}  # planted by the test\n")
    result = lint(root)
    assert result.returncode != 0
    broken = [line for line in result.stdout.splitlines() if "BROKEN" in line]
    assert any(contract in line for line in broken), result.stdout
