"""The methods rubricflow ships, and how a method plugs into the shared seams.

Each method is one package under ``components/methods/`` whose ``plugin`` module registers a
:class:`MethodSpec`: its name, the ``params.yaml`` sections it owns, the ``train_policy`` variants and the
agents it registers, and its doc page. Nothing is inferred from file or module names.

    from components.method_registry import METHODS, load_methods, variant_method

    load_methods()                       # imports components.methods.<name>.plugin for every shipped method
    METHODS.get("arbor").sections        # ("arbor",)
    variant_method("arco_frozen").name   # "arco"; None for the shared variants grpo and dapo

A method of your own registers the same way from any importable module: call ``METHODS.register`` in it and
name it in ``load_methods(extra=...)`` (or import it before the run).
"""

from __future__ import annotations

import importlib
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Literal

from components.registry import Registry

__all__ = ["METHODS", "SHIPPED", "HealthMetric", "MethodSpec", "agent_method", "load_methods", "method_section",
           "variant_health", "variant_method"]

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
class MethodSpec:
    name: str
    sections: tuple[str, ...]  # params sections the method owns; the first is the one a variant's run key holds
    variants: tuple[str, ...] = ()  # train_policy@<variant> names it registers in components.variants
    agents: tuple[str, ...] = ()  # agent names it registers in components.agents.react.AGENTS
    doc: str = ""  # its page under docs/methods/
    health: tuple[HealthMetric, ...] = ()  # its mechanism's own figures in its training runs' metrics

    def register(self) -> MethodSpec:
        return METHODS.register(self.name)(self)


METHODS: Registry[MethodSpec] = Registry("method")


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


def variant_method(variant: str) -> MethodSpec | None:
    """The method that registered ``variant``, or None for a shared variant (grpo, dapo)."""
    return _owner("variants", variant)


def variant_health(variant: str) -> tuple[HealthMetric, ...]:
    """The health figures of the method that registered ``variant`` (none for grpo and dapo)."""
    spec = variant_method(variant)
    return spec.health if spec is not None else ()


def agent_method(agent: str) -> MethodSpec | None:
    """The method that registered the agent ``agent`` (``scaffold`` -> RubricEM), or None for a shared one."""
    return _owner("agents", agent)


def method_section(spec: MethodSpec | None) -> str | None:
    """The params section a method's stages take their settings from (its first), or None."""
    return spec.sections[0] if spec is not None else None
