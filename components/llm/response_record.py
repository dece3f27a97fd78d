"""A stage's response record: every deterministic model answer the stage used, in a JSONL file that DVC tracks,
so `dvc repro` of a sampled stage replays the same answers and writes the same bytes.

Why a record and not deterministic sampling: batched serving (llama.cpp's native server with several slots, vLLM)
is not batch-invariant, so which requests shared a batch moves greedy near-ties (perf/eval_determinism.py), and
an API judge (Gemini) promises no repeatability at all. Forcing one request at a time would cost the embedded
evaluation its batching and still say nothing about another machine's kernels. A content-addressed record of
the answers a run used reproduces on any machine and any backend, and is readable: one line per request,
``{"key": <ResponseCache.key>, "completion": {...}}``.

The record layers over the machine-wide response cache (``.cache/llm_responses.sqlite``): a lookup reads the
record, then the cache; an answer found in the cache, or newly made, is appended to the record (one flushed line,
so a killed stage keeps what it had). Keys hash the request (model identity, messages, sampling), so an entry of
an earlier run can only ever answer the identical request: stale entries are never wrong, only unused (delete
the file to prune them). ``llm.middleware.cache: false`` turns both layers off.

    pool = LLMPool(params, record_path=record_path(params.run, "evaluate@sft"))   # components.run_files.record_path
    ...                                                                        # the stage's calls
    ResponseRecord(record_path(params.run, "evaluate@sft")).keep()                 # once it has finished
"""

from __future__ import annotations

import fcntl
import json
import re
import threading
from pathlib import Path

from components.io import RecordError, iter_json_objects, validate_record
from components.llm.base import Completion

_KEY = re.compile(rb'"key": "([0-9a-f]+)"')


class ResponseRecord:
    """The JSONL record of one stage (module doc); loaded on first use, appended line by line."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self._entries: dict[str, Completion] | None = None
        self._lock = threading.Lock()
        # what other processes (the ranks of a data-parallel run) appended: keys seen, up to which byte
        self._others: set[str] = set()
        self._read_to = 0

    def _load(self) -> dict[str, Completion]:
        if self._entries is None:
            entries: dict[str, Completion] = {}
            if self.path.exists():
                for number, data in iter_json_objects(self.path, skip_torn_tail=True):
                    if not isinstance(data.get("key"), str) or not isinstance(data.get("completion"), dict):
                        raise RecordError(self.path, number, "key" if not isinstance(data.get("key"), str)
                                          else "completion", "expected a 'key' string and a 'completion' object")
                    entries[data["key"]] = validate_record(Completion, data["completion"], self.path, number)
                self._repair_torn_tail()
            self._entries = entries
        return self._entries

    def _repair_torn_tail(self) -> None:
        """Cut an unterminated last line (a crash mid-write), so the next append starts a line of its own."""
        with self.path.open("r+b") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)  # not a line another rank is writing now
            raw = fh.read()
            if raw and not raw.endswith(b"\n"):
                fh.truncate(raw.rfind(b"\n") + 1)
            self._read_to = raw.rfind(b"\n") + 1
            self._others.update(k.decode() for k in _KEY.findall(raw[: self._read_to]))

    def get(self, key: str) -> Completion | None:
        with self._lock:
            return self._load().get(key)

    def put(self, key: str, completion: Completion) -> None:
        with self._lock:
            entries = self._load()
            if key in entries:
                return
            entries[key] = completion
            self.path.parent.mkdir(parents=True, exist_ok=True)
            line = json.dumps({"key": key, "completion": completion.model_dump(mode="json")}, sort_keys=True)
            # one locked write a line: the N ranks of a data-parallel run append to one record, each request once
            with self.path.open("a+b") as fh:
                fcntl.flock(fh, fcntl.LOCK_EX)
                fh.seek(self._read_to)
                self._others.update(k.decode() for k in _KEY.findall(fh.read()))
                if key not in self._others:
                    fh.write((line + "\n").encode("utf-8"))
                    fh.flush()
                self._read_to = fh.tell()

    def __len__(self) -> int:
        with self._lock:
            return len(self._load())

    def keep(self) -> None:
        """Make sure the record exists, empty if the stage made no deterministic call: a finished stage's DVC output.
        A stage that fails before any reply leaves none behind."""
        with self._lock:
            self.path.parent.mkdir(parents=True, exist_ok=True)
            self.path.open("a").close()  # never rewrites, never moves an existing record's mtime


class RecordedCache:
    """The response cache as the middleware sees it (``get``/``put``), with a stage's record in front."""

    def __init__(self, record: ResponseRecord, cache=None):
        self.record = record
        self.cache = cache

    def get(self, key: str) -> Completion | None:
        hit = self.record.get(key)
        if hit is None and self.cache is not None:
            hit = self.cache.get(key)
            if hit is not None:
                self.record.put(key, hit)
        return hit

    def put(self, key: str, completion: Completion) -> None:
        self.record.put(key, completion)
        if self.cache is not None:
            self.cache.put(key, completion)

    def close(self) -> None:
        if self.cache is not None:
            self.cache.close()
