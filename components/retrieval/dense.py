"""Dense retrieval: cosine similarity of sentence embeddings with an exact faiss index.

Documents are embedded as ``"<title>: <text>"``, L2-normalised and stored in ``faiss.IndexFlatIP``,
so inner product equals cosine similarity. The embedder is injected: anything with
``encode(list[str]) -> np.ndarray`` (the sentence-transformers interface). The embedded default is
all-MiniLM-L6-v2 (``components.embedded.models.load_embedder``); tests pass a small fake.

    from components.embedded.models import load_embedder
    index = DenseIndex(docs, load_embedder(), snippet_chars=300)
    hits = index.search("who directed the harbour film", k=3)

A query is embedded one at a time, where sentence-transformers' ``encode`` spends about a third of the time in
Python (its own bookkeeping, transformers' module calls) around a forward pass of a dozen tokens (issue 49.6). For a
SentenceTransformer of the plain shape (tokenizer, transformer, mean pooling, optional normalisation, no prompt)
the index builds a query encoder of that pipeline once, on its first query (``query_engine``, default ``auto``):
exported to ONNX and run by ONNX Runtime (:class:`OnnxQueryEncoder`, within 1e-6 of ``encode``'s embeddings on probe
texts), else traced into a frozen TorchScript graph of the same weights (:class:`TracedQueryEncoder`, the very
embeddings ``encode`` gives); anything else, or an encoder that fails its check, keeps ``encode`` (``query_path``
says which and why). Documents are always embedded by ``encode``, so an index built before reads the same.
``perf/bench_retrieval.py`` times the paths in one process and checks that every query's hits are identical.
"""

from __future__ import annotations

import io
import sys
import threading
import warnings
from collections.abc import Callable, Sequence
from contextlib import contextmanager
from typing import Any, Protocol

import faiss
import numpy as np

from components.retrieval.bm25 import hit
from components.schemas import Document, SearchHit

EMBEDDED_MINILM = "embedded-minilm"


class Embedder(Protocol):
    def encode(self, sentences: list[str]) -> Any: ...


def resolve_embedder(name: str) -> Embedder:
    """The embedder a params name stands for; only the embedded MiniLM is known by name."""
    if name == EMBEDDED_MINILM:
        from components.embedded.models import load_embedder

        return load_embedder()
    raise ValueError(f"unknown embedder {name!r}: pass embedder=... explicitly (known: {EMBEDDED_MINILM!r})")


def embed(embedder: Embedder, texts: list[str]) -> np.ndarray:
    """Embeddings as a C-contiguous float32 matrix with unit rows (zero rows stay zero)."""
    return unit_rows(embedder.encode(list(texts)), len(texts))


def unit_rows(vecs: Any, n: int) -> np.ndarray:
    vecs = np.asarray(vecs, dtype=np.float32)
    if vecs.ndim != 2 or vecs.shape[0] != n:
        raise ValueError(f"embedder returned shape {vecs.shape} for {n} texts; expected (n, dim)")
    norms = np.linalg.norm(vecs, axis=1, keepdims=True)
    return np.ascontiguousarray(vecs / np.where(norms > 0, norms, 1.0))


PROBES = ("a", "Who directed the film set in the harbour city, and where were they born?",
          "Ünïcode, digits 1987 and punctuation: (left) [right]!", "token " * 400)
"""Texts a query encoder must embed as ``encode`` does: one token, a question, odd characters, and one longer than
the model's ``max_seq_length`` (truncated)."""

INPUTS = ("input_ids", "attention_mask", "token_type_ids")


def plain_pipeline_features(embedder: Any) -> dict[str, Any]:
    """``preprocess`` of a probe text, for a SentenceTransformer of the plain shape a query encoder can stand in for
    (Transformer, mean Pooling[, Normalize], no prompt, no truncated dimension, on the CPU); ``TypeError`` or
    ``ValueError`` with the reason for any other embedder."""
    st = sys.modules.get("sentence_transformers")  # not imported: the embedder cannot be one of its models
    if st is None or not isinstance(embedder, st.SentenceTransformer):
        raise TypeError(f"not a SentenceTransformer ({type(embedder).__name__})")
    kinds = [type(m).__name__ for m in embedder]
    if kinds not in (["Transformer", "Pooling"], ["Transformer", "Pooling", "Normalize"]):
        raise ValueError(f"modules {kinds}, not Transformer, Pooling[, Normalize]")
    if getattr(embedder[1], "pooling_mode", None) != "mean":
        raise ValueError(f"pooling {getattr(embedder[1], 'pooling_mode', None)!r}, not mean")
    prompt = embedder.prompts.get(embedder.default_prompt_name, "") if embedder.default_prompt_name else ""
    if prompt or getattr(embedder, "truncate_dim", None) or embedder.device.type != "cpu":
        raise ValueError("a default prompt, a truncated dimension or a device other than the CPU")
    features = embedder.preprocess([PROBES[1]])
    if set(features) - {"modality"} != set(INPUTS):
        raise ValueError(f"preprocess gives {sorted(features)}, not {list(INPUTS)}")
    return features


class TracedQueryEncoder:
    """A SentenceTransformer's single-text path (``preprocess``, then its modules) traced into a frozen TorchScript
    graph over the same weights, without ``encode``'s Python around it. Refuses (``TypeError`` or ``ValueError``,
    with the reason) a model of another shape, and one whose graph does not give exactly ``encode``'s embeddings
    on :data:`PROBES`.

        encoder = TracedQueryEncoder(load_embedder())
        vec = encoder("who directed the harbour film")     # (1, 384) float32, as embed(embedder, [text])
    """

    def __init__(self, embedder: Any, threads: int | None = None):
        """``threads`` is not used: the graph runs on torch's intra-op threads (``torch.set_num_threads``)."""
        features = plain_pipeline_features(embedder)
        import torch

        self.embedder = embedder
        self._torch = torch
        # eval(), as encode() sets it; the tracer's warnings name the Python branches it fixes, which the probes check
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)
            warnings.simplefilter("ignore", DeprecationWarning)  # torch.jit's: the day it goes, encode() is kept
            self.graph = torch.jit.freeze(torch.jit.trace(
                _pipeline(embedder).eval(), tuple(features[k] for k in INPUTS), check_trace=False))
        for text in PROBES:
            got, want = self(text), embed(embedder, [text])
            if not np.array_equal(got, want):
                raise ValueError(f"traced embedding of {text[:30]!r} differs from encode's by "
                                 f"{float(np.abs(got - want).max()):.2e}")

    def __call__(self, text: str) -> np.ndarray:
        features = self.embedder.preprocess([text])
        with self._torch.no_grad():
            vecs = self.graph(*(features[k] for k in INPUTS))
        return unit_rows(vecs.numpy(), 1)


class OnnxQueryEncoder:
    """The same single-text path exported once (in memory) to ONNX and run by ONNX Runtime: about 0.7x the traced
    graph's CPU time a query on this machine (``docs/performance.md``), the same fp32 weights. It runs on
    ``threads`` intra-op threads (default :data:`QUERY_THREADS`) that sleep between queries instead of spinning, so
    an idle index takes no CPU from the model servers beside it. Its kernels
    sum in another order, so an embedding is not ``encode``'s bit for bit: the encoder refuses (``ValueError``) a
    model whose embeddings of :data:`PROBES` differ from ``encode``'s by more than :attr:`TOLERANCE` in any
    coordinate, and ``ImportError`` without ``onnxruntime`` (the ``[embedded]`` extra).

        encoder = OnnxQueryEncoder(load_embedder())
        vec = encoder("who directed the harbour film")     # (1, 384) float32, within 1e-6 of embed(embedder, [text])
    """

    TOLERANCE = 1e-6  # unit vectors; MiniLM's measured largest difference is 2e-7

    def __init__(self, embedder: Any, threads: int | None = None):
        import onnxruntime as ort

        features = plain_pipeline_features(embedder)
        import torch

        self.embedder = embedder
        model = io.BytesIO()
        axes = {name: {0: "batch", 1: "tokens"} for name in INPUTS}
        with torch.no_grad(), warnings.catch_warnings():
            warnings.simplefilter("ignore", torch.jit.TracerWarning)  # the branches it fixes: the probes check them
            warnings.simplefilter("ignore", DeprecationWarning)
            warnings.simplefilter("ignore", FutureWarning)
            warnings.filterwarnings("ignore", message="Exporting aten::index operator")  # negative indices: none here
            torch.onnx.export(_pipeline(embedder).eval(), tuple(features[k] for k in INPUTS), model,
                              input_names=list(INPUTS), output_names=["embedding"],
                              dynamic_axes={**axes, "embedding": {0: "batch"}}, opset_version=17, dynamo=False)
        options = ort.SessionOptions()
        options.intra_op_num_threads, options.inter_op_num_threads = threads or QUERY_THREADS, 1
        options.add_session_config_entry("session.intra_op.allow_spinning", "0")
        options.log_severity_level = 3
        self.session = ort.InferenceSession(model.getvalue(), options, providers=["CPUExecutionProvider"])
        self.inputs = [i.name for i in self.session.get_inputs()]  # the exporter drops an input the graph ignores
        for text in PROBES:
            diff = float(np.abs(self(text) - embed(embedder, [text])).max())
            if not diff <= self.TOLERANCE:
                raise ValueError(f"ONNX embedding of {text[:30]!r} differs from encode's by {diff:.2e}")

    def __call__(self, text: str) -> np.ndarray:
        features = self.embedder.preprocess([text])
        (vecs,) = self.session.run(None, {k: features[k].numpy() for k in self.inputs})
        return unit_rows(vecs, 1)


QUERY_THREADS = 1
"""ONNX Runtime threads a query is split over by default. Two helped only back to back: a MiniLM query of a dozen
tokens took p50 4.3 ms on two threads against 8.7 on one, run one after another; in ``perf/bench_retrieval.py``,
where each query alternates with other paths as it does with model calls in an episode, two gave p50 8.2 ms against
8.8 for 1.34x the CPU (2026-11-29), so one thread is the default and ``DenseIndex(query_threads=...)`` the knob."""

QUERY_ENCODERS: dict[str, Callable[..., Callable[[str], np.ndarray]]] = {
    "onnx": OnnxQueryEncoder, "traced": TracedQueryEncoder}
QUERY_ENGINES = {"auto": ("onnx", "traced"), "onnx": ("onnx",), "traced": ("traced",), "encode": ()}
"""``DenseIndex(query_engine=...)``: the query encoders to try, in order; ``encode`` is what is left."""


def _pipeline(embedder: Any):
    import torch

    class Pipeline(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.st = embedder

        def forward(self, input_ids, attention_mask, token_type_ids):
            features = {"input_ids": input_ids, "attention_mask": attention_mask, "token_type_ids": token_type_ids,
                        "modality": "text"}
            return self.st(features)["sentence_embedding"]

    return Pipeline()


@contextmanager
def one_faiss_thread():
    """faiss on one OpenMP thread inside the block: a single query's scan of 10k vectors took 2.9 ms of CPU split
    over 2 threads and 0.35 ms on one (``docs/performance.md``). OpenMP keeps the count per calling thread, so
    other threads' faiss calls keep theirs. The same documents come back; a score can differ in its last bit,
    the two paths summing a dot product in another order."""
    before = faiss.omp_get_max_threads()
    faiss.omp_set_num_threads(1)
    try:
        yield
    finally:
        faiss.omp_set_num_threads(before)


def doc_text(doc: Document) -> str:
    return f"{doc.title}: {doc.text}"


class DenseIndex:
    """Exact inner-product search over normalised document embeddings."""

    method = "dense"

    def __init__(
        self, docs: Sequence[Document], embedder: Embedder, *, snippet_chars: int = 300,
        embedder_name: str = EMBEDDED_MINILM, faiss_index: faiss.Index | None = None, query_engine: str = "auto",
        query_threads: int | None = None,
    ):
        if not docs:
            raise ValueError("DenseIndex needs at least one document")
        if query_engine not in QUERY_ENGINES:
            raise ValueError(f"query_engine {query_engine!r}: use one of {list(QUERY_ENGINES)}")
        self.docs = list(docs)
        self.embedder = embedder
        self.embedder_name = embedder_name
        self.snippet_chars = snippet_chars
        if faiss_index is None:
            vecs = embed(embedder, [doc_text(d) for d in self.docs])
            faiss_index = faiss.IndexFlatIP(vecs.shape[1])
            faiss_index.add(vecs)
        if faiss_index.ntotal != len(self.docs):
            raise ValueError(f"faiss index holds {faiss_index.ntotal} vectors for {len(self.docs)} documents")
        self.index = faiss_index
        self.options = {"embedder": embedder_name, "dim": int(faiss_index.d)}
        # how queries are embedded, decided on the first one: "onnx", "traced" (with why not onnx, under auto) or
        # "encode: <why no encoder>"
        self.query_engine, self.query_threads = query_engine, query_threads  # None: QUERY_THREADS
        self.query_path: str | None = None
        self._encode_query: Callable[[str], np.ndarray] | None = None
        self._query_lock = threading.Lock()

    def __len__(self) -> int:
        return len(self.docs)

    def embed_query(self, query: str) -> np.ndarray:
        """The query's (1, dim) unit embedding, through the traced graph where the embedder allows one."""
        if self._encode_query is None:
            with self._query_lock:
                if self._encode_query is None:
                    self._encode_query = self._query_encoder()
        return self._encode_query(query)

    def _query_encoder(self) -> Callable[[str], np.ndarray]:
        engines, refused = QUERY_ENGINES[self.query_engine], []
        if engines:
            try:
                plain_pipeline_features(self.embedder)
            except (AttributeError, TypeError, ValueError) as exc:  # a model no encoder can stand in for
                engines, refused = (), [f"{type(exc).__name__}: {exc}"]
        for name in engines:
            try:
                encoder = QUERY_ENCODERS[name](self.embedder, threads=self.query_threads)
            except (AttributeError, ImportError, RuntimeError, TypeError, ValueError) as exc:  # no export, no trace
                refused.append(f"{name}: {type(exc).__name__}: {exc}")
                continue
            self.query_path = f"{name} ({'; '.join(refused)})" if refused else name
            return encoder
        self.query_path = "encode: " + ("; ".join(refused) or f"query_engine={self.query_engine}")
        return lambda query: embed(self.embedder, [query])

    def ranked(self, query: str, k: int) -> list[tuple[int, float]]:
        """(document position, cosine) of the ``k`` nearest documents, best first."""
        if not query.strip():
            return []
        q = self.embed_query(query)
        if q.shape[1] != self.index.d:
            raise ValueError(
                f"embedder gives {q.shape[1]}-d vectors but the index holds {self.index.d}-d ones "
                f"(built with {self.embedder_name!r})"
            )
        with one_faiss_thread():
            scores, ids = self.index.search(q, min(k, len(self.docs)))
        return [(int(i), float(s)) for i, s in zip(ids[0], scores[0], strict=True) if i >= 0]

    def ranked_among(self, query: str, k: int, positions: Sequence[int]) -> list[tuple[int, float]]:
        """``ranked`` restricted to the documents at ``positions`` (their stored vectors, no re-embedding);
        equal scores keep the order of ``positions``."""
        if not query.strip() or not positions:
            return []
        q = self.embed_query(query)[0]
        vecs = np.vstack([self.index.reconstruct(int(i)) for i in positions])
        if vecs.shape[1] != q.shape[0]:
            raise ValueError(f"embedder gives {q.shape[0]}-d vectors but the index holds {vecs.shape[1]}-d ones")
        scores = vecs @ q
        order = np.lexsort((np.arange(len(scores)), -scores.astype(np.float64)))[:k]
        return [(positions[int(j)], float(scores[j])) for j in order]

    def search(self, query: str, k: int, snippet_chars: int | None = None) -> list[SearchHit]:
        n = self.snippet_chars if snippet_chars is None else snippet_chars
        return [hit(self.docs[i], s, n) for i, s in self.ranked(query, k)]
