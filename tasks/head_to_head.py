"""Stage `head_to_head`: every evaluated method, inference-time and trained, in one table with intervals, seed
spread, paired tests against its baseline (a trained method's matched baseline, GRPO under the method's own
settings, when it was evaluated, else the shared ``grpo``; the table says which), cost per role and training compute
(components/reporting/head_to_head.py says what each column is).

    python -m tasks.head_to_head                                  # run.out_dir, with whatever seeds exist
    python -m tasks.head_to_head --out-dirs outputs outputs/hotpotqa outputs/musique   # one section per scope

Reads, per ``run.out_dir`` given: eval/<method>/ (the main run, seed ``seed``), <sweep.out_dir>/seed_<S>/eval/<method>/
(a sweep's seeds) and, for the training variants, train/<variant>/ and the sweep's seed_<S>/train/<variant>/; for an
inference-time method serving a model a stage trained (Co-ReAct's generator), that stage's run folder
(:func:`trained_components`), as the method's training compute and health. It
is cheap and recomputes nothing: a new seed folder adds its evidence on the next run. Writes
<run.out_dir>/head_to_head/head_to_head.{json,csv,md,png} and rewrites docs/results/head_to_head.md from them
(a dated header with the command, the sizes and the git commit), with its figures (the JSON) committed beside it as
docs/results/head_to_head.json. In MLflow: a `head_to_head` run (under
``parent_run_id`` when given) holds the files, the table and ``<method>.<metric>`` metrics, with a child run
`head_to_head@<method>` per row (tags ``method``, ``kind``, ``scope``, ``seeds``, ``baseline``).

``dvc repro head_to_head`` runs every evaluation first (its deps are all of them); ``dvc repro -s head_to_head``
reports what exists now.
"""

from __future__ import annotations

import datetime as dt
import json
import math
import subprocess
import sys
from pathlib import Path

from prefect import task
from pydantic import BaseModel

from components.io import atomic_path
from components.method_registry import agent_method, load_methods, paired_baselines, variant_health
from components.params import Params
from components.params_cli import params_from_args, stage_argparser
from components.params_section import ParamsError
from components.reporting.figures import figures_line, write_figures
from components.reporting.head_to_head import collect_scope, document, write_head_to_head
from components.reporting.head_to_head import head_to_head as build_table
from tasks.runtime import log_rows, resolve, run_stage, tracking

DOC_PATH = "docs/results/head_to_head.md"


class HeadToHeadResult(BaseModel):
    files: dict[str, str]  # json, csv, markdown, plot, document
    metrics: dict[str, dict[str, float]]  # row name -> its numeric columns
    markdown: str


def training_variants() -> list[str]:
    """Every registered training variant, in registration order."""
    from components.variants import VARIANTS

    load_methods()
    return VARIANTS.names()


def role_prices(params: Params, method: str, variants: list[str]) -> dict[str, tuple[float, float]]:
    """Role -> (USD per 1k prompt tokens, per 1k completion tokens) of the backends ``method`` runs on; a trained
    policy is priced as its warm start's backend, which serves it."""
    entry = params.methods.get(method)
    if entry is None and method in variants:
        from components.run_spec import run_spec
        from components.trained_policy import trained_policy_method

        try:
            _, backend, entry = trained_policy_method(run_spec(params), method)
        except ParamsError:
            return {}
        backends = {**params.llm.backends, entry.roles["policy"]: backend}
    else:
        backends = dict(params.llm.backends)
    roles = {**params.llm.roles, **(entry.roles if entry is not None else {})}
    prices = {}
    for role, bound in roles.items():
        names = [bound] if isinstance(bound, str) else list(bound)
        found = [backends[n] for n in names if n in backends]
        if found:
            prices[role] = (sum(b.price_prompt_per_1k for b in found) / len(found),
                            sum(b.price_completion_per_1k for b in found) / len(found))
    return prices


def trained_components(params: Params, method: str) -> list[str]:
    """The run folders (relative to ``run.out_dir``) of the stages that trained a model ``method`` serves besides
    its policy: the adapters of the roles its agent's options name (Co-ReAct's ``generator_role``) or its entry
    rebinds, other than ``policy`` (the shared warm start). ``coreact`` -> ``["train_rubric_generator/listwise"]``;
    an adapter outside ``run.out_dir`` is no stage's of this run and is left out."""
    from components.agents.react import agent_options

    entry = params.methods.get(method)
    if entry is None:
        return []
    roles = {**params.llm.roles, **entry.roles}
    named = {v for v in agent_options(params, entry).values() if isinstance(v, str) and v in roles}
    named |= set(entry.roles) - {"policy"}
    out_dir, folders = Path(params.run.out_dir).resolve(), []
    for role in sorted(named):
        bound = roles[role]
        for name in [bound] if isinstance(bound, str) else list(bound):
            backend = params.llm.backends.get(name)
            for adapter in backend.adapters if backend is not None else []:
                folder = Path(adapter).resolve().parent
                if folder.is_relative_to(out_dir) and folder != out_dir:
                    folders.append(folder.relative_to(out_dir).as_posix())
    return sorted(set(folders))


def git_commit() -> str | None:
    try:
        out = subprocess.run(["git", "rev-parse", "--short", "HEAD"], capture_output=True, text=True, timeout=10,
                             check=False)
    except (OSError, subprocess.SubprocessError):
        return None
    if out.returncode != 0:
        return None
    return out.stdout.strip() or None


@task(name="head_to_head")
def head_to_head(params: Params | None = None, out_dirs: list[str] | None = None, parent_run_id: str | None = None,
                 doc_path: str | None = DOC_PATH, command: str | None = None) -> HeadToHeadResult:
    """Report every evaluation under ``out_dirs`` (default: ``run.out_dir``), one section per scope, into
    <run.out_dir>/head_to_head/ and ``doc_path`` (None: no document; none either under an overlay such as
    ``smoke``, whose numbers are not results)."""
    params = resolve(params)
    out_dirs = list(out_dirs or [params.run.out_dir])
    variants = training_variants()
    health = {v: variant_health(v) for v in variants}
    components = {}  # inference-time methods serving a model a stage of theirs trained (Co-ReAct's generator)
    for method, entry in params.methods.items():
        spec = agent_method(entry.agent)
        components[method] = [(folder, spec.health if spec is not None else ())
                              for folder in trained_components(params, method)]
    scopes = [collect_scope(d, params.sweep.out_dir, params.seed, variants, health=health, components=components)
              for d in out_dirs]
    names = [s.name for s in scopes]
    for scope in scopes:  # two folders of the same data are told apart by their folder
        if names.count(scope.name) > 1:
            scope.name = f"{scope.name} ({scope.out_dir})"
    methods = sorted({m for s in scopes for m in s.evaluations})
    table = build_table(scopes, order=[*params.methods, *variants],
                        prices={m: role_prices(params, m, variants) for m in methods},
                        pairs={v: paired_baselines(v) for v in variants})
    where = {s.name: str(s.out_dir) for s in scopes}
    report = write_head_to_head(table, Path(params.run.out_dir) / "head_to_head", where)
    files = {k: str(v) for k, v in report.paths.items()}
    if doc_path is not None and params.overlay:
        print(f"head_to_head: not rewriting {doc_path}: a run under overlay {','.join(params.overlay)} is not a result")
        doc_path = None
    if doc_path is not None:
        command = command or " ".join(["python -m tasks.head_to_head",
                                       *(["--out-dirs", *out_dirs] if out_dirs != [params.run.out_dir] else [])])
        date = dt.datetime.now(dt.UTC).strftime("%Y-%m-%d %H:%M UTC")
        figures = write_figures(doc_path, json.loads(report.paths["json"].read_text()))
        with atomic_path(Path(doc_path)) as fh:
            fh.write(document(report, command, date, git_commit(), figures_line(doc_path)))
        files["document"], files["figures"] = str(doc_path), str(figures)

    single = len(scopes) == 1
    rows, tags = {}, {}
    for record in table.to_dict("records"):
        name = record["method"] if single else f"{record['scope']}/{record['method']}"
        rows[name] = {k: float(v) for k, v in record.items()
                      if isinstance(v, (int, float)) and not isinstance(v, bool) and not math.isnan(v)}
        tags[name] = {"method": record["method"], "kind": record["kind"], "scope": record["scope"],
                      "seeds": str(int(record["seeds"])), "baseline": record["baseline"] or "none"}
    with tracking(params, "head_to_head", parent_run_id,
                  tags={"scopes": ",".join(where), "methods": str(len(table))}) as run:
        run.log_params({"out_dirs": out_dirs, "sizes": report.sizes, "seed": params.seed,
                        "sweep_out_dir": params.sweep.out_dir})
        for kind, path in files.items():  # the document beside, not over, the report's own markdown
            run.log_artifact(path, artifact_path="head_to_head/document" if kind in ("document", "figures")
                             else "head_to_head")
        run.log_table(table, artifact_file="head_to_head/table.json")
        log_rows(params, run, rows, "head_to_head", tags)
    return HeadToHeadResult(files=files, metrics=rows, markdown=report.markdown)


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--out-dirs", nargs="+", default=None, metavar="DIR",
                        help="run.out_dir folders to report, one section each (default: run.out_dir)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--no-doc", action="store_true", help=f"do not rewrite {DOC_PATH}")
    where.add_argument("--doc", default=DOC_PATH, metavar="PATH",
                       help=f"the results page to write (default {DOC_PATH}); another page keeps that one, e.g. "
                            "when this machine holds only some of the methods it reports")
    args = parser.parse_args()
    command = " ".join(["python -m tasks.head_to_head", *sys.argv[1:]])
    result = head_to_head.fn(params_from_args(args), out_dirs=args.out_dirs, doc_path=None if args.no_doc else args.doc,
                             command=command)
    print(result.markdown)
    print(json.dumps(result.files, indent=2))


if __name__ == "__main__":
    run_stage(main)
