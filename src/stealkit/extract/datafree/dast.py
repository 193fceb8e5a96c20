"""DaST: data-free substitute training (Zhou, Wu, Liu, Liu & Zhu, CVPR 2020), DaST-L and DaST-P.

Sec. 3.2-3.4 (and the reference code ``dast.py``): a label-controllable generator (one branch per class into a
shared trunk, :class:`~stealkit.models.generators.DaSTGenerator`) synthesises a batch split evenly over the
classes; the victim answers it once; the substitute ``D`` takes one step on

    L_D = CE(D(x), T_label(x)) + beta * MSE(log softmax D(x), log T(x))

(``beta = 0``: DaST-L, labels only; ``beta > 0``: DaST-P, probabilities), then the generator takes one step on

    L_G = exp(-L_D(x)) + alpha * CE(D(x), branch label)

so it seeks samples the substitute still gets wrong (the imitation term) while each branch keeps producing its
own class (label control). As in the reference, ``alpha`` drops to the label-control loss once that falls
below 0.1. Adam (lr 1e-4, betas 0.5/0.999) for both; one victim query per sample: ``B`` per iteration.

The MSE is on log-probabilities, as the reference code computes it (the paper writes probabilities); the
victim's probabilities are floored at 1e-30 before the log. Unlike the reference CIFAR script, the generator's
optimiser is stepped.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.extract.datafree.attack import DataFreeAttack, QueryFn, check_positive
from stealkit.extract.datafree.loop import DataFreeResult, LoopConfig, run_datafree
from stealkit.extract.targets import answer_probs
from stealkit.metrics import Evaluator
from stealkit.models.generators import DaSTGenerator
from stealkit.oracle import Oracle, OutputMode
from stealkit.oracle.base import labels_from_answer


@dataclass(frozen=True)
class DaSTConfig:
    """DaST settings; defaults are the reference code's (``ngf`` is the generator width)."""

    batch_size: int = 500
    nz: int = 128
    ngf: int = 64
    lr: float = 1e-4
    betas: tuple[float, float] = (0.5, 0.999)
    alpha: float = 0.2
    beta: float = 0.1
    seed: int = 0
    loop: LoopConfig = field(default_factory=LoopConfig)

    def __post_init__(self) -> None:
        check_positive("DaST", batch_size=self.batch_size, nz=self.nz, ngf=self.ngf, lr=self.lr)
        if self.alpha < 0 or self.beta < 0:
            from stealkit.errors import InputError

            raise InputError(f"DaST: alpha and beta must be >= 0, got {self.alpha}, {self.beta}")


def dast_cost(config: DaSTConfig) -> int:
    """Victim queries per DaST iteration: one per generated sample, ``B``."""
    return config.batch_size


class DaSTAttack(DataFreeAttack):
    name = "dast"

    def __init__(self, *, input_shape: tuple[int, int, int], num_classes: int, mode: OutputMode,
                 make_student: Callable[[], nn.Module], config: DaSTConfig, device: str = "cpu") -> None:
        super().__init__(input_shape=input_shape, num_classes=num_classes, mode=mode, seed=config.seed,
                         device=device)
        if config.batch_size < 2 * num_classes:
            from stealkit.errors import InputError

            raise InputError(f"DaST needs a batch of at least 2 samples per class ({2 * num_classes}), "
                             f"got {config.batch_size}")
        self.config = config
        self.beta = 0.0 if self.mode is OutputMode.LABEL else config.beta  # DaST-L / DaST-P
        self.alpha = config.alpha
        self.student = make_student().to(device).train()
        torch.manual_seed(config.seed + 1)
        self.generator = DaSTGenerator(config.nz, num_classes, input_shape, ngf=config.ngf).to(device).train()
        adam = {"lr": config.lr, "betas": config.betas}
        self.optimizers = {
            "student": torch.optim.Adam(self.student.parameters(), **adam),
            "generator": torch.optim.Adam(self.generator.parameters(), **adam),
        }

    @property
    def variant(self) -> str:
        return "DaST-L" if self.beta == 0 else "DaST-P"

    def iteration_cost(self) -> int:
        return dast_cost(self.config)

    def imitation_loss(self, logits: torch.Tensor, labels: torch.Tensor, log_probs: torch.Tensor | None) -> torch.Tensor:
        loss = F.cross_entropy(logits, labels)
        if self.beta > 0 and log_probs is not None:
            loss = loss + self.beta * F.mse_loss(F.log_softmax(logits, 1), log_probs)
        return loss

    def step(self, query: QueryFn, progress: float) -> dict[str, float]:
        cfg = self.config
        branch = self.generator.sample_labels(cfg.batch_size, generator=self.rng)
        x = self.generator(self.noise(cfg.batch_size, cfg.nz), branch)
        answer = query(x.detach()).to(self.device)
        labels = labels_from_answer(answer, self.mode)
        log_probs = None
        if self.beta > 0:
            log_probs = answer_probs(answer, self.mode, self.num_classes).clamp_min(1e-30).log()
        # (1) substitute step on the detached batch
        loss_d = self.imitation_loss(self.student(x.detach()), labels, log_probs)
        self.optimizers["student"].zero_grad(set_to_none=True)
        loss_d.backward()
        self.optimizers["student"].step()
        # (2) generator step through the updated substitute
        out = self.student(x)
        imitate = torch.exp(-self.imitation_loss(out, labels, log_probs))
        control = F.cross_entropy(out, branch)
        loss_g = imitate + self.alpha * control
        self.optimizers["generator"].zero_grad(set_to_none=True)
        self.optimizers["student"].zero_grad(set_to_none=True)
        loss_g.backward()
        self.optimizers["generator"].step()
        if float(control.detach()) <= 0.1:
            self.alpha = float(control)
        return {"loss_substitute": float(loss_d.detach()), "loss_generator": float(loss_g.detach()),
                "loss_label_control": float(control.detach()), "alpha": self.alpha}

    def extra_scalars(self) -> dict[str, Any]:
        return {"alpha": self.alpha}

    def load_extra(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        self.alpha = float(scalars["alpha"])


def extract_dast(
    oracle: Oracle,
    *,
    make_student: Callable[[], nn.Module],
    evaluator: Evaluator | None,
    config: DaSTConfig,
    device: str = "cpu",
    checkpoint_dir: Any = None,
    resume: bool = False,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    on_losses: Callable[[dict[str, Any]], None] | None = None,
) -> DataFreeResult:
    """Steal ``oracle`` with DaST (DaST-L on a label oracle, DaST-P otherwise) until the budget runs out."""
    attack = DaSTAttack(input_shape=oracle.input_shape, num_classes=oracle.num_classes, mode=oracle.mode,
                        make_student=make_student, config=config, device=device)
    result = run_datafree(attack, oracle, evaluator=evaluator, loop=config.loop, checkpoint_dir=checkpoint_dir,
                          resume=resume, on_point=on_point, on_losses=on_losses, config=config)
    result.extra["variant"] = attack.variant
    return result
