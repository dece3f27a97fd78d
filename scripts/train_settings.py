"""The settings each ``train_policy@<variant>`` run trains with, side by side: a method's variants beside its matched
baselines and the shared grpo / dapo, as the resolved params give them (components.variants.variant_params, then the
trainer's configuration with the variant's refill: variant_grpo), one markdown row per variant.

    .venv/bin/python scripts/train_settings.py --profile paper
    .venv/bin/python scripts/train_settings.py --profile paper --variants arbor grpo_arbor dapo_arbor grpo dapo

A variant whose builder refuses the params (ARCO's under the paper profile wants its released setup's --set flags)
is shown with the refill the params alone give, and the reason in the last column.
"""

from __future__ import annotations

import sys
import tempfile
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))

from components.llm.backends.scripted import ScriptedChatModel  # noqa: E402
from components.method_registry import load_methods, variant_baseline, variant_method  # noqa: E402
from components.params import Params  # noqa: E402
from components.params_cli import params_from_args, stage_argparser  # noqa: E402
from components.params_section import ParamsError
from components.variants import VARIANTS, VariantContext, get_variant, variant_grpo, variant_params  # noqa: E402

COLUMNS = ["variant", "settings of", "lr", "KL", "temperature", "prompts/step", "group size", "TIS cap",
           "weight decay", "clip low", "clip high", "loss agg", "adv std", "dual clip", "steps", "refill rounds",
           "note"]


def row(params: Params, variant: str, out_dir: Path) -> list[str]:
    resolved = variant_params(params, variant)
    note, grpo = "", resolved.grpo
    try:
        parts = get_variant(variant)(VariantContext(resolved, lambda role: ScriptedChatModel([], name=role), None,
                                                    out_dir / variant))
        grpo = variant_grpo(resolved.grpo, parts)
    except (ParamsError, ValueError) as exc:
        note = str(exc).split(". ")[0]
    spec, baseline = variant_method(variant), variant_baseline(variant)
    owner = "shared" if spec is None else spec.name + (f" ({baseline.of} baseline)" if baseline else "")
    if variant == "dapo":
        owner = "dapo section"
    return [variant, owner, f"{grpo.lr:g}", f"{grpo.kl_coef:g}", f"{grpo.temperature:g}", str(grpo.prompts_per_step),
            str(grpo.group_size), "-" if grpo.tis_cap is None else f"{grpo.tis_cap:g}", f"{grpo.weight_decay:g}",
            f"{grpo.clip_eps:g}", f"{grpo.clip_eps if grpo.clip_eps_high is None else grpo.clip_eps_high:g}",
            grpo.loss_agg, grpo.adv_std, "-" if grpo.dual_clip_c is None else f"{grpo.dual_clip_c:g}", str(grpo.steps),
            str(grpo.dynamic_sampling_max_rounds or 0), note]


def main() -> None:
    parser = stage_argparser(__doc__)
    parser.add_argument("--variants", nargs="+", default=None, help="variants to show (default: every one)")
    args = parser.parse_args()
    params = params_from_args(args)
    load_methods()
    variants = args.variants or VARIANTS.names()
    with tempfile.TemporaryDirectory() as tmp:
        rows = [row(params, v, Path(tmp)) for v in variants]
    print(f"profile: {params.profile}\n")
    print("| " + " | ".join(COLUMNS) + " |")
    print("|" + "|".join("---" for _ in COLUMNS) + "|")
    for r in rows:
        print("| " + " | ".join(r) + " |")


if __name__ == "__main__":
    main()
