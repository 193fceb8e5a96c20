"""Errors a user can cause. Each message says what is wrong and what to do about it.

The CLI turns any ``StealkitError`` into a one-line message and exit code 2, never a traceback.
"""

from __future__ import annotations


class StealkitError(Exception):
    """Base class of every error caused by input, configuration or environment (not by a bug)."""


class InputError(StealkitError, ValueError):
    """An input tensor, file or argument is malformed (shape, dtype, NaN, range, unknown name)."""


class DataNotFoundError(StealkitError, FileNotFoundError):
    """A data set's files are missing; the message names where they were looked for and how to get them."""


class UnsafeFileError(StealkitError):
    """A file that could run code when loaded (a pickle, a ``.pt``) was refused."""


class BudgetExhausted(StealkitError):
    """The oracle's query budget cannot answer this request. Nothing was answered or charged."""

    def __init__(self, message: str, *, requested: int = 0, remaining: int = 0, kind: str = "predict"):
        super().__init__(message)
        self.requested = requested
        self.remaining = remaining
        self.kind = kind
