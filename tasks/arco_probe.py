"""Task `arco_probe`: ARCO's rubric models from finished train_policy runs score the same fixed trajectories
(components/methods/arco/probe.py), so frozen and co-evolved mu are compared on equal ground.

    python -m tasks.arco_probe                                   # arco_frozen, arco, arco_no_decomp if trained
    python -m tasks.arco_probe --variants arco_frozen arco --set grpo.steps=3 ...   # the runs' own --set flags
    python -m tasks.arco_probe --mu warm=arco:path/to/ckpt/step_000001 --mu coevolved=arco \
        --trajectories outputs/train/arco/dev_before.jsonl      # one run's mu before and after co-evolution

Each mu is restored from a checkpoint's method state (mu's adapter and score head): by default the latest one
under outputs/train/<variant>/ckpt; ``--mu LABEL=VARIANT[:CHECKPOINT]`` names others (a checkpoint the run's
``keep_last`` would prune can be copied aside first). The trajectories are the distinct greedy dev episodes the
probed runs recorded (their dev_before.jsonl and dev_after.jsonl) or the ``--trajectories`` files, on the dev
questions of outputs/data/dev.jsonl. Writes outputs/train/arco_probe.json (label -> metrics) and logs it to
MLflow (run `arco_probe`).
"""

from __future__ import annotations

from pathlib import Path

from components.io import read_json, read_jsonl, write_json
from components.llm.factory import LLMPool
from components.methods.arco.probe import distinct_trajectories, probe
from components.params import Params
from components.params_cli import params_from_args, stage_argparser
from components.params_section import ParamsError
from components.run_files import out_path
from components.schemas import Question, Trajectory
from components.training.checkpoint import latest_checkpoint
from components.variants import VariantContext, get_variant
from tasks.runtime import resolve, run_stage, tracking

VARIANTS = ("arco_frozen", "arco", "arco_no_decomp")


def restored_state(params: Params, variant: str, pool: LLMPool, checkpoint: Path | None = None):
    """The variant's ArcoState with mu as ``checkpoint`` (default: its run's latest) left it."""
    folder = Path(params.run.out_dir) / "train" / variant
    ckpt = checkpoint or latest_checkpoint(folder / "ckpt")
    if ckpt is None or not Path(ckpt, "trainer_state.json").exists():
        raise FileNotFoundError(f"{ckpt or folder / 'ckpt'}: no checkpoint; run python -m tasks.train_policy "
                                f"--variant {variant}")
    ckpt = Path(ckpt)
    parts = get_variant(variant)(VariantContext(params=params, roles=pool.role, toolbox=None, out_dir=folder))
    state_file = ckpt / "method" / "state.json"
    state = read_json(state_file) if state_file.exists() else None
    if not (state or {}).get("warm"):
        raise ValueError(f"{ckpt}: mu was not warmed up yet in this checkpoint (train past arco.warmup_steps)")
    parts.method.load_state_dict(state, ckpt / "method" / "files")
    return parts.method, int(read_json(ckpt / "trainer_state.json")["step"])


def parse_mu(spec: str) -> tuple[str, str, Path | None]:
    """``LABEL=VARIANT[:CHECKPOINT]`` -> (label, variant, checkpoint or None)."""
    label, sep, rest = spec.partition("=")
    variant, _, path = rest.partition(":")
    if not sep or not label or variant not in VARIANTS:
        raise ParamsError(f"--mu {spec}: expected LABEL=VARIANT[:CHECKPOINT] with VARIANT one of {', '.join(VARIANTS)}")
    return label, variant, Path(path) if path else None


def arco_probe(params: Params | None = None, variants: tuple[str, ...] | None = None,
               mus: list[tuple[str, str, Path | None]] | None = None,
               trajectory_files: list[Path] | None = None) -> dict[str, dict[str, float]]:
    params = resolve(params)
    root = Path(params.run.out_dir) / "train"
    if not mus:
        variants = tuple(variants or [v for v in VARIANTS if (root / v / "ckpt").exists()])
        mus = [(v, v, None) for v in variants]
    if not mus:
        raise ParamsError(f"no trained ARCO variant under {root} (expected one of {', '.join(VARIANTS)})")
    questions = {q.id: q for q in read_jsonl(out_path(params.run, "data", "dev.jsonl"), Question)}
    files = trajectory_files or [root / v / name for v in dict.fromkeys(v for _, v, _ in mus)
                                 for name in ("dev_before.jsonl", "dev_after.jsonl") if (root / v / name).exists()]
    trajectories = distinct_trajectories([t for f in files for t in read_jsonl(f, Trajectory)])
    results: dict[str, dict[str, float]] = {}
    with LLMPool(params) as pool:
        for label, variant, checkpoint in mus:
            state, step = restored_state(params, variant, pool, checkpoint)
            results[label] = {**probe(state, trajectories, questions, seed=params.seed), "checkpoint_step": float(step),
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
    parser.add_argument("--mu", action="append", default=[], metavar="LABEL=VARIANT[:CHECKPOINT]",
                        help="a mu to probe, from a variant's latest or a given checkpoint (repeatable)")
    parser.add_argument("--trajectories", nargs="+", type=Path, default=None, help="trajectory files to score")
    args = parser.parse_args()
    results = arco_probe(params_from_args(args), tuple(args.variants) if args.variants else None,
                         [parse_mu(m) for m in args.mu], args.trajectories)
    keys = ["trajectories", "steps", "oracle_corr", "oracle_corr_ci_low", "oracle_corr_ci_high", "oracle_corr_within",
            "var_within", "decomp_gap", "criteria_distinct", "mu_updates"]
    print("mu".ljust(16) + "".join(k[:14].rjust(15) for k in keys))
    for label, m in results.items():
        print(label.ljust(16) + "".join(f"{m[k]:15.3f}" if k in m else "-".rjust(15) for k in keys))


if __name__ == "__main__":
    run_stage(main)
