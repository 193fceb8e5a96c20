"""Evasion attacks: gradient attacks on a (stolen) substitute, C&W, decision-based attacks on a label-only
oracle, expectation over transformation, and transfer evaluation on the victim."""

from __future__ import annotations

import importlib
from typing import Any

#: public name -> its module; imported on first use, so ``import stealkit.evade`` (and the CLI) stays cheap
_EXPORTS = {
    "AttackResult": "base", "Norm": "base", "TargetPolicy": "base", "choose_targets": "base", "flat_norms": "base",
    "project": "base", "EOTModel": "gradient_based.eot", "GradientAttackConfig": "gradient_based.gradient", "bim": "gradient_based.gradient", "fgsm": "gradient_based.gradient",
    "gradient_attack": "gradient_based.gradient", "mifgsm": "gradient_based.gradient", "pgd": "gradient_based.gradient",
}

__all__ = [
    "AttackResult",
    "EOTModel",
    "GradientAttackConfig",
    "Norm",
    "TargetPolicy",
    "bim",
    "choose_targets",
    "fgsm",
    "flat_norms",
    "gradient_attack",
    "mifgsm",
    "pgd",
    "project",
]


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'stealkit.evade' has no attribute {name!r}")
    return getattr(importlib.import_module(f"stealkit.evade.{_EXPORTS[name]}"), name)
