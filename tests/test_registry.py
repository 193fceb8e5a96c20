"""The method registries: every name resolves to a run function and its config, unknown names are clear errors."""

from __future__ import annotations

import dataclasses

import pytest

from stealkit.errors import InputError
from stealkit.evade.registry import ATTACKS, DECISION, TRANSFER
from stealkit.extract.registry import DATAFREE, METHODS


@pytest.mark.parametrize("registry", [METHODS, ATTACKS])
def test_every_entry_resolves(registry) -> None:  # noqa: ANN001
    for name, entry in registry.items():
        assert callable(entry.run), name
        assert entry.config is None or dataclasses.is_dataclass(entry.config), name


def test_unknown_names_list_the_known_ones() -> None:
    with pytest.raises(InputError, match="unknown extraction method 'nope'.*dfme"):
        METHODS["nope"]
    with pytest.raises(InputError, match="unknown attack 'nope'.*hopskipjump"):
        ATTACKS["nope"]


def test_families_are_what_the_cli_offers() -> None:
    import click

    from stealkit.cli import cli

    extract = cli.commands["extract"]
    attack = cli.commands["attack"]
    assert isinstance(extract, click.Group) and isinstance(attack, click.Group)
    assert DATAFREE == ("dfme", "maze", "dast", "codfe")
    assert set(DATAFREE) <= set(extract.commands)
    assert set(TRANSFER) | set(DECISION) <= set(attack.commands)
