"""Read and write records as JSONL or Parquet with schema validation and crash-safe writes.

A bad record raises ``RecordError`` naming the file, the 1-based line (or Parquet row) and the field:

    components.io.RecordError: data/questions.jsonl:17: field 'answers': List should have at least 1 item

Whole-file writes go to a temporary file in the same folder and are renamed over the target, so a crash
leaves the previous file intact. ``JsonlAppender`` appends one record at a time and flushes each line, for
resumable stages: a crash loses at most the line being written, and ``read_jsonl(..., skip_torn_tail=True)``
ignores a torn last line.

``atomic_target`` gives writers that open a file by name (GGUF writers) the same guarantee, with a temporary
name of their own, and ``build_once`` builds a cached file once when several processes need it at the same time.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterable, Iterator
from pathlib import Path
from typing import TypeVar

from filelock import FileLock
from pydantic import BaseModel, ValidationError

M = TypeVar("M", bound=BaseModel)

_UMASK = os.umask(0o022)  # read once, at import: os.umask can only be read by setting it
os.umask(_UMASK)


class RecordError(ValueError):
    """A record that does not parse or validate, located by file, line and field."""

    def __init__(self, path: str | Path, line: int | None, field: str | None, message: str):
        self.path, self.line, self.field = str(path), line, field
        where = f"{path}:{line}" if line is not None else str(path)
        super().__init__(f"{where}: field {field!r}: {message}" if field else f"{where}: {message}")


def _first_error(exc: ValidationError) -> tuple[str | None, str]:
    err = exc.errors()[0]
    field = ".".join(str(p) for p in err["loc"]) or None
    return field, err["msg"]


def validate_record(model: type[M], data: object, path: str | Path, line: int) -> M:
    if not isinstance(data, dict):
        raise RecordError(path, line, None, f"expected a JSON object, got {type(data).__name__}")
    try:
        return model.model_validate(data)
    except ValidationError as exc:
        field, msg = _first_error(exc)
        raise RecordError(path, line, field, msg) from None


def iter_json_objects(path: str | Path, *, skip_torn_tail: bool = False) -> Iterator[tuple[int, dict]]:
    """Yield (1-based line number, object) for each non-blank line; a line that is not a JSON object
    raises RecordError. ``skip_torn_tail`` tolerates an unterminated, unparseable last line (a crash)."""
    path = Path(path)
    with path.open("rb") as fh:
        lines = fh.readlines()
    for number, raw in enumerate(lines, start=1):
        try:
            text = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            if skip_torn_tail and number == len(lines) and not raw.endswith(b"\n"):
                return
            raise RecordError(path, number, None, f"not UTF-8 text (byte {exc.start + 1})") from None
        if not text.strip():
            continue
        try:
            data = json.loads(text.rstrip("\r\n"))  # the line's own newline would read as a control character
        except json.JSONDecodeError as exc:
            if skip_torn_tail and number == len(lines) and not text.endswith("\n"):
                return
            message = exc.msg.removesuffix(" at")  # json's "Unterminated string starting at" ends where we add the column
            raise RecordError(path, number, None, f"invalid JSON ({message} at column {exc.colno})") from None
        if not isinstance(data, dict):
            raise RecordError(path, number, None, f"expected a JSON object, got {type(data).__name__}")
        yield number, data


def iter_jsonl(path: str | Path, model: type[M], *, skip_torn_tail: bool = False) -> Iterator[M]:
    """Yield validated records. ``skip_torn_tail`` tolerates an unterminated, unparseable last line."""
    for number, data in iter_json_objects(path, skip_torn_tail=skip_torn_tail):
        yield validate_record(model, data, path, number)


def read_jsonl(path: str | Path, model: type[M], *, skip_torn_tail: bool = False) -> list[M]:
    return list(iter_jsonl(path, model, skip_torn_tail=skip_torn_tail))


@contextlib.contextmanager
def atomic_path(path: str | Path, mode: str = "w"):
    """Open a temporary file beside ``path``; on clean exit fsync and rename it over ``path``."""
    with atomic_target(path) as tmp, open(tmp, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as fh:
        yield fh
        fh.flush()
        os.fsync(fh.fileno())


@contextlib.contextmanager
def atomic_target(path: str | Path) -> Iterator[Path]:
    """A fresh temporary path beside ``path`` for a writer that opens files by name; renamed over ``path`` on clean
    exit, removed otherwise. Each call gets its own name, so two writers of one path never rename each other's."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".partial", dir=path.parent)
    os.fchmod(fd, 0o666 & ~_UMASK)  # mkstemp's 0600 would leave outputs unreadable to the user's group
    os.close(fd)
    try:
        yield Path(tmp)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def build_once(target: str | Path, build: Callable[[Path], object]) -> Path:
    """``target`` if it is a file, else ``build(target)`` (which must write it) under a lock file beside it:
    processes that need the same cached file at once build it once, the others wait and find it done."""
    target = Path(target)
    if target.is_file():
        return target
    target.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(f"{target}.lock"):
        if not target.is_file():
            build(target)
    if not target.is_file():
        raise FileNotFoundError(f"{target}: the build finished without writing it")
    return target


def _dump(record: BaseModel | dict) -> str:
    data = record.model_dump(mode="json") if isinstance(record, BaseModel) else record
    return json.dumps(data, ensure_ascii=False, sort_keys=False)


def write_jsonl(path: str | Path, records: Iterable[BaseModel | dict]) -> int:
    count = 0
    with atomic_path(path) as fh:
        for record in records:
            fh.write(_dump(record) + "\n")
            count += 1
    return count


def write_json(path: str | Path, data: object, *, sort_keys: bool = True) -> None:
    """``data`` as indented JSON, written atomically (a crash leaves the previous file whole); ``sort_keys=False``
    keeps the insertion order, for reports a person reads top to bottom."""
    with atomic_path(path) as fh:
        json.dump(data, fh, indent=2, sort_keys=sort_keys, ensure_ascii=False, default=str)
        fh.write("\n")


def read_json(path: str | Path) -> object:
    with Path(path).open("r", encoding="utf-8") as fh:
        return json.load(fh)


class JsonlAppender:
    """Append records to a JSONL file, one flushed line each (for resumable stages)."""

    def __init__(self, path: str | Path):
        self.path = Path(path)
        self.path.parent.mkdir(parents=True, exist_ok=True)
        self._repair_torn_tail()
        self._fh = self.path.open("a", encoding="utf-8")

    def _repair_torn_tail(self) -> None:
        if not self.path.exists() or self.path.stat().st_size == 0:
            return
        data = self.path.read_bytes()
        if not data.endswith(b"\n"):
            # a crash mid-line: drop the fragment so the next record starts on its own line
            self.path.write_bytes(data[: data.rfind(b"\n") + 1])

    def append(self, record: BaseModel | dict) -> None:
        self._fh.write(_dump(record) + "\n")
        self._fh.flush()
        os.fsync(self._fh.fileno())

    def close(self) -> None:
        self._fh.close()

    def __enter__(self) -> "JsonlAppender":
        return self

    def __exit__(self, *exc) -> None:
        self.close()


_JSON_COLUMNS_KEY = b"rubricflow.json_columns"


def write_parquet(path: str | Path, records: Iterable[BaseModel | dict]) -> int:
    """Write records as a Parquet table; nested values (lists, dicts) are stored as JSON strings and
    the names of those columns are kept in the table metadata so ``read_parquet`` can undo it."""
    import pyarrow as pa
    import pyarrow.parquet as pq

    rows, json_columns = [], set()
    for record in records:
        data = record.model_dump(mode="json") if isinstance(record, BaseModel) else dict(record)
        row = {}
        for key, value in data.items():
            if isinstance(value, (dict, list)):
                json_columns.add(key)
                value = json.dumps(value, ensure_ascii=False)
            row[key] = value
        rows.append(row)
    table = pa.Table.from_pylist(rows)
    table = table.replace_schema_metadata({_JSON_COLUMNS_KEY: ",".join(sorted(json_columns)).encode()})
    with atomic_path(path, "wb") as fh:
        pq.write_table(table, fh)
    return len(rows)


def read_parquet(path: str | Path, model: type[M]) -> list[M]:
    import pyarrow.parquet as pq

    try:
        table = pq.read_table(path)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        if isinstance(exc, FileNotFoundError):
            raise
        raise RecordError(path, None, None, f"not a readable Parquet file ({' '.join(str(exc).split())})") from None
    meta = (table.schema.metadata or {}).get(_JSON_COLUMNS_KEY, b"").decode()
    json_columns = {c for c in meta.split(",") if c}
    out = []
    for row_number, row in enumerate(table.to_pylist(), start=1):
        for key in json_columns & row.keys():
            if isinstance(row[key], str):
                try:
                    row[key] = json.loads(row[key])
                except json.JSONDecodeError as exc:
                    raise RecordError(path, row_number, key, f"invalid JSON ({exc.msg})") from None
        out.append(validate_record(model, row, path, row_number))
    return out
