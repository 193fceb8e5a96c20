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

#: CoDFe (one clone: DisGUIDE's second clone did not help on the validation split) with the class-balance
#: term, replay, CaBaGE-style balanced filtering (2x candidates) and hard-sample replay, fresh noise every
#: round, 6x the substitute steps per query at 3x the learning rate, and held-out selection with an EMA
_CODFE: dict[str, Any] = {
    "noise_set": 500, "substitute_iterations": 150, "lr_substitute": 3e-3, "diversity": 1.0,
    "replay_capacity": 100_000, "fresh_noise": True, "candidates": 2, "hard_replay": 0.5, "ema": 0.99,
    "holdout": 0.1,
}
#: DFME / MAZE: DisGUIDE's objective instead of the zeroth-order estimate through the victim (both modes)
_DISAGREEMENT: dict[str, Any] = {"objective": "disagreement", "diversity": 1.0, "holdout": 0.05}

RECIPES: dict[str, dict[str, dict[str, dict[str, Any]]]] = {
    PAPER: {},
    VALIDATED: {
        "codfe": {"label": dict(_CODFE), "probs": dict(_CODFE)},
        "dfme": {"label": dict(_DISAGREEMENT), "probs": dict(_DISAGREEMENT)},
        "maze": {"label": dict(_DISAGREEMENT), "probs": dict(_DISAGREEMENT)},
    },
}


def recipe_settings(name: str, method: str, mode: str) -> dict[str, Any]:
    """The settings recipe ``name`` gives ``method`` under output ``mode`` (``{}``: the dataclass defaults)."""
    if name not in RECIPES:
        raise InputError(f"unknown recipe {name!r}; expected one of {sorted(RECIPES)}")
    access = "label" if str(getattr(mode, "value", mode)) == "label" else "probs"
    return dict(RECIPES[name].get(method, {}).get(access, {}))
