"""MAZE: data-free model stealing with zeroth-order gradient estimation (Kariyappa, Prakash & Qureshi, CVPR 2021).

Sec. 3 (and the reference code ``attacks/maze.py``): each iteration takes ``n_G`` generator steps that
maximise KL(victim || clone) on generator samples, the gradient through the black-box victim estimated with
``m`` random directions (Sec. 3.2, Eq. 6; shared estimator :mod:`stealkit.extract.datafree.zoo_grad`); then ``n_C``
clone steps minimising that KL on generator samples, the first reusing the generator batch and the victim's
answers for it (already paid for in the estimate); then experience replay (Sec. 3.3): the last clone batch and
its answers join a buffer, and ``n_R`` more clone steps on batches drawn from it cost no queries.

Cost of one iteration: ``B * ((n_C - 1) + (m + 1) * n_G)`` victim queries. Optimisers: SGD (momentum 0.9,
wd 5e-4) for both, lr 0.1 (clone) and 1e-4 (generator), cosine annealing over the run.

Deviation, documented: the reference keeps every replayed batch forever; here the buffer holds at most
``replay_capacity`` samples (oldest dropped first) in float16, so memory and checkpoints stay bounded.

Label-only adaptation (not in the paper): as for DFME, the victim's label becomes the smoothed one-hot
``(1 - s) onehot + s / K`` and is used as its probability vector in every KL.

``objective="disagreement"`` (not in the paper; DisGUIDE's, :mod:`stealkit.extract.datafree.disguide`): ``students``
clones; the generator maximises their disagreement (plus ``diversity`` times the class-diversity term) with no
victim query, so every clone step queries a fresh batch and one iteration costs ``B * n_C``; the clones learn
by cross-entropy on labels (label mode) or the KL above, on answers and on replay. ``holdout`` sets that share
of every answered batch aside to choose the reported clone by held-out agreement
(:mod:`stealkit.extract.datafree.selection`: the most recent ``holdout_capacity`` held-out rows, no margin; CoDFe's
reservoir and margin made the reported clone lag here, by 4.6 points at 25k; docs/archive.md, "Data-free
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
from stealkit.extract.datafree.replay import ReplayBuffer
from stealkit.extract.datafree.schedules import cosine_factor, set_lr
from stealkit.extract.datafree.selection import MakeSelector
from stealkit.extract.datafree.zoo_grad import estimate_gradient
from stealkit.extract.targets import answer_probs
from stealkit.metrics import Evaluator
from stealkit.models.generators import UpsampleGenerator
from stealkit.oracle import Oracle, OutputMode


@dataclass(frozen=True)
class MAZEConfig:
    """MAZE settings; defaults are the reference code's (``replay_capacity`` is stealkit's bound)."""

    batch_size: int = 128
    directions: int = 10
    epsilon: float = 1e-3
    nz: int = 100
    ngf: int = 64
    clone_steps: int = 5
    generator_steps: int = 1
    replay_steps: int = 10
    replay_capacity: int = 100_000
    lr_clone: float = 0.1
    lr_generator: float = 1e-4
    momentum: float = 0.9
    weight_decay: float = 5e-4
    label_smoothing: float = 0.1
    objective: Literal["victim", "disagreement"] = "victim"
    students: int = 2
    diversity: float = 0.0
    holdout: float = 0.0
    holdout_capacity: int = 5000
    seed: int = 0
    loop: LoopConfig = field(default_factory=LoopConfig)

    def __post_init__(self) -> None:
        check_disguide("MAZE", self)
        check_positive("MAZE", batch_size=self.batch_size, directions=self.directions, epsilon=self.epsilon,
                       nz=self.nz, ngf=self.ngf, clone_steps=self.clone_steps,
                       generator_steps=self.generator_steps, replay_capacity=self.replay_capacity,
                       lr_clone=self.lr_clone, lr_generator=self.lr_generator)
        if self.replay_steps < 0:
            from stealkit.errors import InputError

            raise InputError(f"MAZE: replay_steps must be >= 0, got {self.replay_steps}")


def maze_cost(config: MAZEConfig) -> int:
    """Victim queries per MAZE iteration: ``B * ((n_C - 1) + (m + 1) * n_G)``; ``B * n_C`` with the
    disagreement objective."""
    if config.objective == "disagreement":
        return config.batch_size * config.clone_steps
    return config.batch_size * ((config.clone_steps - 1) + (config.directions + 1) * config.generator_steps)


def kl_victim_clone(clone_logits: torch.Tensor, victim_probs: torch.Tensor) -> torch.Tensor:
    """Per-sample KL(victim || clone) ``[B]``."""
    return F.kl_div(F.log_softmax(clone_logits, 1), victim_probs, reduction="none").sum(dim=1)


class MAZEAttack(CommitteeAttack):
    name = "maze"

    def __init__(self, *, input_shape: tuple[int, int, int], num_classes: int, mode: OutputMode,
                 make_student: Callable[[], nn.Module], config: MAZEConfig, device: str = "cpu",
                 make_selector: MakeSelector | None = None) -> None:
        super().__init__(input_shape=input_shape, num_classes=num_classes, mode=mode, seed=config.seed,
                         device=device)
        if config.objective == "victim":
            needs_probabilities("MAZE", self.mode, config.label_smoothing)
        self.config = config
        self.student = make_student().to(device).train()
        sgd = {"momentum": config.momentum, "weight_decay": config.weight_decay}

        def clone_sgd(m: nn.Module) -> torch.optim.Optimizer:
            return torch.optim.SGD(m.parameters(), lr=config.lr_clone, **sgd)

        self.committee = Committee(self.student, make_student, config.students if config.objective ==
                                   "disagreement" else 1, config.seed, clone_sgd, device)
        self.selector = (self.held_out_selector(make_student(), make_selector, config.holdout_capacity)
                         if config.holdout > 0 else None)
        torch.manual_seed(config.seed + 1)
        self.generator = UpsampleGenerator(config.nz, input_shape, ngf=config.ngf).to(device).train()
        self.optimizers = {
            "student": clone_sgd(self.student), **self.committee.optimizers,
            "generator": torch.optim.SGD(self.generator.parameters(), lr=config.lr_generator, **sgd),
        }
        self.replay = ReplayBuffer(config.replay_capacity, input_shape, num_classes)

    def iteration_cost(self) -> int:
        return maze_cost(self.config)

    def probs(self, answer: torch.Tensor) -> torch.Tensor:
        return answer_probs(answer.to(self.device), self.mode, self.num_classes,
                            smoothing=self.config.label_smoothing)

    def _clone_step(self, x: torch.Tensor, p: torch.Tensor) -> float:
        """One step of every clone on ``(x, p)``; returns the first clone's loss. With the disagreement
        objective on labels, the cross-entropy on the label (``p`` holds one-hot rows then)."""
        hard = self.config.objective == "disagreement" and self.mode is OutputMode.LABEL
        out = 0.0
        for name, clone in self.committee.named().items():
            loss = F.cross_entropy(clone(x), p.argmax(1)) if hard else kl_victim_clone(clone(x), p).mean()
            self.optimizers[name].zero_grad(set_to_none=True)
            loss.backward()
            self.optimizers[name].step()
            out = float(loss.detach()) if name == "student" else out
        return out

    def _answered(self, query: QueryFn) -> tuple[torch.Tensor, torch.Tensor]:
        """A fresh generator batch and the victim's answers as probabilities, less the held-out share."""
        with torch.no_grad():
            x = self.generator(self.noise(self.config.batch_size, self.config.nz))
        answer = query(x).to(self.device)
        if self.config.objective == "disagreement" and self.mode is OutputMode.LABEL:
            p = answer_probs(answer, self.mode, self.num_classes)  # one-hot: no smoothing needed
        else:
            p = self.probs(answer)
        return self.hold_out(x, p, self.config.holdout)

    def _disagreement_step(self, query: QueryFn) -> dict[str, float]:
        cfg = self.config
        g_losses = self.generator_steps(cfg.generator_steps, cfg.batch_size, cfg.nz, cfg.diversity)
        c_losses = []
        for _ in range(cfg.clone_steps):
            x, p = self._answered(query)
            c_losses.append(self._clone_step(x, p))
        self.replay.add(x, p)
        r_losses = [self._clone_step(*self.replay.sample(cfg.batch_size, self.rng, self.device))
                    for _ in range(cfg.replay_steps if len(self.replay) >= cfg.batch_size else 0)]
        out = {"loss_generator": sum(g_losses) / len(g_losses), "loss_clone": sum(c_losses) / len(c_losses)}
        if r_losses:
            out["loss_replay"] = sum(r_losses) / len(r_losses)
        return self.select(out)

    def step(self, query: QueryFn, progress: float) -> dict[str, float]:
        cfg = self.config
        factor = cosine_factor(progress)
        for name in self.optimizers:
            set_lr(self.optimizers[name], (cfg.lr_generator if name == "generator" else cfg.lr_clone) * factor)
        if cfg.objective == "disagreement":
            return self._disagreement_step(query)
        g_losses = []
        est = None
        for _ in range(cfg.generator_steps):
            x_pre = self.generator(self.noise(cfg.batch_size, cfg.nz), pre_x=True)

            def neg_kl(px: torch.Tensor, ans: torch.Tensor) -> torch.Tensor:
                return -kl_victim_clone(self.student(px), self.probs(ans))

            est = estimate_gradient(x_pre, neg_kl, query, directions=cfg.directions, epsilon=cfg.epsilon,
                                    generator=self.rng)
            self.optimizers["generator"].zero_grad(set_to_none=True)
            x_pre.backward(est.grad)
            self.optimizers["generator"].step()
            g_losses.append(est.loss)
        assert est is not None
        c_losses = []
        x, p = est.base_pixels.detach(), self.probs(est.base_answers)  # first clone step: already paid for
        for c in range(cfg.clone_steps):
            if c > 0:
                with torch.no_grad():
                    x = self.generator(self.noise(cfg.batch_size, cfg.nz))
                p = self.probs(query(x))
            c_losses.append(self._clone_step(x, p))
        self.replay.add(x, p)
        r_losses = []
        for _ in range(cfg.replay_steps if len(self.replay) >= cfg.batch_size else 0):
            r_losses.append(self._clone_step(*self.replay.sample(cfg.batch_size, self.rng, self.device)))
        out = {"loss_generator": sum(g_losses) / len(g_losses), "loss_clone": sum(c_losses) / len(c_losses)}
        if r_losses:
            out["loss_replay"] = sum(r_losses) / len(r_losses)
        return out

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return self.replay.tensors() | super().extra_tensors()

    def extra_scalars(self) -> dict[str, Any]:
        return self.replay.scalars() | super().extra_scalars()

    def load_extra(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        self.replay.load(tensors, scalars)
        super().load_extra(tensors, scalars)


def extract_maze(
    oracle: Oracle,
    *,
    make_student: Callable[[], nn.Module],
    evaluator: Evaluator | None,
    config: MAZEConfig,
    device: str = "cpu",
    checkpoint_dir: Any = None,
    resume: bool = False,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    on_losses: Callable[[dict[str, Any]], None] | None = None,
    make_selector: MakeSelector | None = None,
) -> DataFreeResult:
    """Steal ``oracle`` with MAZE until its budget cannot pay for another iteration (see the module doc)."""
    attack = MAZEAttack(input_shape=oracle.input_shape, num_classes=oracle.num_classes, mode=oracle.mode,
                        make_student=make_student, config=config, device=device,
                        make_selector=make_selector)
    return run_datafree(attack, oracle, evaluator=evaluator, loop=config.loop, checkpoint_dir=checkpoint_dir,
                        resume=resume, on_point=on_point, on_losses=on_losses, config=config)
