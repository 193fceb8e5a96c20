"""The audit of a feature-vector victim (input ``(d,)``, :mod:`stealkit.data.features`): its options and notes.

The feature ranges are taken once, for every part, from the owner's ``--test-data`` and the ``--pool`` /
``--unrelated`` files (or the victim's declared ranges file). The unrelated attacker's default (``patches``, crops
of photographs) is an image source: a feature-vector victim's unrelated attacker queries ``uniform`` points of
the ranges' box instead, and the plan says so. The data-free attacker's generators make images: it is not
measured, and the plan says why."""

from __future__ import annotations

import dataclasses
from typing import TYPE_CHECKING

from stealkit.audit.options import DEFAULT_UNRELATED

if TYPE_CHECKING:
    from stealkit.audit.options import AuditOptions
    from stealkit.data.features import FeatureRange
    from stealkit.oracle.victim import Target

#: the unrelated attacker's data for a feature-vector victim when ``--unrelated`` is left at its default
TABULAR_UNRELATED = "uniform"
DATAFREE_NOT_MEASURED = ("the data-free attacker not measured: its generators make images, and the victim takes a "
                         "vector of {d} features")


def own_files(options: AuditOptions) -> tuple[str, ...]:
    """The ``--pool`` / ``--unrelated`` specs that are the owner's files (the feature ranges' other sources)."""
    from stealkit.data import parse_source

    files = []
    for spec in (options.pool, options.unrelated):
        try:
            path = parse_source(spec).path
        except Exception:  # noqa: BLE001 - a bad spec is refused, with its flag, when the plan reads it
            continue
        if path is not None:
            files.append(str(path))
    return tuple(files)


def tabular_options(target: Target, options: AuditOptions) -> tuple[AuditOptions, list[str], FeatureRange | None]:
    """For a feature-vector victim: the options the audit runs (``--unrelated`` at its default becomes
    :data:`TABULAR_UNRELATED`), the plan's notes (the feature ranges, the unrelated data) and its feature ranges;
    else the options unchanged, no note and ``None``."""
    from stealkit.audit.parts import close

    v = target.open(mode="label", budget=0)
    close(v)
    if v.features is None:
        return options, [], None
    d = v.features.d
    notes = [f"a feature-vector victim ({d} features): every attacker works in [0, 1]^{d}, mapped onto each "
             f"feature's range ({v.features.source}; sha256 {v.features.digest[:12]}...); eps and norms are in "
             "those units"]
    if options.unrelated == DEFAULT_UNRELATED:
        options = dataclasses.replace(options, unrelated=TABULAR_UNRELATED)
        notes.append(f"--unrelated {DEFAULT_UNRELATED} (crops of photographs) is an image source: the unrelated "
                     f"attacker queries {TABULAR_UNRELATED} points of the feature ranges' box instead")
    return options, notes, v.features
