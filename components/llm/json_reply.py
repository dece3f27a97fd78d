"""Reading JSON out of a model's reply: the one home for what every judge, verifier and parser needs.

Two readings, because replies come in two shapes:

- :func:`outer_json`: the text from the first ``{`` to the last ``}`` decoded as one value (a reply that is
  a single object, perhaps with prose or a code fence around it). It raises :class:`NoJSONObject` when there
  are no braces and :class:`json.JSONDecodeError` when what is between them is not JSON, so a caller can
  tell "no JSON" from "broken JSON" (both are ``ValueError``);
- :func:`json_objects`: every JSON object found in fenced blocks, then anywhere in the text, in order (a
  reply that shows several objects, or a stray brace in prose before the real one); optionally a reply cut
  off just before its closing brace (a token limit) is read as if the brace were there.

    outer_json('Sure: {"correct": true}')          # {'correct': True}
    json_objects('```json\\n{"a": 1}\\n```')          # [{'a': 1}]
"""

from __future__ import annotations

import json
import re
from typing import Any

__all__ = ["NoJSONObject", "first_json_object", "json_objects", "outer_json"]

_FENCE = re.compile(r"```(?:json|JSON)?\s*(.*?)```", re.DOTALL)


class NoJSONObject(ValueError):
    """The reply holds no ``{...}`` span."""


def outer_json(text: str | None) -> Any:
    """The value of the span from the first ``{`` to the last ``}`` of ``text``."""
    text = text or ""
    start, end = text.find("{"), text.rfind("}")
    if start < 0 or end <= start:
        raise NoJSONObject("no JSON object in the reply")
    return json.loads(text[start : end + 1])


def json_objects(text: str | None, *, repair_truncated: bool = False) -> list[dict]:
    """The JSON objects of ``text``: those in fenced blocks first, then those anywhere, in order of their
    opening brace; with ``repair_truncated``, an object missing only its final ``}`` counts too."""
    found, decoder = [], json.JSONDecoder()
    text = text or ""
    for chunk in [m.group(1) for m in _FENCE.finditer(text)] + [text]:
        for start in [i for i, ch in enumerate(chunk) if ch == "{"]:
            try:
                obj, _ = decoder.raw_decode(chunk, start)
            except json.JSONDecodeError:
                if not repair_truncated:
                    continue
                try:
                    obj = json.loads(chunk[start:].rstrip().rstrip("`").rstrip() + "}")
                except json.JSONDecodeError:
                    continue
            if isinstance(obj, dict):
                found.append(obj)
    return found


def first_json_object(text: str | None) -> dict | None:
    """The first object :func:`json_objects` finds, or None."""
    objects = json_objects(text)
    return objects[0] if objects else None
