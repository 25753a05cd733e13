"""Reading a small state object back from JSON: known fields, numbers that are numbers.

Host politeness states, change-rate estimates and revisit states travel as
JSON objects (in a JOBDIR, in Redis) and are read back from data another
process -- or a person -- wrote.  Each is a frozen dataclass of non-negative
numbers and a few strings; what may be wrong with such data is the same for
all of them, and so is the error a person needs: which field, which value,
what was expected.

Pure: no Scrapy, Twisted or Redis.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable, Mapping
from typing import Any

__all__ = ["fields_from_json"]


def fields_from_json(
    data: object,
    what: str,
    known: Iterable[str],
    *,
    ints: Iterable[str] = (),
    texts: Iterable[str] = (),
    nested: Mapping[str, Callable[[Any], Any]] | None = None,
) -> dict[str, Any]:
    """``data``'s fields, checked: known names, finite numbers >= 0, strings where said.

    ``ints`` are read as ``int``, the other numbers as ``float``; ``nested``
    fields are read by their own reader.  ``ValueError`` names ``what``, the
    field and the value.
    """
    if not isinstance(data, Mapping):
        raise ValueError(f"{what} must be an object, got {type(data).__name__}")
    unknown = sorted(set(data) - set(known))
    if unknown:
        raise ValueError(f"unknown {what} fields {unknown}")
    as_int, as_text, readers = frozenset(ints), frozenset(texts), nested or {}
    out: dict[str, Any] = {}
    for key, value in data.items():
        reader = readers.get(key)
        if reader is not None:
            out[key] = reader(value)
        elif key in as_text:
            if not isinstance(value, str):
                raise ValueError(f"{what} {key}={value!r} is not a string")
            out[key] = value
        elif isinstance(value, bool) or not isinstance(value, (int, float)):
            raise ValueError(f"{what} {key}={value!r} is not a number")
        elif not math.isfinite(value) or value < 0:
            raise ValueError(f"{what} {key}={value!r} is not a finite number >= 0")
        else:
            out[key] = int(value) if key in as_int else float(value)
    return out
