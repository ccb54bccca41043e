"""nbval with printed decimals compared to their last digit (a pytest plugin, loaded by pyproject.toml).

PyTorch's CPU kernels and MKL choose their code by instruction set (AVX-512, AVX2, Arm) and split
reductions by thread count, so a float computed on one CPU can differ from the same float computed
on another in its last bits. Printed with four decimals, that is at most one unit in the last
printed digit, and only when the value sits near a rounding boundary; PyTorch's tensor printing
also drops trailing zeros when every element is a whole number (``tensor([1., 1.])`` where another
CPU prints ``tensor([1.0000, 1.0000])``). Compared character by character, such an output fails on
a reader's CPU although the book is right.

This plugin keeps nbval's strict comparison and changes one thing: before nbval compares a fresh
output with the stored one, each fresh text (``text/plain``, ``text/html``, streams, ...) that
differs from the stored text *only in printed decimal numbers*, each of which is within one unit of
the last digit printed (of the more precise of the two), is replaced by the stored text. Everything
else is compared exactly, as before:

* the text between numbers, character for character (spacing, words, signs, tags);
* integers (``72``, ``1,024``): counts, sizes and indices must match exactly;
* a decimal that moved by more than one unit in its last digit (``0.3214`` -> ``0.3216``), or whose
  printed precision changed so that the values differ by more than the finer unit.

``1.``, ``1.0`` and ``1.0000`` are the same number. Numbers inside words and identifiers
(``ch08``, ``D_k``, base64 data) are text. Timings and other machine-dependent numbers are still
masked by ``tests/nbval_sanitize.cfg`` (the ``~`` convention), which runs first.

``tests/test_nbval_numbers.py`` runs nbval on planted notebooks to show both directions.
"""

from __future__ import annotations

import re
from decimal import Decimal
from typing import Any

#: A decimal number as printed: optional sign, digits with a decimal point and/or an exponent.
#: Not part of a word or of a longer number (no letter, digit, ``_`` or ``.`` on either side).
_NUMBER = re.compile(
    r"(?<![\w.])[-+]?(?:\d+\.\d*|\.\d+|\d+)(?:[eE][-+]?\d+)?(?![\w.])"
)


def _is_decimal(token: str) -> bool:
    return "." in token or "e" in token.lower()


def _unit(token: str) -> Decimal:
    """One unit in the last printed digit of ``token`` (``"0.3214"`` -> ``1e-4``, ``"1."`` -> ``1``)."""
    mantissa, _, exponent = token.lower().partition("e")
    decimals = len(mantissa.partition(".")[2])
    return Decimal(1).scaleb(int(exponent or 0) - decimals)


def _split(text: str) -> tuple[list[str], list[str]]:
    """The text between numbers and the numbers themselves (``len(parts) == len(numbers) + 1``)."""
    parts, numbers, start = [], [], 0
    for match in _NUMBER.finditer(text):
        parts.append(text[start:match.start()])
        numbers.append(match.group())
        start = match.end()
    parts.append(text[start:])
    return parts, numbers


#: A kernel-free slider's frames (``attnbook.slider``): gzip-compressed JSON in base64.
_PAYLOAD = re.compile(r'(<script type="application/gzip" class="attnlib-data">)([^<]*)(</script>)')
#: One heatmap cell as the slider writes it: its colours, then the number it prints.
_CELL = re.compile(r'<td style="background:#[0-9a-f]{6};color:#[0-9a-f]{3}">([^<]*)</td>')


def _unpack(payload: str) -> Any:
    import base64
    import gzip
    import json

    return json.loads(gzip.decompress(base64.b64decode(payload)))


def _same_data(stored: Any, fresh: Any) -> bool:
    """Whether a slider's frames read the same: texts by the last-digit rule, everything else equal.

    A heatmap panel's colour indices (``"i"``) are taken from the numbers it prints (``"v"``), so a
    colour may differ only where its cell's printed number differs (by one unit, as checked).
    """
    if isinstance(stored, dict):
        if not isinstance(fresh, dict) or stored.keys() != fresh.keys():
            return False
        if "v" in stored and "i" in stored and stored.get("y") != "lines":
            values_a, values_b = stored["v"], fresh["v"]
            if len(values_a) != len(values_b) or len(stored["i"]) != len(fresh["i"]):
                return False
            for va, vb, ia, ib in zip(values_a, values_b, stored["i"], fresh["i"]):
                if not same_to_last_digit(va, vb) or (va == vb and ia != ib):
                    return False
            rest = set(stored) - {"v", "i"}
            return all(_same_data(stored[k], fresh[k]) for k in rest)
        if "pal" in stored and isinstance(stored["pal"], dict) and isinstance(fresh["pal"], dict):
            # the colours in use, by index: the indices are checked above, the colours must agree
            shared = stored["pal"].keys() & fresh["pal"].keys()
            if any(stored["pal"][k] != fresh["pal"][k] for k in shared):
                return False
            return all(_same_data(stored[k], fresh[k]) for k in stored if k != "pal")
        return all(_same_data(stored[k], fresh[k]) for k in stored)
    if isinstance(stored, list):
        return isinstance(fresh, list) and len(stored) == len(fresh) and all(
            _same_data(a, b) for a, b in zip(stored, fresh))
    if isinstance(stored, str):
        return isinstance(fresh, str) and same_to_last_digit(stored, fresh)
    return type(stored) is type(fresh) and stored == fresh


def _same_slider(stored: str, fresh: str) -> bool:
    """A kernel-free slider compared by what it shows (see :func:`same_to_last_digit`)."""
    packed_a, packed_b = _PAYLOAD.findall(stored), _PAYLOAD.findall(fresh)
    if len(packed_a) != len(packed_b):
        return False
    try:
        if not all(_same_data(_unpack(a[1]), _unpack(b[1])) for a, b in zip(packed_a, packed_b)):
            return False
    except (ValueError, OSError, EOFError):   # not a payload this module can read: compare as text
        return False
    # the visible first frame: a cell's colours may differ only where its printed number does
    cells_a, cells_b = _CELL.finditer(stored), _CELL.finditer(fresh)
    for a, b in zip(cells_a, cells_b):
        if a.group(1) == b.group(1) and a.group(0) != b.group(0):
            return False
    plain_a = _CELL.sub(lambda m: f"<td>{m.group(1)}</td>", _PAYLOAD.sub(r"\1\3", stored))
    plain_b = _CELL.sub(lambda m: f"<td>{m.group(1)}</td>", _PAYLOAD.sub(r"\1\3", fresh))
    return same_to_last_digit(plain_a, plain_b)


def same_to_last_digit(stored: str, fresh: str) -> bool:
    """Whether ``fresh`` reads as ``stored``: equal text, equal integers, decimals within one unit.

    >>> same_to_last_digit("tensor([1.0000, 0.5000])", "tensor([1., 0.5000])")
    True
    >>> same_to_last_digit("error 0.0036", "error 0.0037"), same_to_last_digit("error 0.0036", "error 0.0038")
    (True, False)
    >>> same_to_last_digit("72 MiB", "73 MiB")
    False
    """
    if stored == fresh:
        return True
    if _PAYLOAD.search(stored) and _PAYLOAD.search(fresh):
        return _same_slider(stored, fresh)
    stored_parts, stored_numbers = _split(stored)
    fresh_parts, fresh_numbers = _split(fresh)
    if stored_parts != fresh_parts:
        return False
    for a, b in zip(stored_numbers, fresh_numbers):
        if a == b:
            continue
        if not (_is_decimal(a) and _is_decimal(b)):
            return False                      # an integer must be printed identically
        if abs(Decimal(a) - Decimal(b)) > min(_unit(a), _unit(b)):
            return False
    return True


def _texts(output: Any) -> dict[str, Any]:
    """The comparable fields of one (stream-transformed) output, flattened as nbval flattens them."""
    fields = {key: value for key, value in output.items() if key != "data"}
    fields.update(output.get("data", {}))
    return fields


def harmonise(cell: Any, fresh: list[Any], stored: list[Any]) -> list[Any]:
    """``fresh`` with each text that reads as the stored one (:func:`same_to_last_digit`) replaced by it.

    Outputs are paired in order, as nbval pairs them; a pair of different kinds is left alone, so
    nbval reports it. Texts are compared after nbval's sanitizers (``cell.sanitize``).
    """
    from nbval.plugin import transform_streams_for_comparison

    fresh_t = transform_streams_for_comparison(fresh)
    stored_t = transform_streams_for_comparison(stored)
    result = []
    for i, out in enumerate(fresh):
        if i >= len(stored_t) or fresh_t[i].get("output_type") != stored_t[i].get("output_type"):
            result.append(out)
            continue
        stored_fields = _texts(stored_t[i])
        replace = {}
        for key, value in _texts(fresh_t[i]).items():
            ref = stored_fields.get(key)
            if isinstance(value, str) and isinstance(ref, str) and value != ref:
                if same_to_last_digit(cell.sanitize(ref), cell.sanitize(value)):
                    replace[key] = ref
        if not replace:
            result.append(out)
            continue
        out = type(out)(out)                  # shallow copy; nbformat NotebookNode or dict
        if out.get("output_type") == "stream":
            out["text"] = replace.pop(out["name"], out["text"])
        if "data" in out:
            out["data"] = type(out["data"])(out["data"])
            for key in list(replace):
                if key in out["data"]:
                    out["data"][key] = replace.pop(key)
        result.append(out)
    return result


def pytest_configure(config: Any) -> None:
    try:
        from nbval.plugin import IPyNbCell
    except ImportError:                       # nbval not installed: nothing to change
        return
    if getattr(IPyNbCell.compare_outputs, "_last_digit", False):
        return
    strict = IPyNbCell.compare_outputs

    def compare_outputs(self: Any, test: list[Any], ref: list[Any], skip_compare: Any = None) -> bool:
        return strict(self, harmonise(self, test, ref), ref, skip_compare)

    compare_outputs._last_digit = True        # type: ignore[attr-defined]
    IPyNbCell.compare_outputs = compare_outputs
