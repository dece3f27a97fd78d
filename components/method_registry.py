"""The methods rubricflow ships, and how a method plugs into the shared seams.

Each method is one package under ``components/methods/`` whose ``plugin`` module registers a
:class:`MethodSpec`: its name, the ``params.yaml`` sections it owns, the ``train_policy`` variants and the
agents it registers, its matched baselines (a shared baseline trained under the method's own settings:
:class:`MatchedBaseline`), the parts of a variant its mechanism changes, its warm start, the ``params.methods``
entries it evaluates, its own pipeline stages, and its doc page. The pipeline's DAG and ``dvc.yaml`` derive from
these specs (components/dag.py). Nothing is inferred from file or module names.

    from components.method_registry import METHODS, load_methods, variant_method

    load_methods()                       # imports components.methods.<name>.plugin for every shipped method
    METHODS.get("arbor").sections        # ("arbor",)
    variant_method("arco_frozen").name   # "arco"; None for the shared variants grpo and dapo
    variant_method("grpo_arbor").name    # "arbor": GRPO's parts under ARBOR's settings (its `shared` block)
    paired_baselines("arbor")            # ["grpo_arbor", "grpo"]: whom the head-to-head pairs it with, in order

A method of your own registers the same way from any importable module: call ``METHODS.register`` in it and
name it in ``load_methods(extra=...)`` (or import it before the run).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Literal

from components.registry import Registry

__all__ = ["METHODS", "SHARED_RECIPES", "SHIPPED", "Evaluation", "HealthMetric", "MatchedBaseline", "MethodSpec", "Out",
           "Stage", "agent_method", "load_methods", "method_section", "paired_baselines", "variant_baseline",
           "variant_health", "variant_method", "variant_recipe"]

SHIPPED = ("coreact", "arbor", "rubricem", "arco")  # the packages under components/methods/


@dataclass(frozen=True)
class HealthMetric:
    """One figure of a method's own mechanism, read from its training runs (``train_policy@<variant>``, or the
    stage that trained a model an inference-time method serves, such as Co-ReAct's rubric generator): a column
    of the run's ``metrics.csv`` (one row a step) summed, averaged or taken at the last step that logged it, or
    (``"final"``) a key of the ``metrics.json`` the run writes at its end. Whether the judges gave the mechanism
    anything to act on (ARBOR's admitted rubrics, RubricEM's flat groups, the generator's held-out Spearman).
    The head-to-head report shows them beside the method's row."""

    column: str
    label: str
    over_steps: Literal["sum", "mean", "last", "final"] = "sum"


@dataclass(frozen=True)
class MatchedBaseline:
    """A shared baseline trained under a method's own settings, as the method's paper compares with it: the run
    builds the baseline's parts only (no piece of the method's mechanism), while its params resolve as the
    method's (:func:`variant_method` names the method, so the method's ``shared`` block applies: learning rate,
    KL, temperature, batch, TIS, weight decay). Its run key holds the effective shared blocks and ``reads``,
    never the method's mechanism settings, so tuning the mechanism does not retrain its baseline."""

    variant: str  # its train_policy@<variant> name
    of: str  # the shared baseline it is ("grpo" or "dapo"); the head-to-head pairs the method with its "grpo" one
    # the shared recipe (SHARED_RECIPES; its builder components.variants.register_baselines registers as
    # ``variant``); None: the method's package registers a builder of its own (RubricEM's scaffold_grpo: answer-only GRPO
    # through the method's scaffold agent, from the method's warm start)
    recipe: str | None = None
    reads: tuple[str, ...] = ()  # keys of the method's section the baseline's run reads beyond `shared` (keyed)


@dataclass(frozen=True)
class Out:
    """An output of a :class:`Stage` as dvc.yaml declares it: ``persist`` (kept across runs), ``cache`` (False:
    tracked in git or rewritten each run), a plot's ``x`` and ``y`` columns, and a ``note`` written beside it."""

    path: str
    persist: bool = False
    cache: bool = True
    x: str | None = None
    y: str | None = None
    note: str = ""


@dataclass(frozen=True)
class Stage:
    """A pipeline stage, or a ``foreach`` group of them (``evaluate@react``), as both `dvc repro` and the Prefect
    flow run it: ``python -m tasks.<task>`` with ``args`` (``--reward ${item}``). Its deps, params and outs may
    use DVC's ``${key}``, ``${item}`` and ``${item.<field>}``; a dep or param written ``"path  # why"`` keeps its
    note in dvc.yaml. The stages it waits on are not listed: they are the stages whose outs its deps read
    (components/dag.py, as DVC derives them). ``report``: its files head_to_head reads (each training stage's
    compute). ``note`` / ``about``: dvc.yaml's comment on its name line / the lines below it."""

    name: str
    task: str
    args: dict[str, str] = field(default_factory=dict)
    deps: tuple[str, ...] = ()
    params: tuple[str, ...] = ()
    outs: tuple[Out, ...] = ()
    metrics: tuple[Out, ...] = ()
    plots: tuple[Out, ...] = ()
    foreach: tuple[str, ...] | dict[str, dict[str, str]] | None = None
    report: tuple[str, ...] = ()
    note: str = ""
    about: str = ""


@dataclass(frozen=True)
class Evaluation:
    """An ``evaluate@<method>`` stage: a ``params.methods`` entry one of the method's agents runs, on its warm
    start's policy, serving the adapters of the stages in ``serves`` too (Co-ReAct's trained generator)."""

    method: str
    serves: tuple[str, ...] = ()


@dataclass(frozen=True)
class MethodSpec:
    name: str
    sections: tuple[str, ...]  # params sections the method owns; the first is the one a variant's run key holds
    variants: tuple[str, ...] = ()  # train_policy@<variant> names it registers in components.variants
    agents: tuple[str, ...] = ()  # agent names it registers in components.agents.react.AGENTS
    doc: str = ""  # its page under docs/methods/
    health: tuple[HealthMetric, ...] = ()  # its mechanism's own figures in its training runs' metrics
    baselines: tuple[MatchedBaseline, ...] = ()  # the shared baselines trained under its settings
    # the components.variants.VariantParts fields its variants may set otherwise than its baselines (reward_fn,
    # advantage_fn, method, loss_fn, agent_options, order_prompts, ...): everything else a variant and its matched
    # baseline train with is the same (tests/test_matched_baselines.py)
    mechanism: tuple[str, ...] = ()
    # the params.methods entry its agents' own warm start is (RubricEM's sft_scaffold): stages sft_data_<x> and
    # sft_<x> train it reading the method's package, evaluate@<it> runs it, and its variants and matched baselines
    # train from it (train_policy.warm_start maps its agent to it); None: the shared ReAct warm start, sft
    warm_start: str | None = None
    evaluations: tuple[Evaluation, ...] = ()  # the evaluate@<method> stages of the params.methods entries it runs
    stages: tuple[Stage, ...] = ()  # its own stages beyond train_policy, evaluate and its warm start
    agent_defaults: str = "agent"  # the params section its agents' default options come from

    @property
    def package(self) -> str:
        """Its package, the dependency of its stages only (components/methods/<name>)."""
        return f"components/methods/{self.name}"

    def trained(self) -> tuple[str, ...]:
        """The train_policy@<variant> names it owns: its variants, then its matched baselines."""
        return (*self.variants, *(b.variant for b in self.baselines))

    def register(self) -> MethodSpec:
        return METHODS.register(self.name)(self)

    def baseline(self, of: str) -> MatchedBaseline | None:
        """Its matched baseline of the shared baseline ``of`` ("grpo", "dapo"), or None."""
        return next((b for b in self.baselines if b.of == of), None)


METHODS: Registry[MethodSpec] = Registry("method")

SHARED_RECIPES: dict[str, str | None] = {"grpo": None, "dapo": "dapo", "discard_homogeneous": None}
"""The shared baselines' recipes (their builders: ``components.variants.BASELINE_RECIPES``; ``grpo`` and ``dapo`` also
train under their own names) -> the params section that configures one, applied over grpo and keyed, or None."""


def load_methods(extra: Iterable[str] = ()) -> list[MethodSpec]:
    """Import every shipped method's plugin module (and any ``extra`` dotted modules), so each has registered
    its spec, variants and agents; return the specs. Safe to call more than once."""
    for name in SHIPPED:
        importlib.import_module(f"components.methods.{name}.plugin")
    for module in extra:
        importlib.import_module(module)
    return [METHODS.get(name) for name in METHODS.names()]


def _owner(kind: str, name: str) -> MethodSpec | None:
    """The loaded method whose ``kind`` (``variants`` or ``agents``) lists ``name``, or None."""
    return next((spec for spec in load_methods() if name in getattr(spec, kind)), None)


def variant_baseline(variant: str) -> MatchedBaseline | None:
    """The matched baseline ``variant`` is (``grpo_arbor``: ARBOR's GRPO), or None."""
    return next((b for spec in load_methods() for b in spec.baselines if b.variant == variant), None)


def variant_method(variant: str) -> MethodSpec | None:
    """The method whose settings ``variant`` trains under: the one that registered it, or whose matched baseline it
    is; None for a shared variant (grpo, dapo)."""
    return _owner("variants", variant) or next(
        (spec for spec in load_methods() if any(b.variant == variant for b in spec.baselines)), None)


def variant_recipe(variant: str) -> str | None:
    """The shared recipe ``variant`` runs (``grpo``, ``dapo``; a matched baseline's), or None (a method's own)."""
    baseline = variant_baseline(variant)
    if baseline is not None:
        return baseline.recipe
    return variant if variant in SHARED_RECIPES and variant_method(variant) is None else None


def paired_baselines(variant: str) -> list[str]:
    """The baselines the head-to-head pairs ``variant`` with, the first evaluated one taken: a method's variants
    and its matched DAPO its matched GRPO, then ``grpo``; ``dapo`` the shared ``grpo``; none for a GRPO (it is a
    baseline: ``grpo``, ``grpo_arbor``, ``scaffold_grpo``)."""
    if variant == "grpo":
        return []
    spec, baseline = variant_method(variant), variant_baseline(variant)
    if baseline is not None and baseline.of == "grpo":
        return []
    matched = spec.baseline("grpo") if spec is not None else None
    return [matched.variant, "grpo"] if matched is not None else ["grpo"]


def variant_health(variant: str) -> tuple[HealthMetric, ...]:
    """The health figures of the method that registered ``variant`` (none for grpo, dapo and a matched baseline,
    which runs none of the method's mechanism)."""
    spec = variant_method(variant)
    return spec.health if spec is not None and variant_baseline(variant) is None else ()


def agent_method(agent: str) -> MethodSpec | None:
    """The method that registered the agent ``agent`` (``scaffold`` -> RubricEM), or None for a shared one."""
    return _owner("agents", agent)


def method_section(spec: MethodSpec | None) -> str | None:
    """The params section a method's stages take their settings from (its first), or None."""
    return spec.sections[0] if spec is not None else None
