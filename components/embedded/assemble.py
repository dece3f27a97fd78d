"""Assemble and verify every embedded GGUF model into the cache (run once by scripts/setup.sh).

    python -m components.embedded.assemble [--cache-dir .cache]
"""

from __future__ import annotations

import argparse
import time

from components.embedded.models import EMBEDDED_MODELS, ensure_gguf


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--cache-dir", default=None)
    args = parser.parse_args()
    for name in EMBEDDED_MODELS:
        start = time.time()
        path = ensure_gguf(name, args.cache_dir)
        print(f"{name}: {path} ({path.stat().st_size / 2**20:.0f} MiB, verified, {time.time() - start:.1f}s)")


if __name__ == "__main__":
    main()
