"""Read a GGUF file with gguf-py's reader, about six times faster on models with a large vocabulary.

``gguf.GGUFReader`` parses every metadata value through a slice of a ``numpy.memmap``; each slice builds a
memmap subclass object, and a Qwen2.5 GGUF has ~455k values (151k token strings, their types, 151k merges),
so reading the 0.5B's header takes 12-20 s on this project's 2-core CPU before a single tensor is touched.
:class:`GGUFFile` is the same reader slicing a plain-ndarray view of the same mapping: identical fields and
tensors (still memory-mapped, nothing copied), 2 s. It overrides one private method, ``_get``, whose
signature gguf-py has kept since GGUF v3; tests/embedded/test_gguf_read.py compares it with the stock reader.

    python -m components.embedded.gguf_read MODEL.gguf     # print its tensor count and first metadata keys
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import ClassVar

import numpy as np
from gguf import GGUFReader

__all__ = ["GGUFFile"]


class GGUFFile(GGUFReader):
    """``gguf.GGUFReader`` whose metadata reads slice a plain ndarray view of the memory map."""

    _itemsizes: ClassVar[dict] = {}

    def __init__(self, path: str | Path, mode: str = "r"):
        super().__init__(str(path), mode=mode)

    def _get(self, offset: int, dtype, count: int = 1, override_order=None) -> np.ndarray:
        plain = self.__dict__.get("_plain")
        if plain is None:  # set on the first call, inside GGUFReader.__init__, once self.data exists
            plain = self._plain = self.data.view(np.ndarray)
        size = self._itemsizes.get(dtype)
        if size is None:
            size = self._itemsizes[dtype] = np.dtype(dtype).itemsize
        count = int(count)
        arr = plain[offset : offset + size * count].view(dtype)[:count]
        order = self.byte_order if override_order is None else override_order
        return arr.view(arr.dtype.newbyteorder(order))


if __name__ == "__main__":
    if len(sys.argv) != 2:
        sys.exit(__doc__)
    reader = GGUFFile(sys.argv[1])
    print(f"{len(reader.tensors)} tensors; metadata: {', '.join(list(reader.fields)[:8])}, ...")
