"""The pipeline's stages, declared once: the shared stages here, each method's own in its spec
(components/method_registry.py ``MethodSpec``: its variants, matched baselines, warm start, evaluations and
stages); the Prefect flow's DAG (flows/pipeline.py) and ``dvc.yaml`` are both derived from them, a stage waiting on
the stages whose outs its deps read, as DVC derives its edges. ``write-dvc`` rewrites ``dvc.yaml``; ``check-dvc``
exits 1 when the committed one is stale (tests/test_dag.py fails then too).

    .venv/bin/python -m components.dag write-dvc
"""

from __future__ import annotations

import argparse
import re
import sys
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, replace
from pathlib import Path

import yaml

from components.method_registry import SHARED_RECIPES, Evaluation, MethodSpec, Out, Stage, load_methods

__all__ = ["Resolved", "dvc_yaml", "edges", "evaluated_methods", "pipeline_stages", "resolve", "training_variants",
           "variant_warm_start", "warm_start_stages"]

DVC_YAML = Path(__file__).resolve().parents[1] / "dvc.yaml"
REACT = "components/agents/react.py"
SHARED_WARM_START = "sft"  # the shared ReAct warm start (params.methods.sft) every other method starts from
RUN_FILES = ("tasks/runtime.py", "components/params_cli.py", "components/run_files.py", "components/params.py",
             "components/params_load.py", "components/run_spec.py")
REPLAYED = "what dvc repro replays"


def _uncached(path: str, **kw) -> Out:
    return Out(path, cache=False, **kw)


PREPARE = Stage(
    "prepare", "prepare",
    deps=("tasks/prepare.py", *RUN_FILES, "components/world", "components/datasets",
          "components/retrieval/scope.py  # world questions' paragraph sets (retrieval.scope: question)",
          "components/retrieval/bm25.py", "components/schemas.py", "components/io.py"),
    params=("seed", "profile", "profiles  # a profile's overrides change effective values too", "data", "world"),
    outs=tuple(Out(f"outputs/data/{split}.jsonl") for split in ("train", "dev", "test", "corpus")),
    metrics=(_uncached("outputs/data/summary.json"),))

INDEX = Stage(
    "index", "index",
    deps=("tasks/index.py", *RUN_FILES[:3], "components/clipping.py", "components/params.py", "components/params_load.py",
          "components/retrieval",
          "components/embedded", "outputs/data/corpus.jsonl"),
    params=("profile", "profiles", "retrieval"),
    outs=(Out("outputs/index"),))

EVALUATE = Stage(
    "evaluate", "evaluate", args={"method": "${key}"},
    note="one stage per evaluated params.methods entry and per training variant",
    about="method -> its policy's adapter; the rubric generator's adapter (or its method package); its agent's "
          "package\n(or the ReAct agent); the section its agent's defaults come from; its params.methods entry.\n"
          "A training variant is evaluated as its final policy: train_policy's adapter served over its warm start's\n"
          "(needs), with the warm start's entry (components/trained_policy.py)",
    deps=("${item.policy}", "${item.needs}", "${item.package}", "tasks/evaluate.py", *RUN_FILES,
          "components/method_registry.py", "components/trained_policy.py", "components/agents",
          "components/evaluation", "components/judges", "components/llm", "components/retrieval",
          "components/embedded", "outputs/data/test.jsonl", "outputs/data/corpus.jsonl", "outputs/index"),
    params=("seed", "profile", "profiles", "agent", "llm", "evaluation", "${item.spec}", "${item.defaults}",
            "rubric_generator.max_criteria  # a guided agent's rubric sampling", "rubric_generator.temperature",
            "rubric_generator.top_p", "rubric_generator.max_tokens", "retrieval"),
    outs=(Out("outputs/eval/${key}/trajectories.jsonl"),
          Out("outputs/responses/evaluate/${key}.jsonl", persist=True, note=f"the replies it used: {REPLAYED}"),
          _uncached("outputs/eval/${key}/run_key.json"), _uncached("outputs/eval/${key}/timings.json")),
    metrics=(_uncached("outputs/eval/${key}/metrics.json"),),
    plots=(_uncached("outputs/eval/${key}/per_question.csv", x="question_id", y="f1"),))

TRAIN_POLICY = Stage(
    "train_policy", "train_policy", args={"variant": "${key}"},
    note="GRPO from the warm start, one stage per variant (components/variants.py VARIANTS)",
    about="variant -> the package of the method that registers it (grpo, dapo and the matched baselines of a shared\n"
          "recipe: the shared variants module), the params it reads beyond the shared blocks (a method's variant: "
          "its\nsection; a matched baseline: its method's `shared` block and what it declares it reads, never the "
          "mechanism's\nsettings; dapo: its section) and its warm start. A change to one method's package re-runs "
          "only that method's variants.",
    deps=("${item.package}", "tasks/train_policy.py", *RUN_FILES[:3], "components/policy_run.py", "components/run_spec.py",
          "components/variants.py", "components/params.py", "components/params_load.py", "components/method_registry.py",
          "components/rewards",
          "components/judges", "components/world  # ARCO's oracle diagnostics", "components/training",
          "components/agents", "components/evaluation", "components/llm", "components/retrieval",
          "components/embedded", "outputs/data/train.jsonl", "outputs/data/dev.jsonl", "outputs/data/corpus.jsonl",
          "outputs/index",
          "outputs/${item.warm}/adapter  # the warm start of the variant's agent (train_policy.warm_start)"),
    params=("seed", "profile", "profiles", "agent", "llm", "lora", "grpo", "train_policy", "retrieval",
            "methods.${item.warm}  # the warm start's agent options", "${item.section}", "${item.reads}"),
    outs=(Out("outputs/train/${key}/adapter"),
          Out("outputs/responses/train_policy/${key}.jsonl", persist=True, note=f"the judges' replies: {REPLAYED}"),
          Out("outputs/train/${key}/ckpt", persist=True,
              note="kept across runs: a stopped run resumes from its last checkpoint"),
          _uncached("outputs/train/${key}/timings.json")),
    metrics=(_uncached("outputs/train/${key}/metrics.json"),),
    plots=(_uncached("outputs/train/${key}/metrics.csv", x="step"),),
    report=("outputs/train/${key}/metrics.csv", "outputs/train/${key}/timings.json"))

HEAD_TO_HEAD = Stage(
    "head_to_head", "head_to_head",
    note="every evaluate@* output in one table (components/reporting/head_to_head.py)",
    about="Its deps are every evaluation, so `dvc repro head_to_head` runs them all first; `dvc repro -s head_to_head`\n"
          "reports what exists. A sweep's seed folders (<out_dir>/<sweep.out_dir>/seed_<S>/) are read too, untracked.\n"
          "Beyond the evaluations it reads each training stage's compute (the stages' `report` files).",
    deps=("tasks/head_to_head.py", "tasks/runtime.py", "components/params_cli.py", "components/params.py",
          "components/params_load.py", "components/llm/params.py  # llm", "components/agents/params.py  # methods",
          "components/training/params.py  # train_policy", "components/io.py", "components/method_registry.py", "components/trained_policy.py",
          "components/reporting", "outputs/eval  # every evaluate@<method> and evaluate@<variant>"),
    params=("seed", "profile", "profiles", "llm  # the backends' prices",
            "methods  # which backend each role of a method runs on",
            "train_policy.warm_start  # ... and of a trained policy", "sweep.out_dir"),
    outs=(*(_uncached(f"outputs/head_to_head/head_to_head.{ext}") for ext in ("json", "csv", "md", "png")),
          _uncached("docs/results/head_to_head.md"), _uncached("docs/results/head_to_head.json")))


def warm_start_stages(method: str, spec: MethodSpec | None = None) -> tuple[Stage, Stage]:
    """The two stages that train the warm-start ``method`` (a params.methods entry named sft or sft_<x>):
    sft_data[_<x>] (the oracle's and teacher's trajectories) and sft[_<x>] (LoRA SFT on them), named as
    ``RunSpec.warm_start_folder`` (components/run_spec.py) names their folders. A method's own warm start (``spec``) reads
    its package too (RubricEM's scaffold format and reflection rows)."""
    data = "sft_data" + method.removeprefix("sft")
    args = {} if method == SHARED_WARM_START else {"method": method}
    own = (f"{spec.package}  # its warm-start format and its reflection rows",) if spec is not None else ()
    whose = f"{spec.name}'s warm start" if spec is not None else None
    return (
        Stage(data, "sft_data", args=args, note=f"{whose} data: methods.{method}" if whose else "",
              deps=("tasks/sft_data.py", *RUN_FILES, "components/method_registry.py", "components/warmstart", *own,
                    "components/datasets/params.py  # data.source", "components/training/params.py  # sft.*",
                    "components/world", "components/agents", "components/evaluation", "components/llm",
                    "components/retrieval", "components/embedded", "outputs/data/train.jsonl",
                    "outputs/data/corpus.jsonl", "outputs/index"),
              params=("seed", "profile", "profiles", "data.source", "world", "agent", "llm", "retrieval",
                      "sft.n_worlds", "sft.n_oracle", "sft.n_teacher_questions", "sft.samples_per_question",
                      "sft.teacher_temperature", "sft.min_f1", "sft.reflection_rows", "rubricem.reflection_max_tokens",
                      f"methods.{method}"),
              outs=(Out(f"outputs/{data}/trajectories.jsonl"),
                    Out(f"outputs/responses/{data}.jsonl", persist=True, note=f"the teacher's replies: {REPLAYED}"),
                    *(Out(f"outputs/{data}/{name}") for name in ("rejections.jsonl", "reflections.jsonl",
                                                                 "reflection_rejections.jsonl", "worlds")),
                    _uncached(f"outputs/{data}/timings.json")),
              metrics=(_uncached(f"outputs/{data}/metrics.json"),)),
        Stage(method, "sft", args=args, note=f"{whose}: LoRA SFT on {data}'s trajectories" if whose else "",
              deps=("tasks/sft.py", *RUN_FILES, "components/training", "components/agents", "components/embedded",
                    "components/llm/params.py  # the trainable policy's backend",
                    *own, f"outputs/{data}/trajectories.jsonl", f"outputs/{data}/reflections.jsonl"),
              params=("seed", "profile", "profiles", "agent", "lora", "sft", f"methods.{method}",
                      "llm.roles.trainable_policy", "run.torch_threads"),
              outs=(Out(f"outputs/{method}/adapter"), Out(f"outputs/{method}/ckpt"),
                    _uncached(f"outputs/{method}/timings.json")),
              metrics=(_uncached(f"outputs/{method}/metrics.json"),),
              plots=(_uncached(f"outputs/{method}/loss.csv", x="step", y="loss"),)))


@dataclass(frozen=True)
class Resolved:
    """One stage as it runs: ``python -m tasks.<task>`` with ``args`` (``--method react``), its dep and out paths."""

    name: str
    task: str
    args: dict[str, str]
    deps: tuple[str, ...]
    outs: tuple[str, ...]


_REF = re.compile(r"\$\{(key|item)(?:\.(\w+))?\}")


def _bare(text: str) -> str:
    return text.split("  # ", 1)[0]


def resolve(stages: Iterable[Stage]) -> dict[str, Resolved]:
    """Each stage, a ``foreach`` group expanded as DVC expands it (``evaluate@react``), in order."""
    resolved: dict[str, Resolved] = {}
    for stage in stages:
        if stage.foreach is None:
            instances = [(stage.name, None, None)]
        elif isinstance(stage.foreach, dict):
            instances = [(f"{stage.name}@{key}", key, item) for key, item in stage.foreach.items()]
        else:
            instances = [(f"{stage.name}@{item}", None, item) for item in stage.foreach]

        for name, key, item in instances:
            def fill(text: str, key=key, item=item) -> str:
                return _REF.sub(lambda m: str(key if m[1] == "key" else item[m[2]] if m[2] else item), _bare(text))

            resolved[name] = Resolved(name, stage.task, {k: fill(v) for k, v in stage.args.items()},
                                      tuple(fill(d) for d in stage.deps),
                                      tuple(fill(o.path) for o in (*stage.outs, *stage.metrics, *stage.plots)))
    return resolved


def _overlaps(dep: str, out: str) -> bool:
    return dep == out or dep.startswith(out + "/") or out.startswith(dep + "/")


def edges(resolved: dict[str, Resolved]) -> dict[str, list[str]]:
    """Stage -> the stages whose outs its deps read (a path, or a folder holding or inside one), in stage order."""
    return {name: [other for other, up in resolved.items() if other != name
                   and any(_overlaps(dep, out) for dep in stage.deps for out in up.outs)]
            for name, stage in resolved.items()}


def _specs(specs: Sequence[MethodSpec] | None) -> list[MethodSpec]:
    return list(load_methods()) if specs is None else list(specs)


def training_variants(specs: Sequence[MethodSpec] | None = None) -> list[str]:
    """Every train_policy@<variant>: the shared ones (registered in components.variants but owned by no method:
    grpo, dapo), then each method's variants and matched baselines."""
    from components.variants import VARIANTS  # imports the recipes; only a stage list needs them

    specs = _specs(specs)
    owned = {v for spec in specs for v in spec.trained()}
    order = list(SHARED_RECIPES)
    shared = sorted((v for v in VARIANTS.names() if v not in owned),
                    key=lambda v: (order.index(v) if v in order else len(order), v))
    return [*shared, *(v for spec in specs for v in spec.trained())]


def _owner(variant: str, specs: Sequence[MethodSpec]) -> MethodSpec | None:
    return next((spec for spec in specs if variant in spec.trained()), None)


def variant_warm_start(variant: str, specs: Sequence[MethodSpec] | None = None) -> str:
    """The warm-start entry ``variant`` trains from: its method's own (RubricEM's sft_scaffold), else sft."""
    owner = _owner(variant, _specs(specs))
    return owner.warm_start if owner is not None and owner.warm_start else SHARED_WARM_START


def _variant_items(specs: Sequence[MethodSpec]) -> tuple[dict[str, dict[str, str]], dict[str, dict[str, str]]]:
    """(train_policy's foreach items, evaluate's items of the trained policies)."""
    train, evaluate = {}, {}
    for variant in training_variants(specs):
        owner = _owner(variant, specs)
        warm = variant_warm_start(variant, specs)
        baseline = next((b for b in owner.baselines if b.variant == variant), None) if owner is not None else None
        if owner is None:
            section = reads = SHARED_RECIPES.get(variant) or "grpo"
            package = "components/variants.py"
        elif baseline is None:
            section = reads = owner.sections[0]
            package = owner.package
        else:
            section = f"{owner.sections[0]}.shared"
            if len(baseline.reads) > 1:
                raise ValueError(f"{owner.package}/plugin.py: matched baseline {variant!r} reads {baseline.reads}; "
                                 f"a dvc.yaml item holds one key")
            reads = f"{owner.sections[0]}.{baseline.reads[0]}" if baseline.reads else section
            package = "components/variants.py" if baseline.recipe is not None else owner.package
        own_agent = owner is not None and owner.warm_start is not None
        train[variant] = {"package": package, "section": section, "reads": reads, "warm": warm}
        evaluate[variant] = {"policy": f"outputs/train/{variant}/adapter", "needs": f"outputs/{warm}/adapter",
                             "package": owner.package if own_agent else REACT,
                             "defaults": owner.agent_defaults if own_agent else "agent", "spec": f"methods.{warm}"}
    return train, evaluate


def _evaluations(specs: Sequence[MethodSpec]) -> list[tuple[MethodSpec, Evaluation]]:
    """Each method's evaluated entries, then its own warm start's."""
    return [(spec, e) for spec in specs
            for e in (*spec.evaluations, *((Evaluation(spec.warm_start),) if spec.warm_start else ()))]


def evaluated_methods(specs: Sequence[MethodSpec] | None = None) -> list[str]:
    """The params.methods entries the pipeline evaluates: react and sft, then each method's."""
    return ["react", SHARED_WARM_START, *(e.method for _, e in _evaluations(_specs(specs)))]


def _adapter(stage: str, resolved: dict[str, Resolved]) -> str:
    if stage not in resolved:
        raise ValueError(f"an evaluation serves the adapter of {stage!r}, which is no stage "
                         f"(known: {', '.join(resolved)})")
    adapters = [out for out in resolved[stage].outs if out.endswith("/adapter")]
    if len(adapters) != 1:
        raise ValueError(f"{stage}: an evaluation serves its adapter, but it writes {len(adapters)} (outs {adapters})")
    return adapters[0]


def pipeline_stages(specs: Sequence[MethodSpec] | None = None) -> list[Stage]:
    """Every stage of the pipeline, in dvc.yaml's order: the shared ones and each method's (its warm start, its own
    stages, its variants and evaluations)."""
    specs = _specs(specs)
    warm = [*warm_start_stages(SHARED_WARM_START),
            *(stage for spec in specs if spec.warm_start for stage in warm_start_stages(spec.warm_start, spec))]
    own = [stage for spec in specs for stage in spec.stages]
    train, trained = _variant_items(specs)
    trainers = [*own, replace(TRAIN_POLICY, foreach=train)]
    upstream = resolve([PREPARE, INDEX, *warm, *trainers])

    sft = f"outputs/{SHARED_WARM_START}/adapter"
    evaluate = {"react": {"policy": REACT, "needs": REACT, "package": REACT, "defaults": "agent", "spec": "methods.react"},
                SHARED_WARM_START: {"policy": sft, "needs": sft, "package": REACT, "defaults": "agent",
                                    "spec": f"methods.{SHARED_WARM_START}"}}
    for spec, e in _evaluations(specs):
        if len(e.serves) > 1:
            raise ValueError(f"{spec.package}/plugin.py: evaluation {e.method!r} serves {e.serves}; a dvc.yaml item "
                             f"holds one")
        evaluate[e.method] = {"policy": f"outputs/{spec.warm_start or SHARED_WARM_START}/adapter",
                              "needs": _adapter(e.serves[0], upstream) if e.serves else spec.package,
                              "package": spec.package, "defaults": spec.agent_defaults, "spec": f"methods.{e.method}"}
    duplicated = sorted(set(evaluate) & set(trained))
    if duplicated:
        raise ValueError(f"evaluate@{duplicated[0]}: both a params.methods entry and a training variant")
    evaluate |= trained

    # what head_to_head reads of each training stage: its report files, per instance
    reports = [path for stage in trainers if stage.report
               for instance in resolve([replace(stage, deps=stage.report)]).values() for path in instance.deps]
    head_to_head = replace(HEAD_TO_HEAD, deps=(*HEAD_TO_HEAD.deps, *reports))
    return [PREPARE, INDEX, replace(EVALUATE, foreach=evaluate), *warm, *trainers, head_to_head]


# dvc.yaml


def _note(text: str) -> tuple[str, str]:
    value, _, note = text.partition("  # ")
    return value, f"  # {note}" if note else ""


def _flags(out: Out) -> dict[str, bool | str]:
    return {key: value for key, value in (("persist", True if out.persist else None), ("x", out.x), ("y", out.y),
                                          ("cache", False if not out.cache else None)) if value is not None}


def _out_lines(out: Out, pad: str) -> list[str]:
    note = f"  # {out.note}" if out.note else ""
    flags = _flags(out)
    if not flags:
        return [f"{pad}- {out.path}{note}"]
    shown = [f"{key}: {str(value).lower() if isinstance(value, bool) else value}" for key, value in flags.items()]
    return [f"{pad}- {out.path}:", f"{pad}    {shown[0]}{note}", *(f"{pad}    {line}" for line in shown[1:])]


def _stage_lines(stage: Stage) -> list[str]:
    lines = [f"  {stage.name}:" + (f"  # {stage.note}" if stage.note else "")]
    lines += [f"    # {line}" for line in stage.about.splitlines()]
    body = "    "
    if stage.foreach is not None:
        if isinstance(stage.foreach, dict):
            lines.append("    foreach:")
            lines += [f"      {key}: {{{', '.join(f'{k}: {v}' for k, v in item.items())}}}"
                      for key, item in stage.foreach.items()]
        else:
            lines.append(f"    foreach: [{', '.join(stage.foreach)}]")
        lines.append("    do:")
        body = "      "
    lines.append(f"{body}cmd: python -m tasks.{stage.task}" + "".join(f" --{k} {v}" for k, v in stage.args.items()))
    for key, items in (("deps", stage.deps), ("params", stage.params)):
        if items:
            lines.append(f"{body}{key}:")
            lines += [f"{body}  - {value}{note}" for value, note in map(_note, items)]
    for key, outs in (("outs", stage.outs), ("metrics", stage.metrics), ("plots", stage.plots)):
        if outs:
            lines.append(f"{body}{key}:")
            lines += [line for out in outs for line in _out_lines(out, body + "  ")]
    return lines


def _data(stage: Stage) -> dict:
    """What dvc.yaml's text for ``stage`` must load as (the check on the text written)."""
    def out(o: Out) -> str | dict:
        return {o.path: _flags(o)} if _flags(o) else o.path

    body: dict = {"cmd": f"python -m tasks.{stage.task}" + "".join(f" --{k} {v}" for k, v in stage.args.items())}
    body |= {k: [_note(v)[0] for v in items] for k, items in (("deps", stage.deps), ("params", stage.params)) if items}
    body |= {k: [out(o) for o in outs] for k, outs in
             (("outs", stage.outs), ("metrics", stage.metrics), ("plots", stage.plots)) if outs}
    if stage.foreach is None:
        return body
    return {"foreach": stage.foreach if isinstance(stage.foreach, dict) else list(stage.foreach), "do": body}


HEADER = """\
# Written by `python -m components.dag write-dvc` from the shared stages in components/dag.py and each method's
# spec (components/methods/<name>/plugin.py: its variants, matched baselines, warm start, evaluations, stages):
# edit those and rerun it, not this file (tests/test_dag.py fails when it is stale). `dvc repro` runs each stage
# as `python -m tasks.<stage>`: the same code the Prefect flow (flows/pipeline.py) calls on the same DAG.
"""


def dvc_yaml(stages: Sequence[Stage] | None = None) -> str:
    """dvc.yaml's text for ``stages`` (default: the pipeline's). Raises ValueError if the text would not load as
    the stages say (a path YAML would read otherwise)."""
    stages = pipeline_stages() if stages is None else list(stages)
    text = HEADER + "stages:\n" + "\n".join("\n".join(_stage_lines(stage)) + "\n" for stage in stages)
    expected = {"stages": {stage.name: _data(stage) for stage in stages}}
    if yaml.safe_load(text) != expected:
        raise ValueError("dvc.yaml's text does not load as its stages: a value needs quoting")
    return text


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("command", choices=["write-dvc", "check-dvc"])
    parser.add_argument("--path", type=Path, default=DVC_YAML, help="the dvc.yaml to write or check")
    args = parser.parse_args(argv)
    text = dvc_yaml()
    if args.command == "write-dvc":
        args.path.write_text(text)
        print(f"wrote {args.path} ({len(text.splitlines())} lines)")
        return 0
    if args.path.read_text() != text:
        print(f"{args.path} is stale: run `python -m components.dag write-dvc`", file=sys.stderr)
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
