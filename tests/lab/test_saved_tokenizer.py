"""A stage loads the nano policy's folder with the tokenizer it was trained with: transformers' AutoTokenizer
turns a Qwen2 folder's saved pipeline into Qwen2Tokenizer and splits the world names the lab keeps whole, so every
lab stage read its questions in tokens the policy never saw; components.hf_tokenizer loads the pipeline as saved."""

from transformers import AutoTokenizer

from components.hf_tokenizer import load_tokenizer
from components.lab.nano import fit_tokenizer, nano_qwen2
from components.lab.params import NanoParams
from components.training.model import load_backend_weights

TEXTS = ["Elard Dorancott directed Moray Carnival.", "Who founded Evhaven Pictures?"] * 20


def _folder(tmp_path):
    tok = fit_tokenizer(TEXTS, vocab_size=600)
    model = nano_qwen2(NanoParams(vocab_size=600, hidden_size=32, num_layers=1, num_heads=2, num_kv_heads=1,
                                  intermediate_size=64, max_positions=128), tok)
    model.save_pretrained(tmp_path)
    tok.save_pretrained(tmp_path)
    return tok


def test_a_saved_pipeline_comes_back_as_it_was_fitted(tmp_path):
    fitted = _folder(tmp_path)
    text = "directed by Elard Dorancott?"
    assert load_tokenizer(tmp_path)(text)["input_ids"] == fitted(text)["input_ids"]
    name = fitted("Elard Dorancott")["input_ids"]
    assert len(name) == 1  # the lab keeps a name whole
    assert len(AutoTokenizer.from_pretrained(tmp_path)("Elard Dorancott")["input_ids"]) > 1  # why the loader exists


def test_the_trainable_policy_backend_reads_the_fitted_tokenizer(tmp_path, repo_root):
    from components.params_load import load_params
    from components.run_spec import run_spec

    fitted = _folder(tmp_path)
    params = load_params(repo_root / "params.yaml", overlays=["lab"],
                         overrides=[f"llm.backends.embedded-0_5b-hf.model={tmp_path}"])
    _, tokenizer = load_backend_weights(run_spec(params), "embedded-0_5b-hf")
    assert tokenizer("by Elard Dorancott")["input_ids"] == fitted("by Elard Dorancott")["input_ids"]
