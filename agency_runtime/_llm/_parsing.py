"""Tolerant parsing of a structured answer: :func:`parse_structured`.

A model's answer may wrap its JSON in code fences, prose, trailing text, an envelope
(``{"data": ...}``) or a single-key object; the first JSON value that validates against the
schema is the answer. The json module is imported on first use.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Any

from pydantic import TypeAdapter, ValidationError

if TYPE_CHECKING:
    import json

__all__ = ["parse_structured"]

_FENCE = r"```(?:[A-Za-z]+)?\s*\n?(.*?)```"  # patterns: compiled (and cached by re) on first use
_ENVELOPES = ("data", "result", "output", "response", "answer", "value")
_OPENERS = r"[\[{]"
_DECODER: json.JSONDecoder | None = None
"""Scans a text for JSON values (``raw_decode``): made on first use, with the json module."""
_MAX_STARTS = 32
"""At most this many ``{``/``[`` positions of one text are tried as the start of a JSON value.

Each try may scan to the end of the text, so the bound keeps a pathological answer (thousands
of unclosed brackets) linear in its length instead of quadratic."""


class _NoJSONError(ValueError):
    """The answer holds no JSON value that could be parsed."""


def _values_in(text: str) -> tuple[list[Any], bool]:
    """The complete JSON values in ``text`` in order (bounded), and whether one nested too deep.

    The whole text first, when it is one JSON document (a scalar too); otherwise each value
    that starts at a ``{`` or ``[`` and parses completely, scanning on after its end. Trailing
    text after a value (``{"a": 1}}``, ``{"a": 1} (hope that helps :})``) is ignored.
    """
    import json  # on first use (the json module is not needed to import agency_runtime)

    decoder = _decoder()
    openers = re.compile(_OPENERS)
    too_deep = False
    try:
        return [json.loads(text)], False
    except RecursionError:
        too_deep = True
    except ValueError:
        pass
    values: list[Any] = []
    position = 0
    for _ in range(_MAX_STARTS):
        opener = openers.search(text, position)
        if opener is None:
            break
        try:
            value, end = decoder.raw_decode(text, opener.start())
        except RecursionError:
            too_deep = True
            position = opener.start() + 1
        except ValueError:
            position = opener.start() + 1
        else:
            values.append(value)
            position = end
    return values, too_deep


def _decoder() -> json.JSONDecoder:
    global _DECODER
    if _DECODER is None:
        import json

        _DECODER = json.JSONDecoder()
    return _DECODER


def _json_values(text: str) -> list[Any]:
    """The JSON values of a model's answer, the first complete one first.

    A code fence's content is searched before the rest of the answer. Raises
    :class:`_NoJSONError` (a ``ValueError``) when there is none.
    """
    stripped = text.strip()
    fence = re.search(_FENCE, stripped, re.DOTALL)
    too_deep = False
    for candidate in (fence.group(1).strip(), stripped) if fence else (stripped,):
        values, deep = _values_in(candidate)
        if values:
            return values
        too_deep = too_deep or deep
    snippet = f"{text[:80]!r}{'…' if len(text) > 80 else ''}"
    if too_deep:
        raise _NoJSONError(f"the answer's JSON is nested too deeply to parse: {snippet}")
    raise _NoJSONError(f"the answer contains no JSON value ({{...}} or [...]): {snippet}")


def _validate_unwrapping(data: Any, adapter: TypeAdapter[Any]) -> Any:
    """``data`` validated, else an envelope's or a single-key object's value; else the error."""
    try:
        return adapter.validate_python(data)
    except ValidationError as first:
        if isinstance(data, dict):
            inner = [data[k] for k in _ENVELOPES if k in data]
            if len(data) == 1:
                inner.append(next(iter(data.values())))
            for candidate in inner:
                try:
                    return adapter.validate_python(candidate)
                except ValidationError:
                    continue
        raise first


def parse_structured(text: str, adapter: TypeAdapter[Any]) -> Any:
    """Parse a model's answer into ``adapter``'s type, forgiving common wrappers.

    Accepts code fences, prose around the JSON, trailing text after it (a stray ``}``), an
    envelope such as ``{"data": ...}`` and a single-key object around the value. The first
    complete JSON value in the answer is used; when it does not validate, the later ones are
    tried (prose may cite ``[1]`` before the answer), and the first value's validation error
    is raised when none fits.

    Raises:
        pydantic.ValidationError: the answer's JSON does not match the schema.
        ValueError: the answer holds no JSON value (or only one nested too deeply to parse)
            and is not itself a valid value (the plain text of a ``str`` schema is).
    """
    try:
        values = _json_values(text)
    except _NoJSONError as missing:
        try:
            return adapter.validate_python(text.strip())  # a plain-text answer to a str schema
        except ValidationError as exc:
            reasons = "; ".join(str(error["msg"]) for error in exc.errors()[:3])
            raise _NoJSONError(f"{missing} (as plain text: {reasons})") from exc
    try:
        return _validate_unwrapping(values[0], adapter)
    except ValidationError as first:
        for data in values[1:]:
            try:
                return _validate_unwrapping(data, adapter)
            except ValidationError:
                continue
        raise first
