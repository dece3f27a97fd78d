from pathlib import Path

import pytest

from components.params import ParamsError, load_params


def test_repository_params_load_in_both_profiles(repo_root):
    embedded = load_params(repo_root / "params.yaml")
    paper = load_params(repo_root / "params.yaml", "paper")
    assert embedded.profile == "embedded" and paper.profile == "paper"
    # the paper profile carries Co-ReAct appendix A's values
    assert paper.rubric_generator.group_size == 8
    assert paper.rubric_generator.lr == 2e-6
    assert paper.collect.temperatures == [0.1, 0.4, 0.7, 1.0]
    assert len(paper.llm.roles["candidate_policies"]) * len(paper.collect.temperatures) == 12
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
