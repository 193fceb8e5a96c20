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
measurement (CoDFe with them against DaST: docs/results.md#datafree-codfe-dast). ``diversity > 0`` adds a stealkit option that is *not* in the paper:
the negative entropy of the substitute's mean prediction over the batch (a class-balance term), off by default.
``replay_capacity > 0`` is a second stealkit option, also off by default: the answered rounds are kept in a
bounded replay buffer (:mod:`stealkit.extract.datafree.replay`, MAZE's experience replay) and half of every substitute
batch is drawn from earlier rounds, which the generator has since moved away from. Replayed rows cost no
queries. On Fashion-MNIST labels it raised CoDFe-L from 0.51 to 0.71 at 100k queries (with the class-balance term;
docs/results.md#datafree-fmnist-test).

Label-only extensions (all off in the paper preset; the default recipe, :mod:`stealkit.extract.datafree.recipes`,
switches them on; docs/guide/datafree.md, "The default and why"): ``fresh_noise`` draws a new noise batch every round instead of the
fixed ``Z``; ``candidates > 1`` over-generates and queries a class-balanced, hardest-first selection of ``M``
rows (hardness: the student's entropy), and ``hard_replay`` draws that share of each replay batch by hardness
(CaBaGE-style, :mod:`stealkit.extract.datafree.cabage`); ``holdout`` sets that share of every round's answers aside to
choose the reported student by held-out agreement (:mod:`stealkit.extract.datafree.selection`) between the student and
its exponential average (``ema`` decay), on a reservoir sample of ``holdout_capacity`` rows over every round,
replacing the reported student only when a candidate beats it by ``selection_margin`` standard errors (another
selection rule plugs in through ``make_selector``, a :class:`~stealkit.extract.datafree.selection.Selector`).
``substitute_schedule="cosine"`` anneals the student's learning rate from ``lr_substitute`` to 0 over the
planned budget (MAZE's schedule; the paper's Adam rate is constant). A round still costs exactly ``M``
queries. One student only: DisGUIDE's second clone hurt CoDFe on the validation split (0.873 with two clones against
0.889 with one at 25k, twice the time; docs/archive.md, "Data-free extraction").
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.extract.datafree.attack import DataFreeAttack, QueryFn, check_positive
from stealkit.extract.datafree.cabage import HardReplayBuffer, balanced_selection
from stealkit.extract.datafree.disguide import sample_disagreement
from stealkit.extract.datafree.loop import DataFreeResult, LoopConfig, run_datafree
from stealkit.extract.datafree.replay import ReplayBuffer
from stealkit.extract.datafree.schedules import cosine_factor, set_lr
from stealkit.extract.datafree.selection import ExponentialAverage, MakeSelector, Selector, StudentSelector
from stealkit.extract.losses import soft_cross_entropy, soft_cross_entropy_rows
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
    substitute_schedule: str = "constant"
    diversity: float = 0.0
    replay_capacity: int = 0
    fresh_noise: bool = False
    candidates: int = 1
    hard_replay: float = 0.0
    ema: float = 0.0
    holdout: float = 0.0
    holdout_capacity: int = 5000
    selection_margin: float = 0.0
    seed: int = 0
    loop: LoopConfig = field(default_factory=LoopConfig)

    def __post_init__(self) -> None:
        from stealkit.errors import InputError

        check_positive("CoDFe", noise_set=self.noise_set, batch_size=self.batch_size,
                       substitute_iterations=self.substitute_iterations, nz=self.nz, ngf=self.ngf,
                       lr_substitute=self.lr_substitute, lr_generator=self.lr_generator,
                       candidates=self.candidates, holdout_capacity=self.holdout_capacity)
        if min(self.generator_iterations, self.diversity, self.replay_capacity) < 0:
            raise InputError("CoDFe: generator_iterations, diversity and replay_capacity must be >= 0")
        for name in ("hard_replay", "ema", "holdout"):
            if not 0 <= getattr(self, name) < (1.0001 if name == "hard_replay" else 1):
                raise InputError(f"CoDFe: {name} must be in [0, 1), got {getattr(self, name)}")
        if self.substitute_schedule not in ("constant", "cosine"):
            raise InputError(f"CoDFe: substitute_schedule must be 'constant' or 'cosine', got "
                             f"{self.substitute_schedule!r}")
        if self.selection_margin < 0:
            raise InputError(f"CoDFe: selection_margin must be >= 0, got {self.selection_margin}")
        if self.holdout > 0 and int(self.noise_set * (1 - self.holdout)) < 1:
            raise InputError("CoDFe: holdout leaves no row of a round to train on; lower it or raise noise_set")


def codfe_cost(config: CoDFeConfig) -> int:
    """Victim queries per CoDFe round: one per noise vector, ``M``."""
    return config.noise_set


def confidence_loss(logits: torch.Tensor) -> torch.Tensor:
    """Eq. 2: ``-mean_i log max_k S_k(x_i)``."""
    return -F.log_softmax(logits, dim=1).max(dim=1).values.mean()


class CoDFeAttack(DataFreeAttack):
    """CoDFe (module docstring). ``make_selector`` replaces the built-in held-out selector (used when
    ``holdout > 0``) by the caller's own :class:`~stealkit.extract.datafree.selection.Selector`."""

    name = "codfe"

    def __init__(self, *, input_shape: tuple[int, int, int], num_classes: int, mode: OutputMode,
                 make_student: Callable[[], nn.Module], config: CoDFeConfig, device: str = "cpu",
                 make_selector: MakeSelector | None = None) -> None:
        super().__init__(input_shape=input_shape, num_classes=num_classes, mode=mode, seed=config.seed,
                         device=device)
        self.config = config
        self.student = make_student().to(device).train()
        torch.manual_seed(config.seed + 1)
        self.generator = UpsampleGenerator(config.nz, input_shape, ngf=config.ngf).to(device).train()
        self.optimizers = {"student": torch.optim.Adam(self.student.parameters(), lr=config.lr_substitute),
                           "generator": torch.optim.Adam(self.generator.parameters(), lr=config.lr_generator)}
        self.z = self.noise(config.noise_set, config.nz)  # the fixed noise set Z, drawn once
        self.replay: ReplayBuffer = (HardReplayBuffer(config.replay_capacity, input_shape, num_classes,
                                                      config.hard_replay) if config.hard_replay > 0
                                     else ReplayBuffer(config.replay_capacity, input_shape, num_classes))
        self.class_counts = torch.zeros(num_classes, dtype=torch.long)  # victim answers per class so far
        self.average = ExponentialAverage(self.student, config.ema) if config.ema > 0 else None
        self.selector: Selector | None = None
        if config.holdout > 0:
            self.selector = (make_selector(make_student()) if make_selector is not None else
                             StudentSelector(make_student(), config.holdout_capacity, input_shape, num_classes,
                                             device, keep="all", margin=config.selection_margin, seed=config.seed))

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

    def modules(self) -> dict[str, nn.Module]:
        mods = {"student": self.student, "generator": self.generator}
        if self.average is not None:
            mods["ema"] = self.average.module
        if self.selector is not None:
            mods["selected"] = self.selector.snapshot
        return mods

    def candidates(self) -> dict[str, nn.Module]:
        return {"student": self.student} | ({"ema": self.average.module} if self.average is not None else {})

    def reported(self) -> nn.Module:
        return self.selector.snapshot if self.selector is not None and self.selector.source else self.student

    def _queries(self) -> torch.Tensor:
        """This round's ``M`` query images: ``G(Z)``, or a class-balanced pick of ``c * M`` candidates."""
        cfg = self.config
        z = self.noise(cfg.noise_set * cfg.candidates, cfg.nz) if cfg.fresh_noise else self.z
        if not cfg.fresh_noise and cfg.candidates > 1:
            z = torch.cat([z, self.noise(cfg.noise_set * (cfg.candidates - 1), cfg.nz)])
        x = self._generate(z)
        if cfg.candidates == 1:
            return x
        with torch.no_grad():
            probs = F.softmax(self.student(x), dim=1)
        pick = balanced_selection(probs.argmax(1), sample_disagreement(probs.unsqueeze(1)), self.class_counts,
                                  cfg.noise_set)
        return x[pick.to(x.device)]

    def _train_student(self, x: torch.Tensor, answer: torch.Tensor, soft: torch.Tensor) -> list[float]:
        cfg = self.config
        target = answer.long() if self.mode is OutputMode.LABEL else soft
        s_losses = []
        m = x.shape[0]
        replay = len(self.replay) >= cfg.batch_size  # option: half of each batch from earlier rounds
        hard = isinstance(self.replay, HardReplayBuffer)
        for _ in range(cfg.substitute_iterations):
            idx = torch.randint(m, (min(cfg.batch_size, m),), generator=self.rng)
            if replay:
                rx, rp = self.replay.sample(idx.shape[0], self.rng, self.device)
                bx, bp = torch.cat([x[idx], rx]), torch.cat([soft[idx], rp])
            logits = self.student(bx if replay else x[idx])
            if replay:
                per_row = soft_cross_entropy_rows(logits, bp)
                loss = per_row.mean()
                if hard:
                    self.replay.update_hardness(per_row[idx.shape[0]:])  # type: ignore[attr-defined]
            else:
                loss = F.cross_entropy(logits, target[idx]) if self.mode is OutputMode.LABEL \
                    else soft_cross_entropy(logits, target[idx])
            self.optimizers["student"].zero_grad(set_to_none=True)
            loss.backward()
            self.optimizers["student"].step()
            s_losses.append(float(loss.detach()))
            if self.average is not None:
                self.average.update(self.student)
        return s_losses

    def _generator_loss(self, z: torch.Tensor) -> torch.Tensor:
        """Eq. 2 + ``diversity`` times the class-balance term."""
        cfg = self.config
        logits = self.student(self.generator(z))
        loss = confidence_loss(logits)
        mean_p = F.softmax(logits, 1).mean(0)
        if cfg.diversity > 0:
            loss = loss + cfg.diversity * (mean_p * mean_p.clamp_min(1e-12).log()).sum()
        return loss

    def step(self, query: QueryFn, progress: float) -> dict[str, float]:
        cfg = self.config
        if cfg.substitute_schedule == "cosine":  # the student's rate anneals to 0 over the planned budget
            set_lr(self.optimizers["student"], cfg.lr_substitute * cosine_factor(progress))
        x = self._queries()
        answer = query(x).to(self.device)
        soft = answer_probs(answer, self.mode, self.num_classes)  # one-hot rows for labels
        self.class_counts += torch.bincount(soft.argmax(1).cpu(), minlength=self.num_classes)
        if self.selector is not None:  # a held-out slice of the paid answers: never trained on
            perm = torch.randperm(x.shape[0], generator=self.rng).to(self.device)
            cut = x.shape[0] - int(x.shape[0] * (1 - cfg.holdout))
            self.selector.add(x[perm[:cut]], soft[perm[:cut]])
            x, answer, soft = x[perm[cut:]], answer[perm[cut:]], soft[perm[cut:]]
        s_losses = self._train_student(x, answer, soft)
        self.replay.add(x, soft)
        g_losses = []
        frozen = list(self.student.parameters())
        for p in frozen:
            p.requires_grad_(False)
        try:
            for _ in range(cfg.generator_iterations):
                idx = torch.randint(cfg.noise_set, (min(cfg.batch_size, cfg.noise_set),), generator=self.rng)
                z = self.noise(idx.shape[0], cfg.nz) if cfg.fresh_noise else self.z[idx]
                loss = self._generator_loss(z)
                self.optimizers["generator"].zero_grad(set_to_none=True)
                loss.backward()
                self.optimizers["generator"].step()
                g_losses.append(float(loss.detach()))
        finally:
            for p in frozen:
                p.requires_grad_(True)
        out = {"loss_substitute": sum(s_losses) / len(s_losses),
               "loss_substitute_last": s_losses[-1]}
        if g_losses:
            out["loss_generator"] = sum(g_losses) / len(g_losses)
        if self.selector is not None:
            self.selector.consider(self.candidates())
            out["selected_agreement"] = self.selector.score
        return out

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        selector = self.selector.tensors() if self.selector is not None else {}
        return {"z": self.z, "class_counts": self.class_counts, **self.replay.tensors(), **selector}

    def extra_scalars(self) -> dict[str, Any]:
        return self.replay.scalars() | ({"selector": self.selector.scalars()} if self.selector is not None else {})

    def load_extra(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        self.z = tensors["z"].to(self.device)
        if "class_counts" in tensors:
            self.class_counts = tensors["class_counts"].clone()
        if "buffer_x" in tensors:
            self.replay.load(tensors, scalars)
        if self.selector is not None and "selector" in scalars:
            self.selector.load(tensors, scalars["selector"])

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
    make_selector: MakeSelector | None = None,
) -> DataFreeResult:
    """Steal ``oracle`` with CoDFe (CoDFe-L on a label oracle, CoDFe-P otherwise) until the budget runs out;
    ``make_selector``: the caller's own student selector (:class:`CoDFeAttack`)."""
    attack = CoDFeAttack(input_shape=oracle.input_shape, num_classes=oracle.num_classes, mode=oracle.mode,
                         make_student=make_student, config=config, device=device, make_selector=make_selector)
    result = run_datafree(attack, oracle, evaluator=evaluator, loop=config.loop, checkpoint_dir=checkpoint_dir,
                          resume=resume, on_point=on_point, on_losses=on_losses, config=config)
    result.extra["variant"] = attack.variant
    return result
