"""What a ``train_policy@<variant>`` run is, for resuming and branching: its settings (digested into the run key
of its folder, :func:`components.run_files.keyed_folder`), its lineage (what every run that branches from it must
share: written to lineage.json) and the check that a branch point (``train_policy.branch_from``) comes from a run
of the same lineage.

    settings = run_settings(params, "arbor", agent="react")
    keyed_folder(folder, settings)                                 # resume only under the same settings
    write_json(folder / "lineage.json", lineage_record(settings))
    check_branch("outputs/train/arco/ckpt/step_000001", settings)  # ValueError naming what differs
"""

from __future__ import annotations

import hashlib
import json
import warnings
from pathlib import Path

from components.io import read_json
from components.llm.params import lora_paths
from components.method_registry import SHARED_RECIPES, variant_baseline, variant_method, variant_recipe
from components.params import Params
from components.run_files import settings_digest
from components.run_spec import run_spec
from components.training.device import placement
from components.training.warm_started import warm_start_adapter, warm_start_method

# grpo keys that change how an update is computed, never what it computes: not keyed, and free to differ on resume
GRPO_EXECUTION_KEYS = ("steps", "micro_batch_size", "micro_batch_tokens", "gradient_checkpointing",
                       "checkpoint_min_tokens", "fused_lora", "prefix_packing")


def run_settings(params: Params, variant: str, agent: str = "react") -> dict:
    """What a run of ``variant`` (rolling out ``agent``) is: a checkpoint is resumed only under the same settings
    and the same warm-start weights; ``grpo.steps`` (so a finished run can be extended), micro-batching (the
    same update, to a float tolerance; less memory), how the dev evaluation is served and the device the
    weights train on may change. Their dtype is keyed once it is not float32 (``train_policy.dtype``)."""
    from components.adapters import adapter_digest, whole_model_digest

    spec = run_spec(params)
    warm = warm_start_adapter(spec, agent)
    sections = ("seed", "data", "world", "retrieval", "agent", "llm", "lora")
    settings = {name: getattr(params, name) for name in sections}
    settings["train_policy"] = params.train_policy.model_dump(exclude={"warm_start", "eval_batch_invariant",
                                                                       "branch_from", "device", "dtype",
                                                                       "vllm_options", "deepspeed",
                                                                       "merge_warm_start", "eval_every"})
    if not params.train_policy.first_question:  # keyed once set, so earlier runs keep their keys
        settings["train_policy"].pop("first_question")
    if params.train_policy.deepspeed.zero_stage is not None:  # keyed once set, so earlier runs keep their keys
        settings["train_policy"]["deepspeed"] = params.train_policy.deepspeed.keyed()
    dtype = placement(params.train_policy).keyed()  # where the weights live is not keyed; their precision is, when not float32
    if dtype is not None:
        settings["train_policy"]["dtype"] = dtype
    if any(backend.type == "simulated" for backend in params.llm.backends.values()):  # the lab's judges
        settings["lab_judge"] = params.lab.judge  # their quality dial is part of what the run is
        if params.lab.world_seed is not None:  # another lab world; keyed once set, so the default's keys stay
            settings["lab_world_seed"] = params.lab.world_seed
    start = spec.backend("trainable_policy").model
    if start and (digest := whole_model_digest(start)):  # a whole model trained from (the lab's nano): its weights
        settings["start_weights"] = digest
    settings["branch_from"] = branch_digest(params.train_policy.branch_from)
    method = warm_start_method(spec, agent)
    settings["warm_start_method"] = params.methods.get(method) if method else None  # its prompts carry over
    execution = set(GRPO_EXECUTION_KEYS)
    # options added to grpo after runs were keyed (tis_cap, dynamic_sampling_max_rounds) enter the key once set,
    # so a run that leaves them unset keeps the key it had before they existed
    unset = {name for name, f in type(params.grpo).model_fields.items()
             if (f.json_schema_extra or {}).get("keyed_when_set") and getattr(params.grpo, name) is None}
    settings.update(variant=variant, grpo=params.grpo.model_dump(exclude=execution | unset),
                    method=method_settings(params, variant), warm_start=adapter_digest(warm) if warm is not None else None)
    return {k: v.model_dump() if hasattr(v, "model_dump") else v for k, v in settings.items()}


def method_settings(params: Params, variant: str) -> dict | None:
    """The run key's ``method`` entry: a method's variant holds its method's own section (less its ``shared`` block,
    keyed through the effective grpo/sft/agent blocks it was applied to, and less the fields marked execution-only,
    how work is batched, which may change on resume); a matched baseline only the keys of it the baseline declares
    it reads (:class:`components.method_registry.MatchedBaseline`: RubricEM's scaffold budget), never the
    mechanism's settings; a shared variant none. A variant of a recipe with a section of its own (dapo: clipping,
    refill, length shaping) holds that section too, under its name."""
    owner, baseline = variant_method(variant), variant_baseline(variant)
    section = SHARED_RECIPES.get(variant_recipe(variant) or "")
    recipe = {section: getattr(params, section).model_dump()} if section is not None else {}
    if owner is None:
        return recipe[section] if section is not None else None
    own = getattr(params, owner.sections[0])
    if baseline is not None:
        return {**{key: getattr(own, key) for key in baseline.reads}, **recipe} or None
    return own.model_dump(exclude={name for name, f in type(own).model_fields.items()
                                   if (f.json_schema_extra or {}).get("execution")} | {"shared"})


def branch_digest(branch_from: str | None) -> str | None:
    """The run-key entry of ``train_policy.branch_from``: the sha256 of the checkpoint's manifest (which lists
    every file's sha256), so a branch is keyed by the weights and state it starts from, not by a path."""
    if branch_from is None:
        return None
    manifest = Path(branch_from) / "manifest.json"
    if not manifest.exists():
        raise FileNotFoundError(f"train_policy.branch_from={branch_from}: no {manifest.name} there; name a complete "
                                "checkpoint folder such as outputs/train/arco/ckpt/step_000001")
    return hashlib.sha256(manifest.read_bytes()).hexdigest()


LINEAGE_VERSION = 2  # 1: adapters by path, so a run in another run.out_dir could not branch from the same weights


def lineage_settings(settings: dict, version: int = LINEAGE_VERSION) -> dict:
    """What a run shares with the runs that may branch from it: its settings without the variant and the branch
    point. The backends' adapters count by content (:func:`adapter_digest`; None when absent), not by path:
    paths follow ``run.out_dir``, which differs between a sweep's runs and a stage run beside them. ``version``
    1 kept the paths (the lineage.json of older runs)."""
    from components.adapters import adapter_digest

    shared = {k: v for k, v in settings.items() if k not in ("variant", "branch_from")}
    if version >= 2:
        shared["llm"] = {**shared["llm"], "backends": {
            name: {**b, "lora": [adapter_digest(p) for p in lora_paths(b["lora"])]} if b.get("lora") else b
            for name, b in shared["llm"]["backends"].items()}}
    return shared


def lineage(settings: dict, version: int = LINEAGE_VERSION) -> str:
    """The digest of :func:`lineage_settings` (written to lineage.json, checked by :func:`check_branch`)."""
    return settings_digest(lineage_settings(settings, version))


def lineage_record(settings: dict) -> dict:
    """lineage.json's content: the digest, its version and the settings digested (a refusal names what differs)."""
    shared = lineage_settings(settings)
    return {"lineage": settings_digest(shared), "version": LINEAGE_VERSION,
            "settings": json.loads(json.dumps(shared, default=str))}


def _differences(a: object, b: object, path: str = "") -> list[str]:
    if isinstance(a, dict) and isinstance(b, dict):
        return [d for k in sorted(set(a) | set(b)) for d in _differences(a.get(k), b.get(k), f"{path}.{k}" if path else k)]
    return [] if a == b else [path]


def check_branch(branch: str, settings: dict) -> None:
    """Refuse a branch point from a run trained under other shared settings (warm start, data, LoRA, GRPO,
    the method's section): its LoRA would sit on another base. A source run older than lineage.json is
    accepted with a warning."""
    source = Path(branch).parent.parent / "lineage.json"
    if not source.exists():
        warnings.warn(f"train_policy.branch_from={branch}: the source run has no lineage.json; cannot check that it "
                      "was trained under this run's warm start and settings", stacklevel=2)
        return
    stored = read_json(source)
    shared = lineage_settings(settings, stored.get("version", 1))
    if stored["lineage"] != settings_digest(shared):
        here = json.loads(json.dumps(shared, default=str))
        differ = _differences(stored["settings"], here) if "settings" in stored else []
        what = ", ".join(differ[:6]) if differ else "warm start, data, agent, llm, lora, grpo or the method's section"
        raise ValueError(f"train_policy.branch_from={branch}: that run was trained under other settings than this "
                         f"one ({what} differ; {source})")
