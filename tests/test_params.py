from pathlib import Path

import pytest

from components.params_load import load_params
from components.params_section import ParamsError


def test_repository_params_load_in_both_profiles(repo_root):
    embedded = load_params(repo_root / "params.yaml")
    paper = load_params(repo_root / "params.yaml", "paper")
    assert embedded.profile == "embedded" and paper.profile == "paper"
    # the paper profile carries Co-ReAct appendix A's values
    assert paper.collect.max_depth == 12 and paper.data.n_train == 11406
    assert paper.collect.temperatures == [0.1, 0.4, 0.7, 1.0]
    assert len(paper.llm.roles["candidate_policies"]) * len(paper.collect.temperatures) == 12
    # the paper's evaluator and verifier answer a checklist per action; the embedded 1.5B answers yes/no per criterion
    assert (paper.rubric_generator.evaluator_mode, paper.coreact.verifier_mode) == ("action", "checklist")
    assert (embedded.rubric_generator.evaluator_mode, embedded.coreact.verifier_mode) == ("criterion", "criterion")
    # the paper's generator trains from its base; the embedded 0.5B first learns rubrics that name the next hop
    assert (paper.rubric_generator.warm_start, embedded.rubric_generator.warm_start) == ("none", "oracle")
    # nothing in the default profile points at a scripted backend
    assert all(b.type != "scripted" for b in embedded.llm.backends.values())


def _write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "params.yaml"
    path.write_text(text)
    return path


BASE = """\
profile: embedded
llm:
  backends:
    b: {type: openai, base_url: "http://127.0.0.1:1/v1"}
  roles:
    policy: b
"""


def test_unknown_key_is_named_with_its_line(tmp_path):
    path = _write(tmp_path, BASE + "collect:\n  slate_size: 4\n  mmr_lamda: 0.5\n")
    with pytest.raises(ParamsError) as err:
        load_params(path)
    msg = str(err.value)
    assert "collect.mmr_lamda" in msg and "unknown key" in msg
    assert f"{path}:9:" in msg


def test_bad_value_is_named_with_its_line_and_value(tmp_path):
    path = _write(tmp_path, BASE + "collect:\n  mmr_lambda: 1.5\n")
    with pytest.raises(ParamsError) as err:
        load_params(path)
    msg = str(err.value)
    assert f"{path}:8: collect.mmr_lambda" in msg and "1.5" in msg


def test_bad_value_inside_a_profile_points_at_the_profile_line(tmp_path):
    path = _write(tmp_path, BASE + "profiles:\n  paper:\n    grpo:\n      clip_eps: -1\n")
    with pytest.raises(ParamsError) as err:
        load_params(path, "paper")
    assert f"{path}:10: grpo.clip_eps" in str(err.value)


def test_role_bound_to_unknown_backend_is_an_error(tmp_path):
    path = _write(tmp_path, BASE.replace("policy: b", "policy: nope"))
    with pytest.raises(ParamsError, match="unknown backend 'nope'"):
        load_params(path)


def test_unknown_profile_is_an_error(tmp_path):
    with pytest.raises(ParamsError, match="profile 'fast'"):
        load_params(_write(tmp_path, BASE), "fast")


def test_unknown_key_given_with_set_names_the_override_not_a_file_line(tmp_path):
    path = _write(tmp_path, BASE + "collect:\n  slate_size: 4\n")
    with pytest.raises(ParamsError) as err:
        load_params(path, overrides=["data.n_test=3", "collect.slate_sise=5"])
    assert str(err.value) == "--set collect.slate_sise=5: unknown key collect.slate_sise"


def test_bad_value_given_with_set_names_the_override_and_the_value(tmp_path):
    with pytest.raises(ParamsError) as err:
        load_params(_write(tmp_path, BASE), overrides=["collect.mmr_lambda=1.5"])
    assert str(err.value) == (
        "--set collect.mmr_lambda=1.5: collect.mmr_lambda: Input should be less than or equal to 1 (got 1.5)")


def test_override_that_breaks_a_cross_field_rule_is_named(tmp_path):
    with pytest.raises(ParamsError, match=r"^--set llm\.roles\.policy=nope: llm: .*unknown backend 'nope'"):
        load_params(_write(tmp_path, BASE), overrides=["llm.roles.policy=nope"])


def test_file_error_stays_at_its_line_when_an_unrelated_override_is_given(tmp_path):
    path = _write(tmp_path, BASE + "collect:\n  mmr_lambda: 1.5\n")
    with pytest.raises(ParamsError) as err:
        load_params(path, overrides=["data.n_test=3"])
    assert str(err.value).startswith(f"{path}:8: collect.mmr_lambda:")


def test_override_may_repair_the_file_and_a_later_one_is_blamed(tmp_path):
    path = _write(tmp_path, BASE + "collect:\n  mmr_lambda: 1.5\n")
    assert load_params(path, overrides=["collect.mmr_lambda=0.3"]).collect.mmr_lambda == 0.3
    with pytest.raises(ParamsError, match=r"^--set data\.n_test=-1: data\.n_test: "):
        load_params(path, overrides=["collect.mmr_lambda=0.3", "data.n_test=-1"])


@pytest.mark.parametrize(("override", "message"), [
    ("collect", "--set collect: expected KEY=VALUE with a dotted key, e.g. data.n_test=10"),
    ("=3", "--set =3: expected KEY=VALUE with a dotted key, e.g. data.n_test=10"),
    ("data..n_test=3", "--set data..n_test=3: expected KEY=VALUE with a dotted key, e.g. data.n_test=10"),
    ("seed.value=3", "--set seed.value=3: seed is a value, not a section"),
    ("data.n_test.x=3", "--set data.n_test.x=3: data.n_test is a value, not a section"),
    ("data.n_test=[1,", "--set data.n_test=[1,: value is not valid YAML: expected the node content, but found '<stream end>'"),
    ("nosuch.key=1", "--set nosuch.key=1: unknown key nosuch"),
])
def test_malformed_overrides_are_one_line_errors_naming_the_override(tmp_path, override, message):
    with pytest.raises(ParamsError) as err:
        load_params(_write(tmp_path, BASE + "seed: 7\ndata:\n  n_test: 5\n"), overrides=[override])
    assert str(err.value) == message


def test_set_profile_selects_the_profile(tmp_path):
    path = _write(tmp_path, BASE + "collect:\n  max_depth: 2\nprofiles:\n  paper:\n    collect: {max_depth: 9}\n")
    params = load_params(path, overrides=["profile=paper"])
    assert params.profile == "paper" and params.collect.max_depth == 9


@pytest.mark.parametrize(("text", "message"), [
    ("profile: [\n", ":2: invalid YAML: expected the node content"),
    ("- a\n- b\n", ":1: expected a mapping at the top level"),
    (BASE + "profiles: [paper]\n", ":7: profiles: expected a mapping of profile names"),
])
def test_bad_params_files_are_one_line_errors_with_file_and_line(tmp_path, text, message):
    path = _write(tmp_path, text)
    with pytest.raises(ParamsError) as err:
        load_params(path)
    assert str(err.value).startswith(f"{path}{message}") and "\n" not in str(err.value)


def test_missing_params_file_is_a_params_error(tmp_path):
    with pytest.raises(ParamsError, match=r"nope\.yaml: cannot read params file: No such file"):
        load_params(tmp_path / "nope.yaml")


def test_stage_adapters_are_read_under_the_runs_out_dir(repo_root):
    default = load_params(repo_root / "params.yaml")
    moved = load_params(repo_root / "params.yaml", overrides=["run.out_dir=outputs/hotpotqa"])
    assert default.llm.backends["embedded-0_5b-sft"].lora == "outputs/sft/adapter"
    assert moved.llm.backends["embedded-0_5b-sft"].lora == "outputs/hotpotqa/sft/adapter"  # not the world run's
    served = [b.lora for b in moved.llm.backends.values() if b.lora]
    assert served and all(str(path).startswith("outputs/hotpotqa/") for path in served)
    listed = load_params(repo_root / "params.yaml", overrides=[
        "run.out_dir=/runs/a", "llm.backends.embedded-0_5b-sft.lora=[x.gguf, '{out_dir}/rl']"])
    assert listed.llm.backends["embedded-0_5b-sft"].lora == ["x.gguf", "/runs/a/rl"]
