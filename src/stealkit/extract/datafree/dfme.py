"""DFME: data-free model extraction (Truong, Maini, Walls & Papernot, CVPR 2021).

Main paper Sec. 3 (as implemented by the reference code, see the reference-code notes, ``shared/reference/official-code-notes.md`` of the project):
a generator ``G`` (DFAD's upsampling generator) synthesises the queries; each iteration takes ``n_G``
generator steps that *maximise* the student-victim disagreement, its gradient through the black-box victim
estimated by forward differences (Sec. 3.3; :mod:`stealkit.extract.datafree.zoo_grad`), then ``n_S`` student steps
that minimise it on fresh generator samples. The disagreement is the l1 distance between the student's logits
and the victim's logits (Sec. 3.2), recovered from probabilities as ``log p - mean(log p)`` (appendix B, Eq.
8-9) or taken raw when the oracle returns logits; KL divergence is the option the paper compares it with.

Cost of one iteration (the reference's): ``B * (n_G * (m + 1) + n_S)`` victim queries. Schedules: student
SGD (lr 0.1, momentum 0.9, wd 5e-4), generator Adam (lr 1e-4), both x0.3 at 10/30/50% of the run.

Label-only adaptation (not in the paper): the victim's label is turned into a smoothed one-hot vector
``(1 - s) onehot + s / K`` and treated as its probabilities, so the logit recovery gives the label's class a
margin ``log((1 - s + s/K) / (s/K))`` over the others; the forward differences then only see label flips.
This is weak by construction (most finite differences are exactly zero) and is measured, not assumed.

``objective="disagreement"`` (not in the paper; DisGUIDE's, :mod:`stealkit.extract.datafree.disguide`, which its
authors built on DFME's code): ``students`` clones, the generator maximises their disagreement (plus
``diversity`` times the class-diversity term) with no victim query, and the clones learn by cross-entropy on
the victim's labels (label mode) or DFME's l1/KL (scores). One iteration then costs ``B * n_S``. ``holdout``
sets that share of every answered batch aside to choose the reported clone by held-out agreement
(:mod:`stealkit.extract.datafree.selection`: the most recent ``holdout_capacity`` held-out rows, no margin; CoDFe's
reservoir and margin made the reported clone lag here, by 3.1 points at 100k; docs/archive.md, "Data-free
extraction"), or by the caller's own
:class:`~stealkit.extract.datafree.selection.Selector` (``make_selector``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.extract.datafree.attack import QueryFn, check_positive, needs_probabilities
from stealkit.extract.datafree.disguide import Committee, CommitteeAttack, check_disguide
from stealkit.extract.datafree.loop import DataFreeResult, LoopConfig, run_datafree
from stealkit.extract.datafree.schedules import multistep_factor, set_lr
from stealkit.extract.datafree.selection import MakeSelector
from stealkit.extract.datafree.zoo_grad import estimate_gradient
from stealkit.extract.targets import answer_logits, answer_probs
from stealkit.metrics import Evaluator
from stealkit.models.generators import UpsampleGenerator
from stealkit.oracle import Oracle, OutputMode


@dataclass(frozen=True)
class DFMEConfig:
    """DFME settings; defaults are the reference code's. One deviation: the zeroth-order estimate is not divided by
    the class count as the reference's is (Adam's step ignores the scale); what they reach:
    docs/results.md#datafree-fmnist-test."""

    batch_size: int = 256
    directions: int = 1
    epsilon: float = 1e-3
    nz: int = 256
    ngf: int = 64
    student_steps: int = 5
    generator_steps: int = 1
    loss: Literal["l1", "kl"] = "l1"
    lr_student: float = 0.1
    lr_generator: float = 1e-4
    momentum: float = 0.9
    weight_decay: float = 5e-4
    milestones: tuple[float, ...] = (0.1, 0.3, 0.5)
    gamma: float = 0.3
    label_smoothing: float = 0.1
    objective: Literal["victim", "disagreement"] = "victim"
    students: int = 2
    diversity: float = 0.0
    holdout: float = 0.0
    holdout_capacity: int = 5000
    seed: int = 0
    loop: LoopConfig = field(default_factory=LoopConfig)

    def __post_init__(self) -> None:
        check_disguide("DFME", self)
        check_positive("DFME", batch_size=self.batch_size, directions=self.directions, epsilon=self.epsilon,
                       nz=self.nz, ngf=self.ngf, student_steps=self.student_steps,
                       generator_steps=self.generator_steps, lr_student=self.lr_student,
                       lr_generator=self.lr_generator)
        if self.loss not in ("l1", "kl"):
            from stealkit.errors import InputError

            raise InputError(f"DFME loss must be 'l1' or 'kl', got {self.loss!r}")


def dfme_cost(config: DFMEConfig) -> int:
    """Victim queries per DFME iteration: ``B * (n_G * (m + 1) + n_S)``; ``B * n_S`` with the disagreement
    objective (the generator queries nothing)."""
    if config.objective == "disagreement":
        return config.batch_size * config.student_steps
    return config.batch_size * (config.generator_steps * (config.directions + 1) + config.student_steps)


class DFMEAttack(CommitteeAttack):
    name = "dfme"

    def __init__(self, *, input_shape: tuple[int, int, int], num_classes: int, mode: OutputMode,
                 make_student: Callable[[], nn.Module], config: DFMEConfig, device: str = "cpu",
                 make_selector: MakeSelector | None = None) -> None:
        super().__init__(input_shape=input_shape, num_classes=num_classes, mode=mode, seed=config.seed,
                         device=device)
        if config.objective == "victim":
            needs_probabilities("DFME", self.mode, config.label_smoothing)
        self.config = config
        self.student = make_student().to(device).train()

        def sgd(m: nn.Module) -> torch.optim.Optimizer:
            return torch.optim.SGD(m.parameters(), lr=config.lr_student, momentum=config.momentum,
                                   weight_decay=config.weight_decay)

        self.committee = Committee(self.student, make_student, config.students if config.objective ==
                                   "disagreement" else 1, config.seed, sgd, device)
        self.selector = (self.held_out_selector(make_student(), make_selector, config.holdout_capacity)
                         if config.holdout > 0 else None)
        torch.manual_seed(config.seed + 1)
        self.generator = UpsampleGenerator(config.nz, input_shape, ngf=config.ngf).to(device).train()
        self.optimizers = {
            "student": sgd(self.student), **self.committee.optimizers,
            "generator": torch.optim.Adam(self.generator.parameters(), lr=config.lr_generator),
        }

    def iteration_cost(self) -> int:
        return dfme_cost(self.config)

    def victim_logits(self, answer: torch.Tensor) -> torch.Tensor:
        return answer_logits(answer, self.mode, self.num_classes, smoothing=self.config.label_smoothing)

    def disagreement(self, student_logits: torch.Tensor, victim_logits: torch.Tensor) -> torch.Tensor:
        """Per-sample loss ``[B]``: mean l1 over classes, or KL(victim || student)."""
        if self.config.loss == "l1":
            return (student_logits - victim_logits).abs().mean(dim=1)
        return F.kl_div(F.log_softmax(student_logits, 1), F.log_softmax(victim_logits, 1), reduction="none",
                        log_target=True).sum(dim=1)

    def _disagreement_step(self, query: QueryFn) -> dict[str, float]:
        """DisGUIDE's iteration (module docstring): generator on the clones' disagreement, clones on answers."""
        cfg = self.config
        g_losses = self.generator_steps(cfg.generator_steps, cfg.batch_size, cfg.nz, cfg.diversity)
        s_losses = []
        for _ in range(cfg.student_steps):
            with torch.no_grad():
                x = self.generator(self.noise(cfg.batch_size, cfg.nz))
            answer = query(x).to(self.device)
            if self.selector is not None:
                _, kept = self.hold_out(x, answer_probs(answer, self.mode, self.num_classes), cfg.holdout)
                x, answer = x[-kept.shape[0]:], answer[-kept.shape[0]:]
            for name, clone in self.committee.named().items():
                if self.mode is OutputMode.LABEL:
                    loss = F.cross_entropy(clone(x), answer.long())
                else:
                    loss = self.disagreement(clone(x), self.victim_logits(answer)).mean()
                self.optimizers[name].zero_grad(set_to_none=True)
                loss.backward()
                self.optimizers[name].step()
                if name == "student":
                    s_losses.append(float(loss.detach()))
        return self.select({"loss_generator": sum(g_losses) / len(g_losses),
                            "loss_student": sum(s_losses) / len(s_losses)})

    def step(self, query: QueryFn, progress: float) -> dict[str, float]:
        cfg = self.config
        factor = multistep_factor(progress, cfg.milestones, cfg.gamma)
        for name in self.optimizers:
            set_lr(self.optimizers[name], (cfg.lr_generator if name == "generator" else cfg.lr_student) * factor)
        if cfg.objective == "disagreement":
            return self._disagreement_step(query)
        g_losses = []
        for _ in range(cfg.generator_steps):
            x_pre = self.generator(self.noise(cfg.batch_size, cfg.nz), pre_x=True)

            def neg_disagreement(px: torch.Tensor, ans: torch.Tensor) -> torch.Tensor:
                return -self.disagreement(self.student(px), self.victim_logits(ans))

            est = estimate_gradient(x_pre, neg_disagreement, query, directions=cfg.directions,
                                    epsilon=cfg.epsilon, generator=self.rng)
            self.optimizers["generator"].zero_grad(set_to_none=True)
            x_pre.backward(est.grad)
            self.optimizers["generator"].step()
            g_losses.append(est.loss)
        s_losses = []
        for _ in range(cfg.student_steps):
            with torch.no_grad():
                x = self.generator(self.noise(cfg.batch_size, cfg.nz))
            target = self.victim_logits(query(x).to(self.device))
            loss = self.disagreement(self.student(x), target).mean()
            self.optimizers["student"].zero_grad(set_to_none=True)
            loss.backward()
            self.optimizers["student"].step()
            s_losses.append(float(loss.detach()))
        return {"loss_generator": sum(g_losses) / len(g_losses), "loss_student": sum(s_losses) / len(s_losses)}


def extract_dfme(
    oracle: Oracle,
    *,
    make_student: Callable[[], nn.Module],
    evaluator: Evaluator | None,
    config: DFMEConfig,
    device: str = "cpu",
    checkpoint_dir: Any = None,
    resume: bool = False,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    on_losses: Callable[[dict[str, Any]], None] | None = None,
    make_selector: MakeSelector | None = None,
) -> DataFreeResult:
    """Steal ``oracle`` with DFME until its budget cannot pay for another iteration (see the module doc)."""
    attack = DFMEAttack(input_shape=oracle.input_shape, num_classes=oracle.num_classes, mode=oracle.mode,
                        make_student=make_student, config=config, device=device,
                        make_selector=make_selector)
    return run_datafree(attack, oracle, evaluator=evaluator, loop=config.loop, checkpoint_dir=checkpoint_dir,
                        resume=resume, on_point=on_point, on_losses=on_losses, config=config)
