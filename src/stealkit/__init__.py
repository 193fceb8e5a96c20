"""stealkit: what a prediction or explanation API leaks, what an attacker does with it, what a defender can prove."""

from importlib.metadata import PackageNotFoundError, version

try:
    __version__ = version("stealkit")
except PackageNotFoundError:  # running from a source tree without an install
    __version__ = "0.0.0+unknown"

from stealkit.errors import BudgetExhausted, InputError, StealkitError

__all__ = ["BudgetExhausted", "InputError", "StealkitError", "__version__"]
