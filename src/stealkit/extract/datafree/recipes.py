"""Named recipes for the data-free methods: which settings ``extract codfe|dfme|maze`` use with no options.

Two recipes. ``paper`` is each paper's (or reference code's) exact settings: the dataclass defaults, nothing
overridden; the studies and ``stealkit reproduce`` use it. The default, named ``labelonly-v3`` (the name
``config.json`` has recorded since it was chosen), was chosen on a validation split (digits' attacker split,
which the attack never sees; the test split only reports), per method and per access mode (``label``, or
``probs`` for every mode that returns scores), with the generator and student sizes it was validated at, by the
victim's input size (:func:`recipe_sizes`). Why each piece is there: docs/guide/datafree.md, "The default and why";
what it measured: docs/results.md#datafree-labelonly; the recipes it replaced: docs/archive.md. The commands write the recipe's name, and the sizes it gave, into ``config.json``.
"""

from __future__ import annotations

from typing import Any

from stealkit.errors import InputError

PAPER = "paper"
#: the default recipe's name (its third validated version; the earlier two were superseded)
VALIDATED = "labelonly-v3"
#: the recipe a command uses when none is named
DEFAULT = VALIDATED

#: CoDFe with the class-balance term, replay, CaBaGE-style balanced filtering (2x candidates) and hard-sample
#: replay, fresh noise every round, 6x the substitute steps per query at 3x the learning rate annealed (cosine)
#: over the planned budget, and held-out selection (a reservoir over every round, margin 2 standard errors)
#: between the student and its EMA
_CODFE: dict[str, Any] = {
    "noise_set": 500, "substitute_iterations": 150, "lr_substitute": 3e-3, "diversity": 1.0,
    "replay_capacity": 100_000, "fresh_noise": True, "candidates": 2, "hard_replay": 0.5, "ema": 0.99,
    "holdout": 0.1, "holdout_capacity": 5000, "selection_margin": 2.0, "substitute_schedule": "cosine",
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

#: the largest input side (pixels) the small sizes were validated on: digits' 8x8
SMALL_SIDE = 8
#: the sizes the default recipe was validated at on 8x8 digits (docs/results.md#datafree-labelonly; benchmarks/data_free.py
#: --preset cpu): generator width 16, conv2 student 16/32/64. Larger inputs keep the commands' own sizes (ngf 64,
#: conv2 32/64/128) until the recipe is validated there (no GPU run of it yet: docs/guide/datafree.md, "Caveats").
SMALL_SIZES: dict[str, Any] = {"ngf": 16, "student_kwargs": {"c1": 16, "c2": 32, "hidden": 64}}


def recipe_settings(name: str, method: str, mode: str) -> dict[str, Any]:
    """The settings recipe ``name`` gives ``method`` under output ``mode`` (``{}``: the dataclass defaults)."""
    if name not in RECIPES:
        raise InputError(f"unknown recipe {name!r}; expected one of {sorted(RECIPES)}")
    access = "label" if str(getattr(mode, "value", mode)) == "label" else "probs"
    return dict(RECIPES[name].get(method, {}).get(access, {}))


def recipe_sizes(name: str, method: str, input_shape: tuple[int, ...], student: str) -> dict[str, Any]:
    """The generator width (``ngf``) and student widths (``student_kwargs``, conv2 only) recipe ``name``
    gives ``method`` on inputs of ``input_shape`` (C, H, W); ``{}``: the commands' own sizes."""
    recipe_settings(name, method, "label")  # an unknown recipe is a clear error
    if name != VALIDATED or method not in RECIPES[name] or max(input_shape[1:]) > SMALL_SIDE:
        return {}
    sizes: dict[str, Any] = {"ngf": SMALL_SIZES["ngf"]}
    if student == "conv2":
        sizes["student_kwargs"] = dict(SMALL_SIZES["student_kwargs"])
    return sizes
