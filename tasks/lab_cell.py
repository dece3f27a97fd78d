"""Stage `lab_cell`: the record of one finished cell of the lab sweep (components/lab/sweep.py), once its
``train_policy@<variant>`` and ``evaluate@<variant>`` have run in the cell's folder
(``<run.out_dir>/<lab.sweep.out_dir>/<dial>/seed_<s>/``): its curve, test EM, health and gaming check to
cells/<variant>.json with the cell's key (what the sweep's page reads; a record under the same key is not run again)
and to an MLflow run ``lab@<cell>`` under the sweep's parent. ``flows/lab.py`` composes the three.

    python -m tasks.lab_cell --overlay lab --variant arbor --dial noisy --seed 0   # after the cell's two stages
"""

from __future__ import annotations

from pathlib import Path

from prefect import task

from components.io import read_json, write_json
from components.lab.sweep import Cell, cell_done, cell_record, read_cell, sweep_root
from components.params import Params
from components.params_cli import params_from_args, stage_argparser
from components.run_files import settings_digest
from components.training.grpo.policy_run_key import run_settings
from tasks.runtime import flatten, resolve, run_stage, tracking


def cell_key(mine: Params, cell: Cell) -> str:
    """What a cell is (its ``cell_params``): its training run's key (components.training.grpo.policy_run_key,
    the judge's dial in it) and its evaluation's settings; a record of another key is run again, not read
    back."""
    return settings_digest({"train": run_settings(mine, cell.variant), "evaluation": mine.evaluation.model_dump()})


def finished_cell(params: Params, cell: Cell, mine: Params) -> dict | None:
    """The cell's record when it finished under ``mine`` (its ``cell_params``) and ran as many steps, else None
    (the run key leaves ``grpo.steps`` out, so a grid of another length would read a shorter cell back as its own)."""
    path = cell_done(sweep_root(params.run.out_dir, params.lab.sweep), cell)
    if not path.exists():
        return None
    record = read_json(path)
    return record if record.get("run_key") == cell_key(mine, cell) and record.get("steps") == mine.grpo.steps else None


@task(name="lab_cell")
def lab_cell(params: Params | None, cell: Cell, parent_run_id: str | None = None) -> dict:
    params = resolve(params)  # the cell's: run.out_dir is its folder (components.lab.sweep.cell_params)
    folder = Path(params.run.out_dir)
    record = {**read_cell(folder, cell), "run_key": cell_key(params, cell)}
    with tracking(params, f"lab@{cell.name}", parent_run_id,
                  tags={"variant": cell.variant, "dial": cell.dial, "seed": str(cell.seed)}) as run:
        run.log_params({"variant": cell.variant, "dial": cell.dial, "seed": cell.seed,
                        "judge": params.lab.judge.model_dump()})
        run.log_metrics({k: v for k, v in flatten({k: record[k] for k in ("test_em", "judge_calls", "health")}).items()
                         if isinstance(v, float)})
        for point in record["curve"]:
            run.log_metrics({"dev_em": point["em"], "judge_calls_so_far": point["calls"]}, step=int(point["step"]))
    write_json(cell_record(folder, cell), record)
    return record


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--variant", required=True)
    parser.add_argument("--dial", required=True, help="the cell's dial name (lab.sweep.dials)")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    from components.lab.sweep import cell_params

    cell = Cell(args.variant, args.dial, args.seed)
    print(lab_cell.fn(cell_params(params_from_args(args), cell), cell))


if __name__ == "__main__":
    run_stage(main)
