"""Stage `lab_sft`: the lab's nano policy trained from scratch by SFT (components/lab/experiment.py ``run_sft``)
into ``<run.out_dir>/sft`` (where ``--overlay lab`` binds every policy role), unless a start is already there, so
``python -m flows.lab`` runs on a fresh clone.

    python -m tasks.lab_sft --overlay lab
"""

from __future__ import annotations

from prefect import task

from components.io import read_json
from components.lab.experiment import lab_dir, run_sft
from components.params import Params
from components.params_cli import params_from_args, stage_argparser
from tasks.runtime import resolve, run_stage


@task(name="lab_sft")
def lab_sft(params: Params | None = None, seed: int = 0) -> dict:
    params = resolve(params)
    info = lab_dir(params.run) / "sft" / "sft.json"
    if info.exists():
        return read_json(info)
    threads = params.lab.sft_threads or params.run.torch_threads
    if threads:
        import torch

        torch.set_num_threads(threads)
    return run_sft(params, seed)


def main() -> None:
    args = stage_argparser(__doc__).parse_args()
    print(lab_sft.fn(params_from_args(args)))


if __name__ == "__main__":
    run_stage(main)
