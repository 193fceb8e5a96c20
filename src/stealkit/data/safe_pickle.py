"""A restricted unpickler for data files that are pickles (CIFAR-10's "python version").

A plain ``pickle.load`` runs whatever callable the file names, so a tampered download could run code.
``load_data_pickle`` only lets a pickle rebuild numpy arrays and plain containers; any other global
(``os.system``, ``builtins.eval``, a class) is refused before anything is called.
"""

from __future__ import annotations

import io
import pickle
from pathlib import Path
from typing import Any

import numpy as np

from stealkit.errors import DataNotFoundError, InputError, UnsafeFileError


class UnsafePickleError(UnsafeFileError, InputError):
    """A pickle named a global outside the allow-list; nothing in it was called."""


def _latin1_encode(text: str, encoding: str = "latin1") -> bytes:
    """Stand-in for ``_codecs.encode``, which protocol-2 pickles from Python 3 use to rebuild ``bytes``."""
    if encoding.lower().replace("-", "").replace("_", "") not in ("latin1", "iso88591"):
        raise UnsafePickleError(
            f"the pickle asks _codecs.encode for encoding {encoding!r}; only latin-1 is allowed"
        )
    if not isinstance(text, str):
        raise UnsafePickleError("the pickle passes a non-string to _codecs.encode")
    return text.encode("latin-1")


_RECONSTRUCT = np.ndarray.__reduce__(np.zeros(1))[0]  # numpy's array rebuilders, whatever module they live in
_FROMBUFFER = np.ndarray.__reduce_ex__(np.zeros(1), 5)[0]  # protocol 5 pickles of contiguous arrays
_BUILTINS = {
    t.__name__: t for t in (dict, list, tuple, set, frozenset, bytes, bytearray, str, int, float, complex)
}

_ALLOWED: dict[tuple[str, str], Any] = {
    ("numpy.core.multiarray", "_reconstruct"): _RECONSTRUCT,  # numpy < 2 and Python 2 pickles
    ("numpy._core.multiarray", "_reconstruct"): _RECONSTRUCT,  # numpy >= 2
    ("numpy.core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy._core.numeric", "_frombuffer"): _FROMBUFFER,
    ("numpy", "ndarray"): np.ndarray,
    ("numpy", "dtype"): np.dtype,
    ("_codecs", "encode"): _latin1_encode,
}
for _module in ("builtins", "__builtin__"):  # Python 3 and Python 2 spellings
    for _name, _obj in _BUILTINS.items():
        _ALLOWED[(_module, _name)] = _obj


class _RestrictedUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        try:
            return _ALLOWED[(module, name)]
        except KeyError:
            raise UnsafePickleError(
                f"it references {module}.{name}, which is not a numpy array or a plain container"
            ) from None


def loads_data_pickle(data: bytes) -> Any:
    """Unpickle ``data`` allowing only numpy arrays and builtin containers (``bytes`` strings as in CIFAR)."""
    return _RestrictedUnpickler(io.BytesIO(data), encoding="bytes").load()


def load_data_pickle(path: str | Path, *, what: str = "data file") -> Any:
    """Read a pickled data file safely; errors name the file and say what to do."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except FileNotFoundError:
        raise DataNotFoundError(f"{what} {path} does not exist") from None
    except OSError as exc:
        raise InputError(f"cannot read {what} {path}: {exc}") from None
    try:
        return loads_data_pickle(data)
    except UnsafePickleError as exc:
        raise UnsafePickleError(
            f"refused to load {what} {path}: {exc}. Such a file can run code when unpickled; "
            "delete it and download it again from a trusted source"
        ) from None
    except Exception as exc:  # a damaged pickle can raise almost anything; none of it is the user's bug
        raise InputError(
            f"{what} {path} is not a readable pickle ({type(exc).__name__}: {exc}); download it again"
        ) from None
