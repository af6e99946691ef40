"""Splitting a reply into message-sized chunks, shared by the Telegram and Slack adapters.

Lengths are counted in UTF-16 code units (Telegram's unit; for Slack, whose limit is in
characters, a conservative count), a surrogate pair is never split and no chunk is
whitespace-only (both surfaces reject empty messages).
"""

from __future__ import annotations

from agency_runtime import InvalidArgumentError

from ._identity import _JS_WHITESPACE

__all__ = ["chunk_text"]


def _is_high(unit: str) -> bool:
    return "\ud800" <= unit <= "\udbff"


def _is_low(unit: str) -> bool:
    return "\udc00" <= unit <= "\udfff"


def _code_units(text: str) -> tuple[str, bool]:
    """``text`` with one character per UTF-16 code unit, and whether it had astral characters.

    Astral characters become their (high, low) surrogate pair, so ``len`` counts UTF-16 code
    units and slicing works on code-unit indices.
    """
    encoded = text.encode("utf-16-le", "surrogatepass")
    if len(encoded) == 2 * len(text):
        return text, False
    wide = bytearray(2 * len(encoded))  # each 2-byte unit widened to a 4-byte UTF-32 unit
    wide[0::4] = encoded[0::2]
    wide[1::4] = encoded[1::2]
    return wide.decode("utf-32-le", "surrogatepass"), True


def _from_code_units(units: str) -> str:
    """Undo :func:`_code_units`: join surrogate pairs back into astral characters."""
    return units.encode("utf-16-le", "surrogatepass").decode("utf-16-le", "surrogatepass")


def chunk_text(text: str, limit: int) -> list[str]:
    """Split ``text`` into chunks of at most ``limit`` UTF-16 code units.

    While the rest is longer than ``limit``, it is cut at the last ``\\n`` at an index
    ``<= limit``; when there is none, or it lies below ``limit // 2``, it is cut hard at
    ``limit`` (backing off one unit rather than splitting a surrogate pair). Each chunk loses
    its trailing white space (JavaScript ``trimEnd``) and the rest loses exactly one leading
    ``\\n``. Chunks left empty are dropped, so no chunk is whitespace-only: ``''`` gives
    ``['']`` and other white-space-only text gives ``[]``.

    The one case where a chunk exceeds ``limit`` is ``limit == 1`` with an astral character
    (two code units), which is kept whole rather than split.

    Raises :class:`~agency_runtime.InvalidArgumentError` unless ``limit`` is a positive int.
    """
    if not isinstance(limit, int) or isinstance(limit, bool) or limit < 1:
        raise InvalidArgumentError(f"chunk limit must be a positive integer, got {limit!r}")
    if not isinstance(text, str):
        raise InvalidArgumentError(f"text must be a string, got {type(text).__name__}")
    if text == "":
        return [""]
    units, astral = _code_units(text)
    half = limit // 2
    pieces: list[str] = []
    start = 0
    end = len(units)
    while end - start > limit:
        newline = units.rfind("\n", start, start + limit + 1)
        if newline != -1 and newline - start >= half:
            cut = newline
        else:
            cut = start + limit
            if _is_high(units[cut - 1]) and _is_low(units[cut]):
                cut = cut - 1 if cut - 1 > start else cut + 1
        pieces.append(units[start:cut].rstrip(_JS_WHITESPACE))
        start = cut
        if start < end and units[start] == "\n":
            start += 1
    pieces.append(units[start:end].rstrip(_JS_WHITESPACE))
    return [_from_code_units(piece) if astral else piece for piece in pieces if piece]
