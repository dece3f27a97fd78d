"""A name -> implementation registry in the style of verl: ``@REG.register("name")`` refuses to
silently replace a different object under the same name, and ``REG.get("pkg.module:attr")`` accepts a
dotted import path as an escape hatch for implementations that live outside rubricflow.

    BACKENDS = Registry("llm backend")

    @BACKENDS.register("openai")
    class OpenAIChatModel(ChatModel): ...

    BACKENDS.get("openai")               # the class
    BACKENDS.get("mypkg.backends:Mine")  # imported on demand
"""

from __future__ import annotations

import importlib
from typing import Callable, Generic, TypeVar

T = TypeVar("T")


class RegistryError(KeyError):
    """An unknown name, or a second, different object registered under a taken name."""

    def __str__(self) -> str:  # KeyError quotes its message; a plain sentence reads better
        return str(self.args[0])


class Registry(Generic[T]):
    def __init__(self, kind: str):
        self.kind = kind
        self._items: dict[str, T] = {}

    def register(self, name: str) -> Callable[[T], T]:
        def decorator(obj: T) -> T:
            existing = self._items.get(name)
            if existing is not None and existing is not obj:
                raise RegistryError(f"{self.kind} {name!r} is already registered to {existing!r}")
            self._items[name] = obj
            return obj

        return decorator

    def get(self, name: str) -> T:
        if name in self._items:
            return self._items[name]
        if ":" in name or "." in name:
            module_name, _, attr = name.partition(":") if ":" in name else name.rpartition(".")
            try:
                return getattr(importlib.import_module(module_name), attr)
            except (ImportError, AttributeError) as exc:
                raise RegistryError(f"{self.kind} {name!r}: cannot import ({exc})") from exc
        raise RegistryError(f"unknown {self.kind} {name!r}; known: {sorted(self._items)}")

    def names(self) -> list[str]:
        return sorted(self._items)

    def __contains__(self, name: str) -> bool:
        return name in self._items
