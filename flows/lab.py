"""The lab sweep as a Prefect flow: every cell of a grid of ``lab.sweep.grids`` (training variant x judge dial x seed; the
outcome-only variants under the first dial alone) trained by ``train_policy``, evaluated by ``evaluate`` on the
test split and recorded by ``lab_cell``, at most ``lab.sweep.workers`` tasks at once in their own processes, then
the page: docs/results/lab_sweep.md (the table, the
break-even judge per method, each mechanism's health) with its plot and its figures as JSON beside it. One MLflow
parent run (``lab_sweep``) holds a child per cell. The nano start (``tasks/lab_sft.py``, unless
``<run.out_dir>/sft`` holds one), the world and its index are made first. A cell already finished under the same settings is read back, so
an interrupted sweep resumes cell by cell. Lab results: a nano policy and simulated judges in a fictional world.

    python -m flows.lab --overlay lab                 # the session-sized grid -> docs/results/lab_sweep.md
    python -m flows.lab --overlay lab --grid full     # the full grid (the nightly sweep's) -> lab_sweep_full.md
    python -m flows.lab --overlay lab --grid intro    # the main job's comparison -> lab_sweep_intro.md
    python -m flows.lab --overlay lab --grid worlds --set lab.world_seed=1   # another world -> lab_sweep_worlds_world1.md
    python -m flows.lab --overlay lab --grid worlds --set arbor.kappa=20 --page lab_sweep_arbor_kappa20   # an ablation
    python -m flows.lab --overlay lab --set lab.sweep.seeds=[0] --set lab.sweep.steps=4
"""

from __future__ import annotations

import datetime
import math
import sys
from pathlib import Path

from prefect import flow
from prefect.futures import as_completed
from prefect.task_runners import ProcessPoolTaskRunner

from components.io import write_json
from components.lab.experiment import head_commit
from components.lab.policy import lab_seed
from components.lab.sweep import (
    cell_overrides,
    cell_params,
    chosen,
    dials,
    grid,
    link_inputs,
    page,
    plot_curves,
    summarise,
    sweep_root,
)
from components.params import Params
from components.params_cli import params_from_args, stage_argparser
from components.params_section import ParamsError
from tasks.evaluate import evaluate
from tasks.index import index
from tasks.lab_cell import finished_cell, lab_cell
from tasks.lab_sft import lab_sft
from tasks.prepare import prepare
from tasks.runtime import resolve, run_stage, tracking
from tasks.train_policy import train_policy

RESULTS = Path("docs/results")


def page_name(params: Params, grid_name: str) -> str:
    """The page's file stem: lab_sweep for the session grid, lab_sweep_<grid> otherwise, and _world<seed> after
    either when lab.world_seed is set (another world's table beside the default's)."""
    name = "lab_sweep" if grid_name == "session" else f"lab_sweep_{grid_name}"
    return name if params.lab.world_seed is None else f"{name}_world{params.lab.world_seed}"


def check_lab(params: Params, cell: Params) -> None:
    """The sweep runs in the lab only, and never trains GRPO on questions its start was fitted to (``cell``: a
    cell's params, the sweep's overrides applied)."""
    if "lab" not in (params.overlay or []):
        raise ParamsError("flows.lab runs the lab's cells: pass --overlay lab")
    held = params.lab.sft_own_questions if params.lab.sft_own_world else None
    first = cell.train_policy.first_question
    if held is not None and first < held:
        raise ParamsError(f"lab.sweep: the nano's SFT read the first {held} train questions (lab.sft_own_questions) "
                          f"but the cells train from question {first}: set train_policy.first_question={held} in "
                          "lab.sweep.overrides")


@flow(name="rubricflow-lab", log_prints=True, task_runner=ProcessPoolTaskRunner(max_workers=2))
def lab(params: Params | None = None, grid_name: str = "session", command: str = "python -m flows.lab --overlay lab",
        page_stem: str | None = None) -> dict:
    """Run every cell of the grid ``grid_name`` (lab.sweep.grids) and write its page (``page_stem``.md, by default
    :func:`page_name`); returns the table's rows."""
    params = resolve(params)
    settings = params.lab.sweep
    cells = grid(settings, grid_name)
    sized = cell_params(params, cells[0], grid_name)
    check_lab(params, sized)
    start = lab_sft(params)
    world = params.model_copy(update={"seed": lab_seed(params)})  # lab.world_seed, when set, is the prepared world
    prepare(world)
    index(world)
    with tracking(params, "lab_sweep", tags={"grid": grid_name}) as parent:
        # a task waiting on another inside a pool process holds that process, so each stage is submitted once its
        # input is done: the trainings first (lab.sweep.workers at once), a cell's evaluation as its training ends
        done, todo = {}, []
        for cell in cells:
            mine = cell_params(params, cell, grid_name)
            record = finished_cell(params, cell, mine)  # read back: the sweep resumes cell by cell
            if record is not None:
                done[cell] = record
            else:
                link_inputs(params.run.out_dir, sweep_root(params.run.out_dir, params.lab.sweep), cell)
                todo.append((cell, mine))
        trained = {train_policy.submit(mine, variant=cell.variant, parent_run_id=parent.run_id): (cell, mine)
                   for cell, mine in todo}
        scored = {}
        for future in as_completed(list(trained)):
            future.result()
            cell, mine = trained[future]
            scored[evaluate.submit(mine, method=cell.variant, parent_run_id=parent.run_id)] = (cell, mine)
        for future in as_completed(list(scored)):
            future.result()
            cell, mine = scored[future]
            done[cell] = lab_cell(mine, cell, parent_run_id=parent.run_id)
        records = [done[cell] for cell in cells]
        table = summarise(records, settings, grid_name)
        name = page_stem or page_name(params, grid_name)
        picked = chosen(settings, grid_name)
        plot = plot_curves(records, list(dials(settings, grid_name)), RESULTS / f"{name}.png", settings.outcome_only)
        walls = [r["wall_s"] for r in records]
        header = [f"# Lab sweep ({grid_name} grid)", "",
                  f"{datetime.date.today().isoformat()}, commit `{head_commit()}`, `{command}`. **Lab results**: the "
                  f"nano policy and simulated judges in a fictional world (world seed {lab_seed(params)}), never a row "
                  "of the real-model tables.",
                  f"Size: {len(cells)} cells ({', '.join(dict.fromkeys(c.variant for c in cells))} x judges "
                  f"{', '.join(f'{k} {v}' for k, v in dials(settings, grid_name).items())} x "
                  f"seeds {picked.seeds or settings.seeds}"
                  f"{f', but {picked.variant_seeds}' if picked.variant_seeds else ''}"
                  f"{f', judges {picked.variant_dials}' if picked.variant_dials else ''}; outcome-only "
                  f"variants under the first judge only), {sized.grpo.steps} GRPO "
                  f"steps of {sized.grpo.prompts_per_step} questions x {sized.grpo.group_size} attempts each on "
                  f"train questions {sized.train_policy.first_question}-"
                  f"{sized.train_policy.first_question + sized.train_policy.n_questions - 1}, dev EM every "
                  f"{sized.train_policy.eval_every} steps on {sized.train_policy.eval_questions} dev questions, test EM on "
                  f"{sized.evaluation.n_questions} test questions (greedy). Cell overrides: {cell_overrides(settings, grid_name)}. "
                  f"train_policy wall per cell {min(walls):.0f}-{max(walls):.0f} s on {sized.run.torch_threads} "
                  f"thread(s), {settings.workers} cells at once. The nano start: test EM {start['test_em']:.2f} "
                  f"({start.get('test_scaffold_em', math.nan):.2f} under the scaffold) after {start['sft_steps']} "
                  f"SFT steps. Figures: [{name}.json]({name}.json)."]
        markdown = page(records, table, settings, name=grid_name, header=header, plot_name=plot.name)
        RESULTS.mkdir(parents=True, exist_ok=True)
        (RESULTS / f"{name}.md").write_text(markdown)
        figures = {"cells": records, "table": table.to_dict("records")}
        write_json(RESULTS / f"{name}.json", figures)
        parent.log_metrics({f"{r['variant']}@{r['dial']}.{k}": r[k] for r in table.to_dict("records")
                            for k in ("test_em", "diff_vs_baseline", "auc_dev_em")})
        for path in (RESULTS / f"{name}.md", plot):
            parent.log_artifact(path)
    print(markdown)
    return {"rows": table.to_dict("records")}


def run(params: Params, grid_name: str, command: str, page_stem: str | None = None) -> dict:
    """:func:`lab` with ``lab.sweep.workers`` cells at once (the command line's and the served deployment's)."""
    runner = ProcessPoolTaskRunner(max_workers=params.lab.sweep.workers)
    return lab.with_options(task_runner=runner)(params, grid_name=grid_name, command=command, page_stem=page_stem)


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--grid", default="session", help="a grid of lab.sweep.grids: session (default), full, intro, "
                        "worlds")
    parser.add_argument("--page", default=None, help="the page's file stem under docs/results (default: lab_sweep, "
                        "lab_sweep_<grid>, then _world<seed> in another world): an ablation's page beside its grid's")
    args = parser.parse_args()
    run(params_from_args(args), args.grid, "python -m flows.lab " + " ".join(sys.argv[1:]), page_stem=args.page)


if __name__ == "__main__":
    run_stage(main)
