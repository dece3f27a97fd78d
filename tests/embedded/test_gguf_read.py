"""GGUFFile reads what gguf-py's stock reader reads: every metadata field (name, types, value) and every
tensor (name, shape, type, bytes), on a hand-written GGUF with each value kind, and on the real 0.5B (slow)."""

import numpy as np
import pytest

from components.embedded.gguf_read import GGUFFile
from tests.conftest import requires_embedded

gguf = pytest.importorskip("gguf")


def _same(path):
    stock, fast = gguf.GGUFReader(str(path)), GGUFFile(path)
    assert list(fast.fields) == list(stock.fields)
    for name, field in stock.fields.items():
        other = fast.fields[name]
        assert (other.offset, other.types, other.data) == (field.offset, field.types, field.data), name
        assert [p.tobytes() for p in other.parts] == [p.tobytes() for p in field.parts], name
        assert [p.dtype for p in other.parts] == [p.dtype for p in field.parts], name
        assert other.contents() == field.contents(), name
    assert [(t.name, t.tensor_type, list(t.shape), t.data_offset) for t in fast.tensors] == [
        (t.name, t.tensor_type, list(t.shape), t.data_offset) for t in stock.tensors]
    assert all(np.array_equal(a.data, b.data) for a, b in zip(fast.tensors, stock.tensors, strict=True))
    return fast


def test_every_value_kind_reads_as_the_stock_reader_reads_it(tmp_path):
    path = tmp_path / "kinds.gguf"
    writer = gguf.GGUFWriter(str(path), arch="qwen2")
    writer.add_string("general.name", "kinds ünï")
    writer.add_uint32("qwen2.block_count", 3)
    writer.add_int64("test.int64", -(2**40))
    writer.add_float32("test.f32", 0.25)
    writer.add_float64("test.f64", -1.5e300)
    writer.add_bool("test.bool", True)
    writer.add_array("tokenizer.ggml.tokens", ["a", "bb", "", "東京"])
    writer.add_array("tokenizer.ggml.scores", [0.5, -1.0, 2.0, 3.5])
    writer.add_array("tokenizer.ggml.token_type", [1, 2, 3, 4])
    rng = np.random.default_rng(0)
    writer.add_tensor("blk.0.attn_q.weight", rng.standard_normal((6, 32)).astype(np.float32))
    q8 = gguf.quants.quantize(rng.standard_normal((4, 64)).astype(np.float32), gguf.GGMLQuantizationType.Q8_0)
    writer.add_tensor("token_embd.weight", q8, raw_shape=q8.shape, raw_dtype=gguf.GGMLQuantizationType.Q8_0)
    writer.write_header_to_file()
    writer.write_kv_data_to_file()
    writer.write_tensors_to_file()
    writer.close()
    fast = _same(path)
    assert fast.fields["tokenizer.ggml.tokens"].contents() == ["a", "bb", "", "東京"]
    assert fast.fields["test.int64"].contents() == -(2**40)


@pytest.mark.slow
@requires_embedded
def test_the_real_model_reads_as_the_stock_reader_reads_it(repo_root):
    from components.embedded.models import ensure_gguf

    fast = _same(ensure_gguf("qwen2.5-coder-0.5b-instruct", repo_root / ".cache"))
    assert len(fast.fields["tokenizer.ggml.tokens"].contents()) > 150_000
