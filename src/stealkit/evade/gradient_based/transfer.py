"""Transfer attacks: craft adversarial examples on a stolen substitute, send them to the victim's oracle.

CoDFe's attacking process (Sec. 3.1, Fig. 1 and Sec. 4.1 "Evaluation criteria"): the substitute S stands in
for the black-box target T; gradient attacks (FGSM, BIM, PGD; also MI-FGSM and C&W here) run on S, and the
adversarial examples are sent to T. The attack success rate is ``n_suc / n_all``: over the examples T
classifies correctly (untargeted) -- and, for targeted attacks, whose label is not already the target -- the
fraction T misclassifies (untargeted) or assigns the target (targeted). The paper targets "the second class"
(class index 1) on every data set; random and least-likely targets are offered too
(:class:`~stealkit.evade.base.TargetPolicy`).

Every victim answer goes through the oracle, so a local model and an HTTP API are evaluated the same way and
the queries reported (clean predictions, to know which examples T gets right, plus one per adversarial
example sent) are the ledger's counts.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from enum import StrEnum
from typing import Any

import numpy as np
import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.evade.base import AttackResult, Norm, TargetPolicy, check_batch, choose_targets
from stealkit.evade.gradient_based.cw import carlini_wagner_l2
from stealkit.evade.gradient_based.gradient import GradientAttackConfig, frozen, gradient_attack
from stealkit.oracle import Oracle, labels_from_answer

#: CoDFe's transfer evaluation (DaST's public script): its untargeted PGD, L-inf eps 0.25, 6 steps of 0.03
#: (:class:`stealkit.studies.codfe_transfer.StudyConfig` reads its defaults from here)
CODFE_PGD: dict[str, float] = {"eps": 0.25, "steps": 6, "step": 0.03}


class AttackMethod(StrEnum):
    FGSM = "fgsm"
    BIM = "bim"
    PGD = "pgd"
    MIFGSM = "mifgsm"
    CW = "cw"

    @classmethod
    def parse(cls, value: str | AttackMethod) -> AttackMethod:
        if isinstance(value, AttackMethod):
            return value
        try:
            return cls(str(value).lower().replace("-", ""))
        except ValueError:
            raise InputError(f"unknown attack {value!r}; expected one of {[m.value for m in cls]}") from None


@dataclass(frozen=True)
class TransferConfig:
    """What to craft on the substitute. ``step=None``: ``eps`` for FGSM, ``eps / steps`` for MI-FGSM,
    ``2.5 eps / steps`` for BIM and PGD. ``targeted=None``: untargeted. C&W ignores ``eps``/``norm`` and uses
    ``steps`` as its iterations per binary-search round and ``kappa`` as its confidence."""

    method: AttackMethod
    eps: float
    steps: int = 10
    step: float | None = None
    norm: Norm = Norm.LINF
    targeted: TargetPolicy | None = None
    restarts: int = 1
    kappa: float = 0.0
    seed: int = 0
    batch_size: int = 256
    query_batch: int = 256

    def __post_init__(self) -> None:
        object.__setattr__(self, "method", AttackMethod.parse(self.method))
        object.__setattr__(self, "norm", Norm.parse(self.norm))
        if self.targeted is not None:
            object.__setattr__(self, "targeted", TargetPolicy.parse(self.targeted))
        if not (math.isfinite(self.eps) and self.eps >= 0):
            raise InputError(f"eps must be a finite number >= 0, got {self.eps!r}")
        if self.steps < 1 or self.restarts < 1:
            raise InputError("steps and restarts must be positive integers")

    def gradient_config(self) -> GradientAttackConfig:
        m, eps, steps = self.method, self.eps, self.steps
        if m is AttackMethod.FGSM:
            step, steps = eps, 1
        elif self.step is not None:
            step = self.step
        else:
            step = eps / steps if m is AttackMethod.MIFGSM else 2.5 * eps / steps
        return GradientAttackConfig(
            eps=eps, step=step, steps=steps, norm=self.norm, random_start=m is AttackMethod.PGD,
            restarts=self.restarts if m is AttackMethod.PGD else 1,
            momentum=1.0 if m is AttackMethod.MIFGSM else None, targeted=self.targeted is not None,
            seed=self.seed, batch_size=self.batch_size)


def craft(substitute: nn.Module, x: torch.Tensor, y: torch.Tensor, config: TransferConfig,
          target: torch.Tensor | None = None) -> AttackResult:
    """Run ``config.method`` on the substitute (white-box)."""
    if config.method is AttackMethod.CW:
        return carlini_wagner_l2(substitute, x, y, targeted=target is not None, target=target, kappa=config.kappa,
                                 steps=config.steps, batch_size=config.batch_size)
    return gradient_attack(substitute, x, y, config.gradient_config(), target=target)


@dataclass
class TransferResult:
    """Outcome on the victim. ``asr = successes / attempts``; ``victim_queries`` are the ledger's counts spent
    by this evaluation (clean + adversarial)."""

    config: TransferConfig
    asr: float | None
    attempts: int
    successes: int
    victim_queries: dict[str, int]
    clean_queries: int
    adversarial_queries: int
    victim_accuracy: float
    substitute_accuracy: float
    substitute_agreement: float
    substitute_success_rate: float | None
    mean_norm: float | None
    x: torch.Tensor
    x_adv: torch.Tensor
    y: torch.Tensor
    target: torch.Tensor
    attempted: torch.Tensor
    success: torch.Tensor
    victim_clean: torch.Tensor
    victim_adv: torch.Tensor

    def summary(self) -> dict[str, Any]:
        cfg = asdict(self.config)
        return {
            "method": self.config.method.value,
            "targeted": self.config.targeted.value if self.config.targeted is not None else None,
            "asr": self.asr,
            "attempts": self.attempts,
            "successes": self.successes,
            "victim_queries": self.victim_queries,
            "queries": self.victim_queries,
            "clean_queries": self.clean_queries,
            "adversarial_queries": self.adversarial_queries,
            "n": int(self.x.shape[0]),
            "victim_accuracy": self.victim_accuracy,
            "substitute_accuracy": self.substitute_accuracy,
            "substitute_agreement": self.substitute_agreement,
            "substitute_success_rate": self.substitute_success_rate,
            "mean_norm": self.mean_norm,
            "attack": {k: (v.value if isinstance(v, StrEnum) else v) for k, v in cfg.items()},
        }

    def arrays(self) -> dict[str, np.ndarray]:
        """What ``adversarial.npz`` holds (``target``, ``victim_adv`` are -1 where not applicable)."""
        return {"x": self.x.cpu().numpy(), "x_adv": self.x_adv.cpu().numpy(), "y": self.y.cpu().numpy(),
                "target": self.target.cpu().numpy(), "attempted": self.attempted.cpu().numpy(),
                "success": self.success.cpu().numpy(), "victim_clean": self.victim_clean.cpu().numpy(),
                "victim_adv": self.victim_adv.cpu().numpy()}


def _ask(oracle: Oracle, x: torch.Tensor, batch: int) -> torch.Tensor:
    out = [labels_from_answer(oracle.query(x[i : i + batch]), oracle.mode) for i in range(0, x.shape[0], batch)]
    return torch.cat(out).long().cpu() if out else torch.empty(0, dtype=torch.long)


def transfer_attack(substitute: nn.Module, oracle: Oracle, x: torch.Tensor, y: torch.Tensor,
                    config: TransferConfig) -> TransferResult:
    """Craft on ``substitute``, evaluate through ``oracle`` (see the module docstring).

    Costs ``len(x)`` clean queries plus one per attempt; raises
    :class:`~stealkit.errors.BudgetExhausted` (nothing wasted) if the oracle's budget cannot pay.
    """
    x, y = check_batch(x, y)
    if tuple(x.shape[1:]) != tuple(oracle.input_shape):
        raise InputError(f"images of shape {list(x.shape[1:])} do not fit the victim's {list(oracle.input_shape)}")
    left = oracle.ledger.remaining()
    if left is not None and left < x.shape[0]:
        raise InputError(f"the victim's budget ({left} queries left) cannot even classify the {x.shape[0]} clean "
                         "images; lower --n or raise the budget")
    y = y.cpu()
    counts0 = oracle.ledger.as_dict()
    start = oracle.ledger.total
    victim_clean = _ask(oracle, x, config.query_batch)
    clean_queries = oracle.ledger.total - start
    with frozen(substitute), torch.no_grad():
        sub_logits = torch.cat([substitute(x[i : i + 1024]).float().cpu() for i in range(0, x.shape[0], 1024)])
    sub_labels = sub_logits.argmax(1)
    k = int(sub_logits.shape[1])
    if config.targeted is not None:
        target = choose_targets(config.targeted, y, k, substitute_logits=sub_logits, seed=config.seed)
        attempted = (victim_clean == y) & (target != y)
    else:
        target = torch.full_like(y, -1)
        attempted = victim_clean == y
    idx = attempted.nonzero().squeeze(1)
    x_adv = x.clone()
    victim_adv = torch.full_like(y, -1)
    success = torch.zeros_like(attempted)
    sub_rate = norm_mean = None
    if idx.numel():
        res = craft(substitute, x[idx], y[idx], config, target[idx] if config.targeted is not None else None)
        x_adv[idx] = res.x_adv
        sub_rate, norm_mean = res.success_rate, float(res.norms.mean())
        start_adv = oracle.ledger.total
        victim_adv[idx] = _ask(oracle, res.x_adv, config.query_batch)
        adversarial_queries = oracle.ledger.total - start_adv
        hit = victim_adv[idx] == target[idx] if config.targeted is not None else victim_adv[idx] != y[idx]
        success[idx] = hit
    else:
        adversarial_queries = 0
    attempts, successes = int(idx.numel()), int(success.sum())
    return TransferResult(
        config=config, asr=successes / attempts if attempts else None, attempts=attempts, successes=successes,
        victim_queries={k: v - counts0.get(k, 0) for k, v in oracle.ledger.as_dict().items()},
        clean_queries=clean_queries,
        adversarial_queries=adversarial_queries, victim_accuracy=float((victim_clean == y).float().mean()),
        substitute_accuracy=float((sub_labels == y).float().mean()),
        substitute_agreement=float((sub_labels == victim_clean).float().mean()), substitute_success_rate=sub_rate,
        mean_norm=norm_mean, x=x.cpu(), x_adv=x_adv.cpu(), y=y, target=target, attempted=attempted,
        success=success, victim_clean=victim_clean, victim_adv=victim_adv)
