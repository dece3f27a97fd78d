"""Stop strings are found in linear time with the same results as decoding the whole prefix at every token.

The reference below is the quadratic check the engine used before (decode ``tokens[:j + 1]`` for every
``j``). Toy tokenizers cover what makes incremental decoding hard: stop strings spanning tokens,
multi-character tokens, characters split over several byte tokens (U+FFFD until complete), a tokenizer
that drops the leading space of the first token, and tokens without text. The embedded Qwen tokenizer
(byte-level BPE) is checked too when its GGUF is available (about 10 s to read).

    python -m pytest -q tests/training/test_training_stop_strings.py
"""

import random
from pathlib import Path

import pytest
import torch

from components.training.engines.rollout import HFRolloutEngine, SamplingParams, _find_stop, _StopStrings
from components.training.model import LoRASettings, build_policy
from components.training.tiny import CharTokenizer, tiny_qwen2

pytestmark = pytest.mark.usefixtures("one_thread")


def quadratic_find_stop(tokens, stop_ids, stop_strings, decode):
    for j, t in enumerate(tokens):
        if t in stop_ids:
            return j + 1, "stop"
        if stop_strings:
            text = decode(tokens[: j + 1])
            if any(s in text for s in stop_strings):
                return j + 1, "stop"
    return len(tokens), "length"


class PieceTokenizer:
    """Tokens are strings; ``lead_space`` mimics SentencePiece, which drops the first token's space."""

    def __init__(self, pieces, lead_space=False):
        self.pieces, self.lead_space = pieces, lead_space

    def decode(self, ids, skip_special_tokens=False):
        text = "".join(self.pieces[i] for i in ids)
        return text[1:] if self.lead_space and text.startswith(" ") else text


class ByteTokenizer:
    """One token per UTF-8 byte, decoded like byte-level BPE: incomplete characters become U+FFFD."""

    def decode(self, ids, skip_special_tokens=False):
        return bytes(ids).decode("utf-8", errors="replace")


class CountingDecode:
    def __init__(self, decode):
        self.decode, self.tokens = decode, 0

    def __call__(self, ids, **kwargs):
        self.tokens += len(ids)
        return self.decode(ids, **kwargs)


def _random_cases(rng, vocab, stops, n_cases, length):
    for _ in range(n_cases):
        yield [rng.randrange(vocab) for _ in range(rng.randrange(1, length))], stops


PIECES = ["a", "b", "Obs", "erv", "ation", ":", "\n", " ", "\nOb", "s:", "", "é", " x"]
STOPS = ("\nObservation:", "Observation:", "s: x", "aé")


@pytest.mark.parametrize("lead_space", [False, True])
def test_multi_character_pieces_match_the_quadratic_check(lead_space):
    tok = PieceTokenizer(PIECES, lead_space)
    rng = random.Random(0)
    hits = 0
    for tokens, stops in _random_cases(rng, len(PIECES), STOPS, 3000, 30):
        expected = quadratic_find_stop(tokens, [], stops, tok.decode)
        assert _find_stop(tokens, [], stops, tok.decode) == expected, tokens
        hits += expected[1] == "stop"
    assert hits > 300  # the random cases do exercise stops


def test_stop_spanning_pieces_and_stop_ids():
    tok = PieceTokenizer(PIECES)
    tokens = [0, 8, 3, 4, 5, 1, 1]  # a, \nOb, erv, ation, :, b, b
    assert tok.decode(tokens[:5]) == "a\nObervation:"  # not a stop string: "s" is missing
    assert _find_stop(tokens, [], STOPS, tok.decode) == (7, "length")
    tokens = [0, 6, 2, 3, 4, 5, 1]  # a, \n, Obs, erv, ation, :, b -> stop completes at ":" (index 5)
    assert _find_stop(tokens, [], STOPS, tok.decode) == (6, "stop")
    assert _find_stop(tokens, [3], STOPS, tok.decode) == (4, "stop")  # a stop id first


def test_characters_split_over_byte_tokens():
    tok = ByteTokenizer()
    stops = ("é:", "日本", "\n\n", "ab")
    assert _find_stop(list("xé:y".encode()), [], stops, tok.decode) == (4, "stop")  # x, é=2 bytes, :
    assert _find_stop(list("日本".encode()), [], stops, tok.decode) == (6, "stop")
    alphabet = [*"ab:\n", "é", "日", "本"]
    rng = random.Random(1)
    hits = 0
    for _ in range(1500):
        text = "".join(rng.choice(alphabet) for _ in range(rng.randrange(1, 12)))
        tokens = list(text.encode())
        if rng.random() < 0.3:  # a stray continuation byte or a cut character
            tokens.insert(rng.randrange(len(tokens) + 1), rng.choice([0x80, 0xE6, 0xC3]))
        expected = quadratic_find_stop(tokens, [], stops, tok.decode)
        assert _find_stop(tokens, [], stops, tok.decode) == expected, tokens
        hits += expected[1] == "stop"
    assert hits > 300


def test_empty_stop_string_stops_at_the_first_token_as_before():
    tok = CharTokenizer("abc")
    assert _find_stop([2, 3], [], ("",), tok.decode) == quadratic_find_stop([2, 3], [], ("",), tok.decode)


def test_decoding_work_is_linear():
    tok = CharTokenizer("abc")
    tokens = [2 + (i % 3) for i in range(2000)]  # "abcabc..." never contains the stop string
    counted = CountingDecode(tok.decode)
    assert _find_stop(tokens, [], ("cc", "\nObservation:"), counted) == (2000, "length")
    assert counted.tokens <= 4 * len(tokens)
    before = CountingDecode(tok.decode)
    quadratic_find_stop(tokens, [], ("cc",), before)
    assert before.tokens == 2000 * 2001 // 2


def test_stopping_criterion_matches_decoding_the_continuation_each_step():
    tok = PieceTokenizer(PIECES, lead_space=True)
    rng = random.Random(2)
    rows = [[rng.randrange(len(PIECES)) for _ in range(25)] for _ in range(40)]
    prompt = [0, 1, 0]
    ids = torch.tensor([prompt + r for r in rows])
    criterion = _StopStrings(STOPS, tok.decode, len(prompt))
    for width in range(len(prompt) + 1, ids.shape[1] + 1):
        got = criterion(ids[:, :width], None).tolist()
        expected = [any(s in tok.decode(r[: width - len(prompt)]) for s in STOPS) for r in rows]
        assert got == expected
    assert 5 < sum(got) < 40


def test_engine_cuts_at_a_stop_string_spanning_tokens_like_before():
    tok = CharTokenizer("abcdefghijklmn")
    policy = build_policy(tiny_qwen2(tok.vocab_size, seed=5), lora=LoRASettings(r=4, alpha=8))
    engine = HFRolloutEngine(policy.model, tok)
    prompts = [tok.encode("abc"), tok.encode("defg"), tok.encode("hij")]
    torch.manual_seed(3)
    free = engine.generate(prompts, SamplingParams(max_new_tokens=24))
    texts = [tok.decode(g.token_ids) for g in free]
    stops = (texts[0][6:9], texts[1][3:5])  # strings the model does produce at this seed
    torch.manual_seed(3)
    cut = engine.generate(prompts, SamplingParams(max_new_tokens=24, stop_strings=stops))
    stopped = 0
    for g, f in zip(cut, free, strict=True):
        n, reason = quadratic_find_stop(f.token_ids, [tok.eos_token_id], stops, tok.decode)
        assert g.token_ids == f.token_ids[:n] and g.finish_reason == reason
        stopped += reason == "stop" and f.token_ids[n - 1] != tok.eos_token_id
    assert stopped >= 2


@pytest.fixture(scope="module")
def qwen_tokenizer():
    try:
        from components.embedded.models import ensure_gguf, load_hf_tokenizer

        cache = Path(__file__).resolve().parents[2] / ".cache"
        ensure_gguf("qwen2.5-coder-0.5b-instruct", cache)
    except Exception:  # noqa: BLE001 - the [embedded] extra is not installed, or the parts are missing
        pytest.skip("the embedded Qwen GGUF is not available")
    return load_hf_tokenizer("qwen2.5-coder-0.5b-instruct", cache)


def test_qwen_byte_level_tokens_match_the_quadratic_check(qwen_tokenizer):
    tok = qwen_tokenizer
    text = "Thought: 日本の首都は東京です。\nAction: search[Kyōto café]\nObservation: 東京 — déjà vu\n"
    whole = tok.encode(text, add_special_tokens=False)
    pieces = [tok.convert_tokens_to_ids(t) for t in tok.tokenize("日本の首都 éàü")]
    stops = ("\nObservation:", "東京", "é]", "café]\nObs", "本の")
    rng = random.Random(4)
    cases = [whole]
    for _ in range(150):  # pieces of the real text, and random mixtures with split characters
        start = rng.randrange(len(whole))
        cases.append(whole[start : start + rng.randrange(1, 30)])
        cases.append([rng.choice(whole + pieces) for _ in range(rng.randrange(1, 40))])
    hits = 0
    for tokens in cases:
        expected = quadratic_find_stop(tokens, [], stops, tok.decode)
        assert _find_stop(tokens, [], stops, tok.decode) == expected, tokens
        hits += expected[1] == "stop"
    assert hits > 50
    assert _find_stop(whole, [], ("\nObservation:",), tok.decode)[1] == "stop"
