"""The run-spec contract (issue 76): components take the run spec (components/run_spec.py) or their own section,
never the whole ``Params``. Every function under components/ with a parameter annotated ``Params`` must be on
:data:`ALLOWED`, which lists today's remaining ones file by file; an entry that no longer takes ``Params`` fails
too, so the list can only shrink. The checker is shown to see each spelling of the annotation."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]

# file -> the functions (Class.method for methods) that still take Params. run_spec.run_spec is the seam itself;
# the lab's are the lead's (components/lab/*); policy_run.PolicyRun.__init__ and shared_dev_before feed train()'s
# body, which another agent edits; the rest wait for their own slice.
ALLOWED: dict[str, set[str]] = {
    "components/run_spec.py": {"run_spec"},
    "components/params.py": {"with_method_settings", "for_method"},
    "components/agents/react.py": {"agent_options"},
    "components/lab/experiment.py": {"run_sft", "run_grpo", "run_judges", "report"},
    "components/lab/policy.py": {"lab_seed", "grpo_source", "sft_corpus", "train_nano", "grpo_run"},
    "components/lab/sweep.py": {"cell_params"},
    "components/lab/world.py": {"build_lab_world"},
    "components/llm/factory.py": {"LLMPool.__init__"},
    "components/methods/coreact/generator_training.py": {"oracle_warm_start", "run_training",
                                                         "warm_start_sources", "GeneratorRun.__init__"},
    "components/policy_run.py": {"shared_dev_before", "PolicyRun.__init__"},
    "components/trained_policy.py": {"with_trained_policy"},
    "components/training/grpo/policy_run_key.py": {"run_settings", "method_settings"},
    "components/variants.py": {"variant_params"},
}


def _names_params(annotation: ast.expr | None) -> bool:
    """Whether an annotation mentions ``Params``: bare, dotted (``params.Params``), in a union or a generic, or
    quoted (a forward reference)."""
    for node in ast.walk(annotation) if annotation is not None else ():
        if isinstance(node, ast.Name) and node.id == "Params" or isinstance(node, ast.Attribute) and node.attr == "Params":
            return True
        if isinstance(node, ast.Constant) and isinstance(node.value, str):
            try:
                if _names_params(ast.parse(node.value, mode="eval").body):
                    return True
            except SyntaxError:
                continue
    return False


def takers(source: str) -> list[str]:
    """The functions of ``source`` (``Class.method`` for methods, ``outer.inner`` when nested) with a parameter
    annotated ``Params``."""
    found: list[str] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, ast.FunctionDef | ast.AsyncFunctionDef):
                a = child.args
                every = [*a.posonlyargs, *a.args, *a.kwonlyargs, *filter(None, (a.vararg, a.kwarg))]
                if any(_names_params(arg.annotation) for arg in every):
                    found.append(prefix + child.name)
                visit(child, f"{prefix}{child.name}.")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")

    visit(ast.parse(source), "")
    return found


def components_taking_params() -> dict[str, set[str]]:
    out: dict[str, set[str]] = {}
    for path in sorted((ROOT / "components").rglob("*.py")):
        names = takers(path.read_text())
        if names:
            out[path.relative_to(ROOT).as_posix()] = set(names)
    return out


def test_no_component_outside_the_allowlist_takes_params():
    found = components_taking_params()
    new = {f: sorted(names - ALLOWED.get(f, set())) for f, names in found.items() if names - ALLOWED.get(f, set())}
    assert new == {}, ("these components take the whole Params: give them the run spec (components/run_spec.py) "
                       f"or their own section instead: {new}")


def test_the_allowlist_only_shrinks():
    found = components_taking_params()
    stale = {f: sorted(names - found.get(f, set())) for f, names in ALLOWED.items() if names - found.get(f, set())}
    assert stale == {}, f"no longer take Params (or are gone): remove them from ALLOWED: {stale}"


@pytest.mark.parametrize("source", [
    "def f(params: Params): ...",
    "def f(x, *, params: Params | None = None): ...",
    "async def f(params: 'Params'): ...",
    "def f(params: components.params.Params): ...",
    "def f(params: Optional[Params]): ...",
    "class C:\n    def f(self, params: Params): ...",
])
def test_the_checker_sees_each_spelling(source):
    assert len(takers(source)) == 1


def test_the_checker_passes_the_run_spec_and_sections():
    assert takers("def f(spec: RunSpec, grpo: GRPOParams, params: Any, p: 'TrainPolicyParams'): ...") == []


def test_the_run_spec_resolves_each_role_s_backend_and_refuses_a_pool(repo_root):
    from components.params_load import load_params
    from components.params_section import ParamsError
    from components.run_spec import run_spec

    params = load_params(repo_root / "params.yaml", overrides=["train_policy.engine=llamacpp", "lora.r=4"])
    spec = run_spec(params)
    assert spec.backend_name("trainable_policy") == params.llm.roles["trainable_policy"] == "embedded-0_5b-hf"
    assert spec.backend("trainable_policy") is params.llm.backends["embedded-0_5b-hf"]
    assert (spec.engine, spec.lora.r, spec.seed, spec.run.out_dir) == ("llamacpp", 4, params.seed, "outputs")
    with pytest.raises(ParamsError, match=r"llm.roles.council_judges: .* one backend, got \['embedded-1_5b'"):
        spec.backend("council_judges")
    with pytest.raises(ParamsError, match="llm.roles.nobody"):
        spec.backend("nobody")
