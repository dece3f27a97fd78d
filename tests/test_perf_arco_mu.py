"""perf/bench_arco_mu.py's modes: which parts it accepts and the arco settings each gives mu."""

import argparse

import pytest

from components.params_load import load_params
from perf.bench_arco_mu import mode_name, mode_params


@pytest.fixture(scope="module")
def params(repo_root):
    return load_params(repo_root / "params.yaml")


def test_each_part_sets_its_arco_key_and_the_rest_stays_as_params_yaml_has_it(params):
    base = params.arco
    padded = mode_params(params, mode_name("fused+padded+recompute")).arco
    assert (padded.micro_batch_tokens, padded.checkpoint_min_tokens, padded.prefix_packing) == (None, 0, False)
    assert base.prefix_packing
    grouped = mode_params(params, mode_name("grouped")).arco
    assert not grouped.prefix_packing and grouped.micro_batch_tokens == base.micro_batch_tokens
    kept = mode_params(params, mode_name("kept")).arco
    assert kept.checkpoint_min_tokens > 10**9 and kept.micro_batch_tokens == base.micro_batch_tokens
    wide = mode_params(params, mode_name("fused+write_batch=8")).arco
    assert wide.write_batch == 8 and wide.model_dump(exclude={"write_batch"}) == base.model_dump(exclude={"write_batch"})
    assert mode_params(params, "fp32").arco == base


@pytest.mark.parametrize("bad", ["fast", "fused+fused", "recompute+kept", "fused+no_such_key=3"])
def test_unknown_or_contradictory_parts_are_refused(bad):
    with pytest.raises(argparse.ArgumentTypeError):
        mode_name(bad)


def test_a_value_the_arco_section_refuses_is_refused(params):
    with pytest.raises(ValueError, match="write_batch"):
        mode_params(params, mode_name("write_batch=0"))
