"""Task `arco_probe`: ARCO's rubric models from finished train_policy runs score the same fixed trajectories
(components/methods/arco_probe.py), so frozen and co-evolved mu are compared on equal ground.

    python -m tasks.arco_probe                                   # arco_frozen, arco, arco_no_decomp if trained
    python -m tasks.arco_probe --variants arco_frozen arco --set grpo.steps=3 ...   # the runs' own --set flags

Each variant's mu is restored from the latest checkpoint under outputs/train/<variant>/ckpt (its method state:
mu's adapter and score head). The trajectories are the distinct greedy dev episodes those runs recorded
(dev_before.jsonl and dev_after.jsonl of every probed variant), on the dev questions of outputs/data/dev.jsonl.
Writes outputs/train/arco_probe.json (variant -> metrics) and logs it to MLflow (run `arco_probe`).
"""

from __future__ import annotations

from pathlib import Path

from components.io import read_json, read_jsonl, write_json
from components.llm.factory import LLMPool
from components.methods.arco_probe import distinct_trajectories, probe
from components.methods.variants import VariantContext, get_variant
from components.params import Params, ParamsError
from components.schemas import Question, Trajectory
from components.training.checkpoint import latest_checkpoint
from tasks.runtime import out_path, params_from_args, resolve, run_stage, stage_argparser, tracking

VARIANTS = ("arco_frozen", "arco", "arco_no_decomp")


def restored_state(params: Params, variant: str, pool: LLMPool):
    """The variant's ArcoState with mu as its run's latest checkpoint left it."""
    folder = Path(params.run.out_dir) / "train" / variant
    ckpt = latest_checkpoint(folder / "ckpt")
    if ckpt is None:
        raise FileNotFoundError(f"{folder / 'ckpt'}: no checkpoint; run python -m tasks.train_policy --variant {variant}")
    parts = get_variant(variant)(VariantContext(params=params, roles=pool.role, toolbox=None, out_dir=folder))
    state_file = ckpt / "method" / "state.json"
    state = read_json(state_file) if state_file.exists() else None
    if not (state or {}).get("warm"):
        raise ValueError(f"{ckpt}: mu was not warmed up yet in this checkpoint (train past arco.warmup_steps)")
    parts.method.load_state_dict(state, ckpt / "method" / "files")
    return parts.method, int(read_json(ckpt / "trainer_state.json")["step"])


def arco_probe(params: Params | None = None, variants: tuple[str, ...] | None = None) -> dict[str, dict[str, float]]:
    params = resolve(params)
    root = Path(params.run.out_dir) / "train"
    variants = tuple(variants or [v for v in VARIANTS if (root / v / "ckpt").exists()])
    if not variants:
        raise ParamsError(f"no trained ARCO variant under {root} (expected one of {', '.join(VARIANTS)})")
    questions = {q.id: q for q in read_jsonl(out_path(params, "data", "dev.jsonl"), Question)}
    trajectories = distinct_trajectories([t for v in variants for name in ("dev_before.jsonl", "dev_after.jsonl")
                                          if (root / v / name).exists() for t in read_jsonl(root / v / name, Trajectory)])
    results: dict[str, dict[str, float]] = {}
    with LLMPool(params) as pool:
        for variant in variants:
            state, step = restored_state(params, variant, pool)
            results[variant] = {**probe(state, trajectories, questions, seed=params.seed), "checkpoint_step": float(step),
                                "mu_updates": float(state.updates)}
            del state
    write_json(root / "arco_probe.json", results)
    with tracking(params, "arco_probe") as tracker:
        tracker.log_metrics({f"{v}.{k}": x for v, m in results.items() for k, x in m.items()})
        tracker.log_artifact(root / "arco_probe.json")
    return results


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--variants", nargs="+", default=None, help=f"trained variants to probe (default: {VARIANTS})")
    args = parser.parse_args()
    results = arco_probe(params_from_args(args), tuple(args.variants) if args.variants else None)
    keys = ["trajectories", "steps", "oracle_corr", "oracle_corr_ci_low", "oracle_corr_ci_high", "oracle_corr_within",
            "var_within", "decomp_gap", "criteria_distinct", "mu_updates"]
    print("variant".ljust(16) + "".join(k[:14].rjust(15) for k in keys))
    for variant, m in results.items():
        print(variant.ljust(16) + "".join(f"{m[k]:15.3f}" if k in m else "-".rjust(15) for k in keys))


if __name__ == "__main__":
    run_stage(main)
