"""stealkit: what a prediction or explanation API leaks, what an attacker does with it, what a defender can prove."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("stealkit")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

from stealkit.errors import BudgetExhausted, InputError, StealkitError


def __getattr__(name: str) -> object:
    """``stealkit.steal`` and ``stealkit.Extraction`` (:mod:`stealkit.api`), imported on first use."""
    if name in ("steal", "Extraction"):
        from stealkit import api

        return getattr(api, name)
    raise AttributeError(f"module 'stealkit' has no attribute {name!r}")


__all__ = ["BudgetExhausted", "Extraction", "InputError", "StealkitError", "__version__", "steal"]
