"""The plain-data encoding of values that cross the sandbox boundary (arguments in, return values out).

Only exact built-in types are encodable: ``None``, ``bool``, ``int``, ``float`` (incl. nan / inf / -0.0), ``str``,
``bytes``, ``complex``, ``list``, ``tuple``, ``set``, ``frozenset`` and ``dict`` (any encodable keys), nested to a
bounded depth. A subclass (``class I(int)`` with an ``__eq__`` that always says True) or any other object raises
``Unencodable``: the judge counts that call as failed. A JSON array is a list; every other container is a JSON
object with a tag, so decoding rebuilds exactly the types that were encoded and comparisons in the judge stay exact
(``(1, 2) != [1, 2]``, ``1 != 1.0`` is still ``False`` as in Python, ``nan != nan``).

This file runs in three places: imported by the host (tests), and as source text inside the sandbox's runner and
the judge (``SOURCE``), so it uses nothing but the standard library and defines only these names.
"""

from __future__ import annotations

import json
import math

MAX_DEPTH = 64
# Elements of one set (keys of one dict) whose hashes repeat: building it costs a comparison per earlier element
# of the same hash, so a forged set of ints that all hash alike (multiples of 2**61 - 1) takes quadratic time in
# one C call, which no signal interrupts. Real results almost never repeat a hash; this many is plenty.
MAX_HASH_REPEATS = 64


class Unencodable(TypeError):
    """A value that is not plain data (the message names its type)."""


def encode(value, depth=0):
    """``value`` as JSON-able data (see the module docstring); raises ``Unencodable``."""
    kind = type(value)
    if value is None or kind is bool or kind is str:
        return value
    if kind is int:
        if value.bit_length() > 4096:  # json would refuse it anyway; a clear message instead
            raise Unencodable("an int with more than 4096 bits")
        return value
    if kind is float:
        if math.isfinite(value):
            return value
        return {"t": "float", "v": "nan" if math.isnan(value) else ("inf" if value > 0 else "-inf")}
    if depth >= MAX_DEPTH:
        raise Unencodable(f"a value nested deeper than {MAX_DEPTH} levels")
    if kind is list:
        return [encode(v, depth + 1) for v in value]
    if kind is tuple:
        return {"t": "tuple", "v": [encode(v, depth + 1) for v in value]}
    if kind is set or kind is frozenset:
        return {"t": kind.__name__, "v": [encode(v, depth + 1) for v in value]}
    if kind is dict:
        return {"t": "dict", "v": [[encode(k, depth + 1), encode(v, depth + 1)] for k, v in value.items()]}
    if kind is bytes:
        return {"t": "bytes", "v": value.hex()}
    if kind is complex:
        return {"t": "complex", "v": [encode(value.real, depth + 1), encode(value.imag, depth + 1)]}
    raise Unencodable(f"a {kind.__name__}")


_FLOATS = {"nan": math.nan, "inf": math.inf, "-inf": -math.inf}


def decode(data, depth=0):
    """The value ``encode`` encoded; raises ``ValueError`` / ``TypeError`` on anything else."""
    if depth > MAX_DEPTH + 1:
        raise ValueError("nested too deeply")
    kind = type(data)
    if data is None or kind in (bool, int, float, str):
        return data
    if kind is list:
        return [decode(v, depth + 1) for v in data]
    if kind is not dict or set(data) != {"t", "v"}:
        raise ValueError(f"not an encoded value: a {kind.__name__}")
    tag, v = data["t"], data["v"]
    if tag == "float" and v in _FLOATS:
        return _FLOATS[v]
    if tag == "bytes" and type(v) is str:
        return bytes.fromhex(v)
    if type(v) is not list:
        raise ValueError(f"bad payload for tag {tag!r}")
    items = [decode(x, depth + 1) for x in v]
    if tag == "tuple":
        return tuple(items)
    if tag == "set":
        return set(_spread(items))
    if tag == "frozenset":
        return frozenset(_spread(items))
    if tag == "dict" and all(type(p) is list and len(p) == 2 for p in items):
        _spread([p[0] for p in items])
        return {k: val for k, val in items}
    if tag == "complex" and len(items) == 2 and all(type(x) in (int, float) for x in items):
        return complex(items[0], items[1])
    raise ValueError(f"unknown tag {tag!r}")


def _spread(keys):
    """``keys``, unless more than ``MAX_HASH_REPEATS`` of them repeat a hash (``ValueError``; see there). The check
    itself is linear: it counts the hashes as bytes, whose own hashes are seeded at random (an int hash is
    reduced modulo 2**61 - 1, so distinct tuple hashes could be chosen to collide again)."""
    repeats = len(keys) - len({hash(k).to_bytes(8, "little", signed=True) for k in keys})
    if repeats > MAX_HASH_REPEATS:
        raise ValueError(
            f"{repeats} of {len(keys)} set elements or dict keys repeat a hash (at most {MAX_HASH_REPEATS})"
        )
    return keys


def dumps(value) -> str:
    """One line of JSON for ``encode(value)`` (no NaN literals: those travel as tags)."""
    return json.dumps(encode(value), allow_nan=False, separators=(",", ":"))


def loads(text):
    return decode(json.loads(text))
