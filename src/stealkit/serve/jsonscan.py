"""A JSON reader for request bodies whose memory stays near the body's size, whatever the body holds.

``json.loads`` builds a Python object per number: a 6 MB array of pixels becomes about a million floats and
list slots, some six times the body, and the allocator keeps most of it after the request is refused. Here an
array that starts with a number or an array is read as a **numeric array**, in vectorised passes over the
body's bytes (numpy), never as Python objects:

1. its extent (the matching ``]``) is found in windows that grow geometrically, so many small arrays cost
   their own size, not the body's;
2. every byte must be a digit, ``-+.eE``, ``,[]`` or white space (else: "must hold only numbers");
3. its *skeleton* (brackets, commas, one ``n`` per number) must equal the skeleton of the regular shape its
   brackets imply, which proves it is a regular nested array with one number per slot;
4. the numbers are converted by numpy's C parser in pieces of about :data:`PIECE` bytes (so no single call
   holds the interpreter long) and the count is checked.

It comes back as an ``ndarray`` of that shape: ``int64`` when no number has a fraction or exponent, else
``float64``. Every other value (objects, strings, ``true``/``false``/``null``, arrays of those) is read as usual,
with at most :data:`MAX_ITEMS` items per object or array and :data:`MAX_DEPTH` levels, and without
recursion errors. Lenient where C's ``strtod`` is: ``1.`` and ``01`` read as numbers.

**Parsing costs what the bytes weigh.** A request's schema holds a handful of values besides its pixel arrays,
so a document may hold at most :data:`MAX_VALUES` values in all (each scalar, object, array and numeric array
counts one; a numeric array's numbers count nothing): junk such as ``{"inputs": [{"a": [{}, [1], [1], ...]},
...]}``, which would cost a numpy pass per tiny array, is refused after that many values, whatever its size.
With ``numeric``, the named members must be numeric arrays and with ``flat`` every member of the document must
be a scalar or a numeric array (the /v1 schema): such a document is refused at its first wrong token. ``stats``
(a dict) receives ``values`` (values read) and ``bytes`` (the furthest byte examined), whether or not the body
was accepted. A parse whose client has left stops at its next window or value
(:func:`stealkit.serve.cancel.check`).
"""

from __future__ import annotations

import json
import re
from typing import Any

import numpy as np

from stealkit.errors import InputError
from stealkit.serve.cancel import check as check_cancelled

MAX_DEPTH = 32
MAX_ITEMS = 4096
#: values (scalars, objects, arrays, numeric arrays) one document may hold: a request needs a few dozen at most
MAX_VALUES = 256
PIECE = 1 << 18
_WS = re.compile(rb"[ \t\n\r]*")
_STRING = re.compile(rb'"(?:[^"\\\x00-\x1f]|\\["\\/bfnrt]|\\u[0-9a-fA-F]{4})*"')
_NUMBER = re.compile(rb"-?(?:0|[1-9][0-9]*)(?:\.[0-9]+)?(?:[eE][+-]?[0-9]+)?")
_LITERALS = {b"true": True, b"false": False, b"null": None}


def _table(chars: bytes) -> np.ndarray:
    t = np.zeros(256, dtype=bool)
    t[np.frombuffer(chars, np.uint8)] = True
    return t


_NUM_CHARS = _table(b"0123456789-+.eE")
_ALLOWED = _table(b"0123456789-+.eE,[] \t\n\r")
_START_OK = _table(b"0123456789-")
_FRACTION = _table(b".eE")
_BRACKETS_TO_SPACE = np.arange(256, dtype=np.uint8)
_BRACKETS_TO_SPACE[[ord("["), ord("]")]] = ord(" ")
_OPEN, _CLOSE, _COMMA, _NUM = ord("["), ord("]"), ord(","), ord("n")


class JsonError(InputError):
    """The body is not JSON this server reads."""


def loads(buf: bytes | bytearray | memoryview, *, fields: frozenset[str] | None = None,
          numeric: frozenset[str] = frozenset(), flat: bool = False, schema: dict[str, Any] | None = None,
          stats: dict[str, int] | None = None) -> Any:
    """Parse a whole JSON document from bytes. With ``fields``, the document must be an object whose member
    names all lie in ``fields``, each refused before its value is read; members named in ``numeric`` must be
    numeric arrays, and with ``flat`` no member may be an object or an array of non-numbers. ``schema`` (instead
    of those three) describes the whole document (see :data:`SCALAR`); the module docstring says more, also
    about ``stats``."""
    data = memoryview(buf).cast("B") if not isinstance(buf, bytes) else buf
    if schema is None and fields is not None:
        schema = {name: NUMERIC if name in numeric else FLAT if flat else None for name in fields}
    reader = _Reader(data)
    try:
        pos = reader.skip(0)
        if schema is not None and not reader.at(pos, b"{"):
            raise JsonError('the JSON body must be an object like {"inputs": [...]}')
        value, pos = reader.value(pos, 0, schema, "the body")
        if reader.skip(pos) != len(data):
            raise reader.bad("extra data after the value", pos)
        return value
    finally:
        if stats is not None:
            stats["values"], stats["bytes"] = reader.values, reader.furthest


#: schema leaves: a scalar (string, number, ``true``/``false``/``null``); a numeric array (or ``[]``); either of those
#: (``FLAT``). A dict is an object with those member names (``"*"``: any name) and their schemas, a one-item list an
#: array of items of that schema, ``None`` anything (still under the value cap). An object or array schema also
#: accepts a scalar (the caller's checks then say what is wrong with it): only structure is refused here, at the
#: first token that does not fit.
SCALAR, NUMERIC, FLAT = "a number, a string, true, false or null", "an array of numbers", \
    "a number, a string or an array of numbers"


def _wants(spec: Any) -> str:
    if isinstance(spec, str):
        return spec
    return "an object" if isinstance(spec, dict) else "an array of objects"


class _Reader:
    def __init__(self, data: bytes | memoryview) -> None:
        self.data = data
        self.n = len(data)
        self._array: np.ndarray | None = None
        self.values = 0  # values read so far (at most MAX_VALUES)
        self.furthest = 0  # the furthest byte examined

    @property
    def array(self) -> np.ndarray:
        if self._array is None:
            self._array = np.frombuffer(self.data, dtype=np.uint8)
        return self._array

    def skip(self, pos: int) -> int:
        return _WS.match(self.data, pos).end()  # type: ignore[union-attr]

    def at(self, pos: int, token: bytes) -> bool:
        return self.data[pos:pos + len(token)] == token

    def bad(self, what: str, pos: int) -> JsonError:
        return JsonError(f"the body is not valid JSON: {what} at byte {pos}")

    def value(self, pos: int, depth: int, spec: Any = None, where: str = "") -> tuple[Any, int]:
        """The value at ``pos``, which must fit ``spec`` (a schema, see :data:`SCALAR`; ``where`` names it)."""
        if depth >= MAX_DEPTH:
            raise JsonError(f"the JSON body is nested more than {MAX_DEPTH} levels deep")
        if pos >= self.n:
            raise self.bad("unexpected end", pos)
        self.furthest = max(self.furthest, pos)
        self.values += 1
        check_cancelled()
        if self.values > MAX_VALUES:
            raise JsonError(f"the JSON body holds more than {MAX_VALUES} values besides its arrays of numbers; a "
                            "request needs a few")
        c = self.data[pos]
        if c == ord("{"):
            if spec is not None and not isinstance(spec, dict):
                raise JsonError(f"{where} must be {_wants(spec)}, not an object (byte {pos})")
            return self.object(pos, depth, spec, where)
        if c == ord("["):
            nxt = self.skip(pos + 1)
            self.furthest = max(self.furthest, nxt)
            empty = nxt < self.n and self.data[nxt] == _CLOSE
            if spec == SCALAR or isinstance(spec, dict):
                raise JsonError(f"{where} must be {_wants(spec)}, not an array (byte {pos})")
            if nxt < self.n and (self.data[nxt] == _OPEN or _START_OK[self.data[nxt]]):
                return self.numeric(pos, depth)
            if spec in (NUMERIC, FLAT) and not empty:
                raise JsonError(f"{where} must be {spec}; found {bytes(self.data[nxt:nxt + 1])!r} at byte {nxt}")
            return self.list(pos, depth, spec[0] if isinstance(spec, list) else None, where)
        if spec == NUMERIC:
            raise JsonError(f"{where} must be an array of numbers, not {bytes(self.data[pos:pos + 1])!r} "
                            f"(byte {pos})")
        if c == ord('"'):
            return self.string(pos)
        m = _NUMBER.match(self.data, pos)
        if m is not None and m.end() > pos:
            text = bytes(self.data[pos:m.end()])
            if len(text) > 400:
                raise JsonError(f"a number of {len(text)} characters at byte {pos}")
            return (float(text) if any(ch in text for ch in b".eE") else int(text)), m.end()
        for word, val in _LITERALS.items():
            if self.at(pos, word):
                return val, pos + len(word)
        raise self.bad("unexpected character", pos)

    def string(self, pos: int) -> tuple[str, int]:
        m = _STRING.match(self.data, pos)
        if m is None:
            raise self.bad("malformed string", pos)
        try:
            return json.loads(bytes(self.data[pos:m.end()]).decode("utf-8")), m.end()
        except (UnicodeDecodeError, ValueError):
            raise self.bad("malformed string", pos) from None

    def object(self, pos: int, depth: int, spec: dict[str, Any] | None, where: str) -> tuple[dict[str, Any], int]:
        out: dict[str, Any] = {}
        pos = self.skip(pos + 1)
        if self.at(pos, b"}"):
            return out, pos + 1
        inner = "" if where == "the body" else where + "."
        while True:
            if not self.at(pos, b'"'):
                raise self.bad("expected a field name", pos)
            name, pos = self.string(pos)
            member = None
            if spec is not None:
                if name not in spec and "*" not in spec:
                    known = sorted(spec)
                    raise JsonError(f"unknown field {name[:40]!r} in {'the JSON body' if not inner else where}; "
                                    f"expected some of {known}")
                member = spec.get(name, spec.get("*"))
            pos = self.skip(pos)
            if not self.at(pos, b":"):
                raise self.bad("expected ':'", pos)
            out[name], pos = self.value(self.skip(pos + 1), depth + 1, member, f"{inner}{name[:40]!r}"
                                        if not inner else f"{inner}{name[:40]}")
            if len(out) > MAX_ITEMS:
                raise JsonError(f"a JSON object with more than {MAX_ITEMS} fields")
            pos = self.skip(pos)
            if self.at(pos, b","):
                pos = self.skip(pos + 1)
            elif self.at(pos, b"}"):
                return out, pos + 1
            else:
                raise self.bad("expected ',' or '}'", pos)

    def list(self, pos: int, depth: int, spec: Any = None, where: str = "") -> tuple[list[Any], int]:
        out: list[Any] = []
        pos = self.skip(pos + 1)
        if self.at(pos, b"]"):
            return out, pos + 1
        while True:
            item, pos = self.value(pos, depth + 1, spec, f"{where}[{len(out)}]")
            out.append(item)
            if len(out) > MAX_ITEMS:
                raise JsonError(f"a JSON array of more than {MAX_ITEMS} items that are not numbers")
            pos = self.skip(pos)
            if self.at(pos, b","):
                pos = self.skip(pos + 1)
            elif self.at(pos, b"]"):
                return out, pos + 1
            else:
                raise self.bad("expected ',' or ']'", pos)

    def end_of_array(self, pos: int) -> int:
        """The index of the ``]`` closing the array opened at ``pos`` (brackets only; strings are refused later)."""
        a, depth, start, window = self.array, 0, pos, 256
        while start < self.n:
            check_cancelled()
            stop = min(self.n, start + window)
            chunk = a[start:stop]
            steps = (chunk == _OPEN).astype(np.int8) - (chunk == _CLOSE)
            if steps.any():
                level = depth + np.cumsum(steps, dtype=np.int32)
                closed = np.flatnonzero(level == 0)
                if closed.size:
                    self.furthest = max(self.furthest, start + int(closed[0]))
                    return start + int(closed[0])
                depth = int(level[-1])
            self.furthest = max(self.furthest, stop)
            start, window = stop, min(window * 2, PIECE)
        raise self.bad("unterminated array", pos)

    def numeric(self, pos: int, depth: int) -> tuple[np.ndarray, int]:
        end = self.end_of_array(pos) + 1
        span = self.array[pos:end]
        skeleton, integral = self.skeleton(span, pos)
        ndim, opens, count = _levels(skeleton, pos)
        if depth + ndim > MAX_DEPTH:
            raise JsonError(f"the JSON body is nested more than {MAX_DEPTH} levels deep")
        shape, counts = [], [*opens, count]
        for outer, inner in zip(counts[:-1], counts[1:], strict=True):
            if outer == 0 or inner % outer:
                raise JsonError(f"the array at byte {pos} is not regular (rows of different lengths)")
            shape.append(inner // outer)
        if _skeleton_length(shape) != skeleton.size or skeleton.tobytes() != _skeleton(shape):
            raise JsonError(f"the array at byte {pos} is not a regular array of numbers (rows of different "
                            "lengths, or a missing or extra number or comma)")
        del skeleton
        values = self.parse_numbers(span, count, pos, np.float64 if integral else np.float32)
        if integral:
            if count and np.abs(values).max() > 2.0**53:
                raise JsonError(f"an integer in the array at byte {pos} is too large")
            values = values.astype(np.int64)
        return values.reshape(shape), end

    def skeleton(self, span: np.ndarray, pos: int) -> tuple[np.ndarray, bool]:
        """The array's brackets and commas with one ``n`` per number, checked byte by byte in windows (so the
        temporaries stay a few MB); and whether no number has a fraction or exponent."""
        pieces, integral = [], True
        for lo in range(0, span.size, PIECE):
            check_cancelled()
            w = span[lo:lo + PIECE]
            allowed = _ALLOWED[w]
            if not allowed.all():
                bad = pos + lo + int(np.argmin(allowed))
                raise JsonError(f"an array must hold only numbers (or arrays of numbers); found "
                                f"{bytes(self.data[bad:bad + 1])!r} at byte {bad}")
            is_num = _NUM_CHARS[w]
            starts = is_num.copy()
            starts[1:] &= ~is_num[:-1]
            if lo and is_num[0] and _NUM_CHARS[span[lo - 1]]:
                starts[0] = False  # a number that began in the previous window
            if not _START_OK[w[starts]].all():
                raise JsonError(f"a number in the array at byte {pos} starts with '+', '.' or 'e'")
            integral = integral and not _FRACTION[w].any()
            keep = starts | ((w == _OPEN) | (w == _CLOSE) | (w == _COMMA))
            pieces.append(np.where(starts, np.uint8(_NUM), w)[keep])
        return (np.concatenate(pieces) if len(pieces) > 1 else pieces[0]), integral

    def parse_numbers(self, span: np.ndarray, count: int, pos: int, dtype: type) -> np.ndarray:
        """The numbers of a checked array, parsed by numpy's C parser (as float64, like ``json``) piece by piece."""
        out = np.empty(count, dtype=dtype)
        filled, start = 0, 0
        while start < span.size:
            check_cancelled()
            stop = start + PIECE
            if stop < span.size:
                commas = np.flatnonzero(span[stop:stop + 4096] == _COMMA)
                stop = stop + int(commas[0]) if commas.size else stop + 4096
            text = _BRACKETS_TO_SPACE[span[start:stop]].tobytes()
            try:
                got = np.fromstring(text, dtype=np.float64, sep=",")  # C strtod; no Python object per number
            except ValueError:
                raise JsonError(f"the array at byte {pos} holds something that is not a JSON number") from None
            if filled + got.size > count:
                break
            out[filled:filled + got.size] = got
            filled += got.size
            start = stop + 1
        if filled != count:
            raise JsonError(f"the array at byte {pos} holds something that is not a JSON number")
        return out


def _levels(skeleton: np.ndarray, pos: int) -> tuple[int, list[int], int]:
    """``(depth, [arrays opened at each level 1..depth], numbers)`` of a skeleton, in windows; numbers must all
    sit at the deepest level."""
    carry, ndim, opens, count = 0, 0, np.zeros(0, dtype=np.int64), 0
    num_lo, num_hi = None, None
    for lo in range(0, skeleton.size, PIECE):
        check_cancelled()
        w = skeleton[lo:lo + PIECE]
        is_open = w == _OPEN
        level = carry + np.cumsum(is_open.astype(np.int8) - (w == _CLOSE), dtype=np.int32)
        if level.min() < 0:
            raise JsonError(f"the array at byte {pos} closes more brackets than it opens")
        ndim = max(ndim, int(level.max()))
        if ndim > MAX_DEPTH:
            raise JsonError(f"the JSON body is nested more than {MAX_DEPTH} levels deep")
        counts = np.bincount(level[is_open], minlength=MAX_DEPTH + 1)
        opens = counts if not opens.size else opens + counts
        at_numbers = level[w == _NUM]
        if at_numbers.size:
            count += at_numbers.size
            lo_n, hi_n = int(at_numbers.min()), int(at_numbers.max())
            num_lo = lo_n if num_lo is None else min(num_lo, lo_n)
            num_hi = hi_n if num_hi is None else max(num_hi, hi_n)
        carry = int(level[-1])
    if count and not num_lo == num_hi == ndim:
        raise JsonError(f"the array at byte {pos} mixes numbers and arrays at one level")
    return ndim, [int(c) for c in opens[1:ndim + 1]], count


def _skeleton_length(shape: list[int]) -> int:
    length = 1
    for side in reversed(shape):
        length = 2 + side * length + max(side - 1, 0)
    return length


def _skeleton(shape: list[int]) -> bytes:
    """The skeleton (``[``, ``]``, ``,``, ``n`` per number) of a regular array of ``shape``."""
    inner = b"n"
    for side in reversed(shape):
        inner = b"[" + b",".join([inner] * side) + b"]"
    return inner
