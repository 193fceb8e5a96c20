"""Evasion attacks: gradient attacks on a (stolen) substitute, C&W, decision-based attacks on a label-only
oracle, expectation over transformation, and transfer evaluation on the victim."""

from stealkit.evade.base import AttackResult, Norm, TargetPolicy, choose_targets, flat_norms, project
from stealkit.evade.eot import EOTModel
from stealkit.evade.gradient import GradientAttackConfig, bim, fgsm, gradient_attack, mifgsm, pgd

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
