"""A name -> (run function, config dataclass) table whose entries are imported only when asked for.

:mod:`stealkit.extract.registry` (extraction methods) and :mod:`stealkit.evade.registry` (attacks) are two
such tables; commands, benchmarks and studies find a method through them by its public name.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable, Iterator, Mapping
from dataclasses import dataclass
from typing import Any

from stealkit.errors import InputError


@dataclass(frozen=True)
class Entry:
    """One method: its name, the module and names of its run function and config dataclass, and its paper."""

    name: str
    module: str
    run_name: str
    config_name: str | None = None
    family: str = ""
    paper: str = ""

    @property
    def run(self) -> Callable[..., Any]:
        """The method's run function (its module is imported on first use)."""
        return getattr(importlib.import_module(self.module), self.run_name)

    @property
    def config(self) -> type | None:
        """The method's config dataclass, or ``None`` for a method without one."""
        if self.config_name is None:
            return None
        return getattr(importlib.import_module(self.module), self.config_name)


class Registry(Mapping[str, Entry]):
    """Entries by name; looking up an unknown name is an :class:`InputError` that lists the known ones."""

    def __init__(self, what: str, entries: list[Entry]) -> None:
        self.what = what
        self._entries = {e.name: e for e in entries}

    def __getitem__(self, name: str) -> Entry:
        try:
            return self._entries[name]
        except KeyError:
            raise InputError(f"unknown {self.what} {name!r}; expected one of {', '.join(self._entries)}") from None

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def family(self, family: str) -> tuple[str, ...]:
        """The names of the entries of one family, in table order."""
        return tuple(n for n, e in self._entries.items() if e.family == family)
