"""Overlays: named layers of params.yaml's `overlays` merged over the chosen profile, in the order given, before
`--set`; chosen with `--overlay NAME` (every entry point's parser), `load_params(..., overlays=[...])` or
`--set overlay=[NAME]`, never in the file. The repository's `smoke` overlay keeps the paper profile's wiring and
swaps its models and counts."""

from __future__ import annotations

from pathlib import Path

import pytest

from components.params_cli import params_from_args, stage_argparser
from components.params_load import load_params
from components.params_section import ParamsError

COUNTS = {"group_size", "prompts_per_step", "steps", "max_new_tokens", "epochs", "batch_size", "max_turns",
          "max_search_calls"}
"""What the smoke overlay sets to its minimum inside the per-method blocks."""

BASE = """\
profile: embedded
llm:
  backends:
    b: {type: openai, base_url: "http://127.0.0.1:1/v1"}
  roles:
    policy: b
collect: {max_depth: 2, slate_size: 4}
profiles:
  paper:
    collect: {max_depth: 9, n_questions: 9}
overlays:
  small:
    collect: {n_questions: 1}
  deeper:
    collect: {max_depth: 3}
  broken:
    collect:
      slate_size: 1
"""


def _write(tmp_path: Path, text: str = BASE) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


def test_an_overlay_goes_over_the_profile_and_under_set(tmp_path):
    path = _write(tmp_path)
    params = load_params(path, "paper", overlays=["small"])
    assert (params.profile, params.overlay) == ("paper", ["small"])
    assert (params.collect.max_depth, params.collect.n_questions) == (9, 1)  # the profile's, then the overlay's
    later = load_params(path, "paper", ["collect.n_questions=5"], overlays=["small", "deeper"])
    assert (later.collect.max_depth, later.collect.n_questions, later.overlay) == (3, 5, ["small", "deeper"])
    assert load_params(path).overlay == [] and load_params(path).collect.n_questions != 1


def test_set_overlay_and_the_command_line_choose_overlays(tmp_path):
    path = _write(tmp_path)
    assert load_params(path, overrides=["overlay=small"]).overlay == ["small"]
    assert load_params(path, overrides=["overlay=[small, deeper]"]).collect.max_depth == 3
    args = stage_argparser("x").parse_args(["--params", str(path), "--profile", "paper", "--overlay", "small",
                                            "--overlay", "deeper", "--set", "collect.slate_size=3"])
    params = params_from_args(args)
    assert (params.profile, params.overlay, params.collect.slate_size) == ("paper", ["small", "deeper"], 3)


@pytest.mark.parametrize(("text", "overlays", "message"), [
    (BASE, ["fast"], "overlay 'fast' is not defined under 'overlays' (known: ['broken', 'deeper', 'small'])"),
    (BASE, ["broken"], ":18: collect.slate_size: Input should be greater than or equal to 2 (got 1)"),
    (BASE, ["small", "small"], "an overlay is named twice"),
    (BASE + "overlay: [small]\n", None, ":19: overlay: choose overlays with --overlay NAME"),
    (BASE.replace("overlays:\n", "overlays: [x]\nx:\n"), None, ":11: overlays: expected a mapping of overlay names"),
])
def test_overlay_mistakes_are_one_line_errors(tmp_path, text, overlays, message):
    path = _write(tmp_path, text)
    with pytest.raises(ParamsError) as err:
        load_params(path, overlays=overlays)
    assert message in str(err.value) and "\n" not in str(err.value)


def test_the_smoke_overlay_keeps_the_paper_wiring_with_tiny_models(repo_root):
    paper = load_params(repo_root / "params.yaml", "paper")
    smoke = load_params(repo_root / "params.yaml", "paper", overlays=["smoke"])
    assert smoke.llm.roles == paper.llm.roles and set(paper.llm.backends) <= set(smoke.llm.backends)
    assert {(b.type, b.embedded, b.base_url) for b in smoke.llm.backends.values()} == {("hf", "tiny-qwen2", None)}
    assert smoke.train_policy.engine == "hf" and paper.train_policy.engine == "vllm"
    assert smoke.data.source == paper.data.source and smoke.methods.keys() == paper.methods.keys()
    assert smoke.run.out_dir == "outputs/smoke"  # beside a real run's outputs, never over them
    # the per-method blocks keep their keys and the paper's non-count values; their counts are minimal
    for section in ("arbor", "rubricem"):
        for block in ("grpo", "sft", "agent"):
            ours, theirs = getattr(getattr(smoke, section).shared, block), getattr(getattr(paper, section).shared, block)
            assert ours.keys() == theirs.keys()
            assert {k: v for k, v in ours.items() if k not in COUNTS} == {k: v for k, v in theirs.items()
                                                                         if k not in COUNTS}
    assert smoke.arbor.shared.grpo["steps"] == smoke.rubricem.shared.grpo["steps"] == smoke.grpo.steps == 1
    # the embedded default takes the overlay too, and its own run keys are untouched by the overlay's existence
    embedded = load_params(repo_root / "params.yaml", overlays=["smoke"])
    assert embedded.llm.roles == load_params(repo_root / "params.yaml").llm.roles
    assert {b.type for b in embedded.llm.backends.values()} == {"hf"}
