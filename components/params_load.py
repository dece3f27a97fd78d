"""Loading ``params.yaml``: profiles, overlays, ``--set`` overrides, and errors that name the key.

``params.yaml`` holds the embedded profile's values at the top level; ``profiles.<name>`` holds
overrides that are deep-merged on top when ``profile: <name>`` is selected (the ``paper`` profile carries
the papers' hyperparameters); ``overlays.<name>`` are further deep-merged layers, applied in the order
chosen (``--overlay NAME``) over the profile (``smoke``: the chosen profile's wiring with tiny models and
minimal counts); ``--set KEY=VALUE`` overrides (values parsed as YAML) come last. Unknown keys and bad
values raise a one-line ``ParamsError`` naming where the value came from and the dotted key:

    params.yaml:42: collect.mmr_lambda: Input should be less than or equal to 1 (got 1.5)
    --set grpo.lrr=1: unknown key grpo.lrr

    from components.params_load import load_params
    params = load_params("params.yaml")            # profile from the file
    params = load_params("params.yaml", "paper")   # or forced
    params = load_params("params.yaml", overrides=["data.n_test=10"])
    params = load_params("params.yaml", "paper", overlays=["smoke"])   # the paper wiring, tiny and fast
"""

from __future__ import annotations

import copy
from pathlib import Path
from typing import Any

import yaml
from pydantic import ValidationError

from components.params import Params
from components.params_section import ParamsError


def _deep_merge(base: dict, override: dict) -> dict:
    out = copy.deepcopy(base)
    for key, value in override.items():
        if isinstance(value, dict) and isinstance(out.get(key), dict):
            out[key] = _deep_merge(out[key], value)
        else:
            out[key] = copy.deepcopy(value)
    return out


def _line_of(node: yaml.Node | None, path: list[str], exact: bool = False) -> int | None:
    """1-based line of the key at ``path`` in a composed YAML tree, or of its deepest found ancestor (None with
    ``exact`` unless the whole path is found)."""
    line = None
    for key in path:
        if not isinstance(node, yaml.MappingNode):
            return None if exact else line
        for key_node, value_node in node.value:
            if key_node.value == key:
                line, node = key_node.start_mark.line + 1, value_node
                break
        else:
            return None if exact else line
    return line


def _yaml_problem(exc: yaml.YAMLError) -> str:
    """One line for a YAML error (PyYAML's own message spans several lines)."""
    problem = getattr(exc, "problem", None) or getattr(exc, "context", None) or str(exc)
    return " ".join(str(problem).split())


def _parse_override(item: str) -> tuple[list[str], Any]:
    key, sep, value = item.partition("=")
    parts = key.strip().split(".")
    if not sep or not all(parts):
        raise ParamsError(f"--set {item}: expected KEY=VALUE with a dotted key, e.g. data.n_test=10")
    try:
        return parts, yaml.safe_load(value)
    except yaml.YAMLError as exc:
        raise ParamsError(f"--set {item}: value is not valid YAML: {_yaml_problem(exc)}") from None


def apply_overrides(raw: dict, overrides: list[str] | None) -> dict:
    """Apply ``key.sub=value`` strings (values parsed as YAML) to a raw params mapping, in place."""
    for item in overrides or []:
        parts, value = _parse_override(item)
        node = raw
        for depth, part in enumerate(parts[:-1]):
            node = node.setdefault(part, {})
            if not isinstance(node, dict):
                section = ".".join(parts[: depth + 1])
                raise ParamsError(f"--set {item}: {section} is a value, not a section")
        node[parts[-1]] = value
    return raw


def _describe(err: dict) -> str:
    """``unknown key a.b`` or ``a.b: <what is wrong> (got <value>)`` for a pydantic error."""
    dotted = ".".join(str(p) for p in err["loc"]) or "(top level)"
    if err["type"] == "extra_forbidden":
        return f"unknown key {dotted}"
    got = f" (got {err['input']!r})" if err["type"] != "missing" and not isinstance(err["input"], dict) else ""
    return f"{dotted}: {err['msg']}{got}"


def _first_error(data: dict) -> dict | None:
    try:
        Params.model_validate(data)
    except ValidationError as exc:
        return exc.errors()[0]
    return None


def _same(a: dict, b: dict | None) -> bool:
    return b is not None and (a["loc"], a["type"], a["msg"]) == (b["loc"], b["type"], b["msg"])


def _chosen_overlays(given: list[str] | None, parsed: list[tuple[str, list[str], Any]]) -> list[str]:
    """The overlays to apply: ``given`` when not None, else the last ``--set overlay=...`` (a name or a list)."""
    if given is not None:
        return list(given)
    for item, key, value in reversed(parsed):
        if key == ["overlay"]:
            if value is None:
                return []
            names = [value] if isinstance(value, str) else value
            if not isinstance(names, list) or not all(isinstance(n, str) for n in names):
                raise ParamsError(f"--set {item}: overlay: expected an overlay name or a list of names")
            return list(names)
    return []


def load_params(path: str | Path = "params.yaml", profile: str | None = None,
                overrides: list[str] | None = None, overlays: list[str] | None = None) -> Params:
    """Validated params of ``path`` with ``profile`` applied, then each of ``overlays`` (names under the file's
    ``overlays``; None: those a ``--set overlay=...`` override names, else none), then ``overrides`` (``key=value``).

    An error names where it comes from: the ``--set`` text when an override introduced it, else the
    file line of the offending key (inside ``profiles.<name>`` or ``overlays.<name>`` when one of them set it)."""
    path = Path(path)
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as exc:
        raise ParamsError(f"{path}: cannot read params file: {exc.strerror if isinstance(exc, OSError) else exc}") from None
    try:
        raw = yaml.safe_load(text) or {}
        tree = yaml.compose(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ParamsError(f"{path}:{mark.line + 1 if mark else '?'}: invalid YAML: {_yaml_problem(exc)}") from None
    if not isinstance(raw, dict):
        raise ParamsError(f"{path}:1: expected a mapping at the top level")
    profiles = raw.pop("profiles", {}) or {}
    if not isinstance(profiles, dict):
        raise ParamsError(f"{path}:{_line_of(tree, ['profiles'])}: profiles: expected a mapping of profile names")
    layers = raw.pop("overlays", {}) or {}
    if not isinstance(layers, dict):
        raise ParamsError(f"{path}:{_line_of(tree, ['overlays'])}: overlays: expected a mapping of overlay names")
    if "overlay" in raw:
        raise ParamsError(f"{path}:{_line_of(tree, ['overlay'])}: overlay: choose overlays with --overlay NAME "
                          "(or --set overlay=[NAME]), not in the file: DVC does not track that choice")
    overrides = list(overrides or [])
    parsed = [(item, *_parse_override(item)) for item in overrides]
    chosen = profile or next((v for _, k, v in reversed(parsed) if k == ["profile"]), None) or raw.get("profile", "embedded")
    if chosen not in profiles and chosen != "embedded":
        raise ParamsError(f"{path}: profile {chosen!r} is not defined under 'profiles' (known: {sorted(profiles)})")
    if not isinstance(profiles.get(chosen) or {}, dict):
        raise ParamsError(f"{path}:{_line_of(tree, ['profiles', chosen])}: profiles.{chosen}: expected a mapping")
    applied = _chosen_overlays(overlays, parsed)
    for name in applied:
        if name not in layers:
            raise ParamsError(f"{path}: overlay {name!r} is not defined under 'overlays' (known: {sorted(layers)})")
        if not isinstance(layers[name] or {}, dict):
            raise ParamsError(f"{path}:{_line_of(tree, ['overlays', name])}: overlays.{name}: expected a mapping")
    if len(set(applied)) != len(applied):
        raise ParamsError(f"overlay {applied}: an overlay is named twice")
    base = _deep_merge(raw, profiles.get(chosen) or {})
    for name in applied:
        base = _deep_merge(base, layers[name] or {})
    base["profile"], base["overlay"] = chosen, applied

    def merged_with(items: list[str]) -> dict:
        merged = apply_overrides(copy.deepcopy(base), items)
        merged["profile"], merged["overlay"] = chosen, applied
        return merged

    try:
        return Params.model_validate(merged_with(overrides))
    except ValidationError as exc:
        err = exc.errors()[0]
    # blame the first override after which this very error appears; if the file alone has it, the file
    for k in range(len(parsed) + 1):
        if _same(err, _first_error(merged_with(overrides[:k]))):
            if k:
                raise ParamsError(f"--set {parsed[k - 1][0]}: {_describe(err)}")
            break
    keys = [str(p) for p in err["loc"]]
    for name in reversed(applied):  # the last overlay that sets the key itself
        line = _line_of(tree, ["overlays", name, *keys], exact=True)
        if line is not None:
            raise ParamsError(f"{path}:{line}: {_describe(err)}")
    line = None
    if chosen in profiles:
        line = _line_of(tree, ["profiles", chosen, *keys])
        if line is not None and _line_of(tree, ["profiles", chosen]) == line:
            line = None  # only the profile itself was found, not the key inside it
    line = line or _line_of(tree, keys) or 1
    raise ParamsError(f"{path}:{line}: {_describe(err)}")
