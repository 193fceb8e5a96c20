"""Named recipes for the data-free methods: which settings ``extract codfe|dfme|maze`` use with no options.

``paper`` is each paper's (or reference code's) exact settings: the dataclass defaults, nothing overridden;
the studies and ``stealkit reproduce`` use it. ``labelonly-v1`` is the recipe chosen on a validation split
(digits' attacker split, which the attack never sees; the test split only reports), per method and per
access mode (``label``, or ``probs`` for every mode that returns scores); how each value was chosen, and the
runs behind it, are in ``docs/label-only.md``. The commands write the recipe's name into ``config.json``.
"""

from __future__ import annotations

from typing import Any

from stealkit.errors import InputError

PAPER = "paper"
VALIDATED = "labelonly-v1"
#: the recipe a command uses when none is named
DEFAULT = VALIDATED

_CODFE_COMMON: dict[str, Any] = {}

RECIPES: dict[str, dict[str, dict[str, dict[str, Any]]]] = {
    PAPER: {},
    VALIDATED: {
        "codfe": {"label": dict(_CODFE_COMMON), "probs": dict(_CODFE_COMMON)},
    },
}


def recipe_settings(name: str, method: str, mode: str) -> dict[str, Any]:
    """The settings recipe ``name`` gives ``method`` under output ``mode`` (``{}``: the dataclass defaults)."""
    if name not in RECIPES:
        raise InputError(f"unknown recipe {name!r}; expected one of {sorted(RECIPES)}")
    access = "label" if str(getattr(mode, "value", mode)) == "label" else "probs"
    return dict(RECIPES[name].get(method, {}).get(access, {}))
