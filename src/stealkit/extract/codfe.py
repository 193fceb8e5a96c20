"""CoDFe: confident data-free model stealing (ICLR 2022 submission, later MEGA), CoDFe-L and CoDFe-P.

Sec. 3.2 and Algorithm 1: a noise set ``Z = {z_1..z_M}`` is drawn once and reused in every round. Each round

1. generates ``X = G(Z)`` and queries the victim once for all of it (``M`` queries per round);
2. trains the substitute ``S`` for ``substitute_iterations`` mini-batch steps on ``(X, T(X))`` with the cross
   entropy of Eq. 1, ``-1/M sum_i sum_j T_j(x_i) log S_j(x_i)``: one-hot labels for CoDFe-L, the victim's
   probabilities for CoDFe-P;
3. trains the generator for ``generator_iterations`` mini-batch steps on batches of ``Z`` to maximise the
   substitute's confidence, Eq. 2: ``L_G = -1/M sum_i log max_k S_k(G(z_i))``.

The paper leaves the optimiser, ``M`` and the iteration counts open (no public code): the defaults here (Adam,
lr 1e-3 for both, ``M = 1000``, 50 substitute and 10 generator iterations of batch 128) were chosen by
measurement, see ``docs/benchmarks.md``. ``diversity > 0`` adds a stealkit option that is *not* in the paper:
the negative entropy of the substitute's mean prediction over the batch (a class-balance term), off by default.
``replay_capacity > 0`` is a second stealkit option, also off by default: the answered rounds are kept in a
bounded replay buffer (:mod:`stealkit.extract.replay`, MAZE's experience replay) and half of every substitute
batch is drawn from earlier rounds, which the generator has since moved away from. Replayed rows cost no
queries. On Fashion-MNIST labels it raised CoDFe-L from 0.51 to 0.71 (``docs/benchmarks.md``).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.extract.datafree_attack import DataFreeAttack, QueryFn, check_positive
from stealkit.extract.datafree_loop import DataFreeResult, LoopConfig, run_datafree
from stealkit.extract.losses import soft_cross_entropy
from stealkit.extract.replay import ReplayBuffer
from stealkit.extract.targets import answer_probs
from stealkit.metrics import Evaluator
from stealkit.models.generators import UpsampleGenerator
from stealkit.oracle import Oracle, OutputMode


@dataclass(frozen=True)
class CoDFeConfig:
    """CoDFe settings (the paper fixes none of these numbers; see the module docstring)."""

    noise_set: int = 1000
    batch_size: int = 128
    substitute_iterations: int = 50
    generator_iterations: int = 10
    nz: int = 100
    ngf: int = 64
    lr_substitute: float = 1e-3
    lr_generator: float = 1e-3
    diversity: float = 0.0
    replay_capacity: int = 0
    seed: int = 0
    loop: LoopConfig = field(default_factory=LoopConfig)

    def __post_init__(self) -> None:
        check_positive("CoDFe", noise_set=self.noise_set, batch_size=self.batch_size,
                       substitute_iterations=self.substitute_iterations, nz=self.nz, ngf=self.ngf,
                       lr_substitute=self.lr_substitute, lr_generator=self.lr_generator)
        if self.generator_iterations < 0 or self.diversity < 0 or self.replay_capacity < 0:
            from stealkit.errors import InputError

            raise InputError("CoDFe: generator_iterations, diversity and replay_capacity must be >= 0")


def codfe_cost(config: CoDFeConfig) -> int:
    """Victim queries per CoDFe round: one per noise vector, ``M``."""
    return config.noise_set


def confidence_loss(logits: torch.Tensor) -> torch.Tensor:
    """Eq. 2: ``-mean_i log max_k S_k(x_i)``."""
    return -F.log_softmax(logits, dim=1).max(dim=1).values.mean()


class CoDFeAttack(DataFreeAttack):
    name = "codfe"

    def __init__(self, *, input_shape: tuple[int, int, int], num_classes: int, mode: OutputMode,
                 make_student: Callable[[], nn.Module], config: CoDFeConfig, device: str = "cpu") -> None:
        super().__init__(input_shape=input_shape, num_classes=num_classes, mode=mode, seed=config.seed,
                         device=device)
        self.config = config
        self.student = make_student().to(device).train()
        torch.manual_seed(config.seed + 1)
        self.generator = UpsampleGenerator(config.nz, input_shape, ngf=config.ngf).to(device).train()
        self.optimizers = {
            "student": torch.optim.Adam(self.student.parameters(), lr=config.lr_substitute),
            "generator": torch.optim.Adam(self.generator.parameters(), lr=config.lr_generator),
        }
        self.z = self.noise(config.noise_set, config.nz)  # the fixed noise set Z, drawn once
        self.replay = ReplayBuffer(config.replay_capacity, input_shape, num_classes)

    @property
    def variant(self) -> str:
        return "CoDFe-L" if self.mode is OutputMode.LABEL else "CoDFe-P"

    def iteration_cost(self) -> int:
        return codfe_cost(self.config)

    def _generate(self, z: torch.Tensor) -> torch.Tensor:
        """G(Z) in batches of ``batch_size`` (batch-norm statistics as in the generator's training steps)."""
        with torch.no_grad():
            return torch.cat([self.generator(z[i : i + self.config.batch_size])
                              for i in range(0, z.shape[0], self.config.batch_size)])

    def step(self, query: QueryFn, progress: float) -> dict[str, float]:
        cfg = self.config
        x = self._generate(self.z)
        answer = query(x).to(self.device)
        soft = answer_probs(answer, self.mode, self.num_classes)  # one-hot rows for labels
        target = answer.long() if self.mode is OutputMode.LABEL else soft
        s_losses = []
        m = x.shape[0]
        replay = len(self.replay) >= cfg.batch_size  # option: half of each batch from earlier rounds
        for _ in range(cfg.substitute_iterations):
            idx = torch.randint(m, (min(cfg.batch_size, m),), generator=self.rng)
            if replay:
                rx, rp = self.replay.sample(idx.shape[0], self.rng, self.device)
                loss = soft_cross_entropy(self.student(torch.cat([x[idx], rx])), torch.cat([soft[idx], rp]))
            else:
                logits = self.student(x[idx])
                loss = F.cross_entropy(logits, target[idx]) if self.mode is OutputMode.LABEL \
                    else soft_cross_entropy(logits, target[idx])
            self.optimizers["student"].zero_grad(set_to_none=True)
            loss.backward()
            self.optimizers["student"].step()
            s_losses.append(float(loss.detach()))
        self.replay.add(x, soft)
        g_losses = []
        for p in self.student.parameters():
            p.requires_grad_(False)
        try:
            for _ in range(cfg.generator_iterations):
                idx = torch.randint(m, (min(cfg.batch_size, m),), generator=self.rng)
                logits = self.student(self.generator(self.z[idx]))
                loss = confidence_loss(logits)
                if cfg.diversity > 0:
                    mean_p = F.softmax(logits, 1).mean(0)
                    loss = loss + cfg.diversity * (mean_p * mean_p.clamp_min(1e-12).log()).sum()
                self.optimizers["generator"].zero_grad(set_to_none=True)
                loss.backward()
                self.optimizers["generator"].step()
                g_losses.append(float(loss.detach()))
        finally:
            for p in self.student.parameters():
                p.requires_grad_(True)
        out = {"loss_substitute": sum(s_losses) / len(s_losses),
               "loss_substitute_last": s_losses[-1]}
        if g_losses:
            out["loss_generator"] = sum(g_losses) / len(g_losses)
        return out

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return {"z": self.z, **self.replay.tensors()}

    def extra_scalars(self) -> dict[str, Any]:
        return self.replay.scalars()

    def load_extra(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        self.z = tensors["z"].to(self.device)
        if "buffer_x" in tensors:
            self.replay.load(tensors, scalars)

    def sample_images(self, n: int) -> torch.Tensor:
        """The first ``n`` images of ``G(Z)``: what the victim is queried with."""
        import copy

        gen = copy.deepcopy(self.generator)
        with torch.no_grad():
            return gen(self.z[: max(n, 2)])[:n].cpu()


def extract_codfe(
    oracle: Oracle,
    *,
    make_student: Callable[[], nn.Module],
    evaluator: Evaluator | None,
    config: CoDFeConfig,
    device: str = "cpu",
    checkpoint_dir: Any = None,
    resume: bool = False,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    on_losses: Callable[[dict[str, Any]], None] | None = None,
) -> DataFreeResult:
    """Steal ``oracle`` with CoDFe (CoDFe-L on a label oracle, CoDFe-P otherwise) until the budget runs out."""
    attack = CoDFeAttack(input_shape=oracle.input_shape, num_classes=oracle.num_classes, mode=oracle.mode,
                         make_student=make_student, config=config, device=device)
    result = run_datafree(attack, oracle, evaluator=evaluator, loop=config.loop, checkpoint_dir=checkpoint_dir,
                          resume=resume, on_point=on_point, on_losses=on_losses, config=config)
    result.extra["variant"] = attack.variant
    return result
