"""Surrogate-data model extraction (Truong et al., *Data-Free Model Extraction*, CVPR 2021, appendix A).

The attacker queries the victim with a surrogate data set and distils the answers into a student:

* **Loss (A.1).** With probability or logit access the student minimises ``tau**2 * KL(V_tau || S_tau)``,
  where ``V_tau = softmax(v / tau)`` and ``S_tau = softmax(s / tau)`` (Hinton et al.'s temperature scaling).
  From probabilities ``p = softmax(v)`` the attacker gets ``V_tau = softmax(log p / tau)`` exactly, so no
  logits are needed; zeros (top-k answers, underflow) stay zeros. With label-only access the loss is cross
  entropy; ``l1`` matches the student's logits to the victim's (recovered, appendix B, for probabilities).
* **Optimiser and schedules (A.2).** SGD, maximum learning rate 0.1, and either the cyclic schedule (Smith's
  one-cycle) or step decay (x0.2 at 30%, 60% and 80% of training).
* **Distinct-sample cap (A.2).** At most ``max_distinct`` different images are ever queried (the paper caps at
  50,000); each is queried once, when first needed, and its answer is cached
  (:class:`~stealkit.extract.answer_cache.AnswerCache`), so every later epoch re-uses it without spending a
  query. The ledger count therefore equals the number of distinct images answered.
* **Query strategy.** ``random`` queries a seeded shuffle of the pool; ``knockoff`` picks images with the
  adaptive policy of Knockoff Nets (Orekondy et al., CVPR 2019; :mod:`stealkit.extract.surrogate_data.knockoff`).
* **Active selection** (``select``; ActiveThief, Pal et al. AAAI 2020): rounds of query -> train -> select by
  the substitute's uncertainty or by k-center coverage (:mod:`stealkit.extract.surrogate_data.active`), resumable.
* **Semi-supervised training** (``ssl="fixmatch"``; Jagielski et al. USENIX Security 2020, Sec. 5.2; FixMatch,
  Sohn et al. 2020): the student also learns from the pool images never queried
  (:mod:`stealkit.extract.surrogate_data.semi_supervised`); ``ssl="soft"`` uses MixMatch's soft, sharpened targets instead
  (:mod:`stealkit.extract.surrogate_data.soft_targets`).
* **Noisy Student / born-again self-training** (``noisy_student.rounds``; Xie et al. CVPR 2020 Sec. 2,
  Furlanello et al. ICML 2018 Sec. 3): after the student, a fresh one learns the answers plus the first one's
  predictions on the unqueried pool, noised (:mod:`stealkit.extract.surrogate_data.noisy_student`).
* **Self-supervised pretraining and cold start** (``pretrain="rotation"|"simclr"``; Jagielski et al. 2020
  Sec. 5.2): the student first learns from the whole pool, with no query, to predict rotations (Gidaris et
  al. ICLR 2018) or contrastively (SimCLR, Chen et al. 2020) (:mod:`stealkit.extract.surrogate_data.pretrain`); ``cold_start`` chooses the first queries in that feature space
  (TypiClust, Hacohen et al. ICML 2022 Sec. 3, or k-center; :mod:`stealkit.extract.surrogate_data.typiclust`), budget-aware:
  the cold start chooses the first ``cold_start_size`` queries (10 per class) and students start pretrained
  (fine-tuned at ``pretraining.finetune_lr``) only up to ``pretraining.warm_max_per_class``. ``PRESETS`` (:mod:`stealkit.extract.surrogate_data.surrogate_presets`) names the combinations.

Surrogate sources (the victim's attacker pool, a skewed subset, another data set adapted by resizing and
channel repetition, natural patches, Gaussian noise) come from :func:`stealkit.data.load_query_source`.
"""

from __future__ import annotations

import logging
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Literal

import torch
import torch.nn.functional as F
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.answer_cache import AnswerCache, distinct_cap
from stealkit.extract.common import ExtractionResult, curve_point
from stealkit.extract.logit_recovery import recover_logits
from stealkit.extract.losses import LossFn
from stealkit.extract.surrogate_data.active import SELECTIONS, ActiveConfig, Select, active_rounds
from stealkit.extract.surrogate_data.knockoff import KnockoffConfig, knockoff_select
from stealkit.extract.surrogate_data.mixup import check_alpha, mixup_loss
from stealkit.extract.surrogate_data.noisy_student import BatchLoss, NoisyStudentConfig, noisy_student_rounds
from stealkit.extract.surrogate_data.pretrain import PRETRAINS, Pretrain, PretrainConfig
from stealkit.extract.surrogate_data.pretrained_weights import (
    from_pretrained,
    pretrained_weights,
    train_only_head,
)
from stealkit.extract.surrogate_data.semi_supervised import SSL, FixMatchConfig, FixMatchLoss, shift_images
from stealkit.extract.surrogate_data.soft_targets import SoftTargetLoss
from stealkit.extract.surrogate_data.surrogate_presets import DEFAULT_PRESET as DEFAULT_PRESET  # re-exported
from stealkit.extract.surrogate_data.surrogate_presets import PRESETS as PRESETS
from stealkit.extract.surrogate_data.typiclust import COLD_STARTS, PER_CLASS, ColdStart, budget_aware_start
from stealkit.extract.surrogate_data.weight_ema import WeightEMA
from stealkit.extract.targets import victim_log_probs
from stealkit.grad_clip import check_grad_clip
from stealkit.metrics import Evaluator
from stealkit.oracle import Oracle, OutputMode
from stealkit.train import Batching, TrainConfig, check_batching, fit

log = logging.getLogger(__name__)

StudentLoss = Literal["auto", "kl", "ce", "l1"]
CycleSchedule = Literal["cyclic", "step", "constant"]
Strategy = Literal["random", "knockoff"]
Augment = Literal["none", "shift", "shift-flip"]

_SCHEDULES: dict[str, str] = {"cyclic": "onecycle", "step": "step", "constant": "none"}
StudentOptimizer = Literal["sgd", "adam"]
#: the peak learning rate of each optimiser when ``lr`` is not given (SGD: DFME A.2; Adam: Kingma & Ba's default)
DEFAULT_LR: dict[str, float] = {"sgd": 0.1, "adam": 1e-3}

FLIP_INVARIANT = ("fashion-mnist", "cifar10", "cifar100", "svhn-flip")  # data sets whose mirror images are valid


# --------------------------------------------------------------------------------------------------------
# Losses (A.1)
# --------------------------------------------------------------------------------------------------------
def tau_kl(student_logits: torch.Tensor, victim_logp_tau: torch.Tensor, tau: float = 1.0) -> torch.Tensor:
    """``tau**2 * KL(V_tau || S_tau)`` averaged over the batch (A.1); ``victim_logp_tau`` is ``log V_tau``.

    Its gradient with respect to the student's logits is ``tau * (S_tau - V_tau) / B``: the ``tau**2`` keeps
    the gradient's scale independent of the temperature (Hinton et al. 2015).
    """
    log_s = F.log_softmax(student_logits / tau, dim=1)
    v = victim_logp_tau.exp()
    terms = torch.where(v > 0, v * (victim_logp_tau - log_s), torch.zeros_like(v))
    return tau * tau * terms.sum(dim=1).mean()


def resolve_loss(loss: StudentLoss, mode: OutputMode | str) -> str:
    """``auto`` means cross entropy for labels and the tau-scaled KL otherwise; other choices are checked."""
    mode = OutputMode.parse(mode)
    if loss == "auto":
        return "ce" if mode is OutputMode.LABEL else "kl"
    if loss not in ("kl", "ce", "l1"):
        raise InputError(f"unknown student loss {loss!r}; expected auto, kl, ce or l1")
    if loss == "kl" and mode is OutputMode.LABEL:
        raise InputError("loss 'kl' needs a probs, topk or logits oracle; with labels use --loss ce")
    if loss == "l1" and mode in (OutputMode.LABEL, OutputMode.TOPK):
        raise InputError(f"loss 'l1' needs logits or full probabilities, not {mode.value}; use --loss kl or ce")
    return loss


def make_student_loss(loss: StudentLoss, mode: OutputMode | str, tau: float = 1.0,
                      label_smoothing: float = 0.0) -> LossFn:
    """The student's loss ``fn(student_logits, victim_answers)`` for an oracle in ``mode``. ``label_smoothing``
    applies to the cross entropy only (Szegedy et al., *Rethinking the Inception Architecture*, CVPR 2016,
    Sec. 7: the one-hot target mixed with the uniform distribution, weight ``label_smoothing``)."""
    mode = OutputMode.parse(mode)
    kind = resolve_loss(loss, mode)
    if kind == "ce":
        ls = label_smoothing
        if mode is OutputMode.LABEL:
            return lambda s, y: F.cross_entropy(s, y.long(), label_smoothing=ls)
        return lambda s, a: F.cross_entropy(s, a.argmax(dim=1), label_smoothing=ls)
    if kind == "l1":
        if mode is OutputMode.LOGITS:
            return lambda s, z: F.l1_loss(s, z.float())
        return lambda s, p: F.l1_loss(s, recover_logits(p.float()))
    return lambda s, a: tau_kl(s, victim_log_probs(a, mode, tau), tau)


# --------------------------------------------------------------------------------------------------------
# Configuration and the attack
# --------------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class SurrogateConfig:
    """Settings of :func:`extract_surrogate`.

    ``max_distinct``: cap on distinct images queried (``None``: the pool or the budget). ``loss``: ``auto``
    (KL for probs/topk/logits, CE for labels), ``kl``, ``ce`` or ``l1``. ``tau``: the temperature of A.1.
    ``schedule``: ``cyclic`` or ``step`` (A.2), or ``constant``, with maximum learning rate ``lr``.
    ``optimizer``: ``sgd`` (A.2; Nesterov momentum) or ``adam`` (Kingma & Ba, ICLR 2015); ``lr=None`` is
    ``DEFAULT_LR`` of the optimiser (0.1 SGD, 1e-3 Adam). ``augment``: random shifts
    of up to 2 pixels (and horizontal flips) of queried images, each trained on the cached answer of its
    original (costs no query; off in the paper). ``label_smoothing``: with the cross-entropy loss (labels), the
    target mixed with the uniform distribution by this weight (Szegedy et al. 2016, Sec. 7; 0: off; no effect
    on ``kl``/``l1``), only when the distinct-sample cap gives at least ``label_smoothing_min_per_class`` queries
    per class (0: always; the default preset uses 10, below which digits lost on validation). ``ema``: the final student is the exponential moving average of its weights over the
    training steps, with this decay (:mod:`stealkit.extract.surrogate_data.weight_ema`; 0: off; not with ``ssl``, whose
    mean teacher already is the result). ``mixup``: MixUp of the answered images and their answer targets with
    ``lam ~ Beta(mixup, mixup)`` per batch (Zhang et al. ICLR 2018 Sec. 2, :mod:`stealkit.extract.surrogate_data.mixup`; 0:
    off; costs no query). ``noisy_student``: rounds of self-training on the unqueried pool after the student
    (:mod:`stealkit.extract.surrogate_data.noisy_student`; ``rounds=0``: off; no query; not with ``ssl``).
    ``batching``: how every training on the answers (round substitutes, the student, the labelled side of
    FixMatch and of the noisy student) cuts an epoch into batches: ``ragged`` (a last batch of what is left) or
    ``equal`` (as many batches, sizes within one of each other; :func:`stealkit.train.epoch_batches`).
    ``grad_clip``: every such training rescales each step's gradient to at most this norm (Pascanu et al. ICML
    2013 Sec. 3.2, :mod:`stealkit.grad_clip`; 0: off, bitwise the loop without it; costs no query).
    ``min_steps``: the student (not the round substitutes) trains at least this many optimiser steps: its
    epochs are raised to ``ceil(min_steps / batches per epoch)`` (:meth:`student_epochs`; 0: off, ``epochs``
    as given). Queries are the budget's either way: a small budget's 30 epochs are a few dozen steps (100
    answers at batch 64: 60), and the student is then limited by its training, not by its answers.
    ``eval_every``: score the student every so many epochs.
    ``select``: ``random`` (one shuffle) or an active strategy queried in rounds (``active``). ``ssl``:
    ``fixmatch`` adds the consistency loss on the whole pool (``fixmatch``); ``soft`` the same with soft,
    sharpened teacher targets (:mod:`stealkit.extract.surrogate_data.soft_targets`). ``pretrain``: ``rotation`` (RotNet) or
    ``simclr`` trains the student on the pool before any query and starts every student from it
    (``pretraining`` holds its settings). ``cold_start``: how the first queries are chosen -- ``random``, or ``typiclust`` /
    ``kcenter`` in the pretrained features (the pixels without pretraining); ``cold_start_size``: how many of
    the first round's queries it chooses (``None``: 10 per class), the rest being the plain attack's images
    (:func:`stealkit.extract.surrogate_data.typiclust.budget_aware_start`). The defaults are the plain attack.
    """

    max_distinct: int | None = None
    loss: StudentLoss = "auto"
    tau: float = 1.0
    epochs: int = 30
    min_steps: int = 0
    batch_size: int = 128
    batching: Batching = "ragged"
    grad_clip: float = 0.0
    lr: float | None = None
    schedule: CycleSchedule = "cyclic"
    optimizer: StudentOptimizer = "sgd"
    momentum: float = 0.9
    weight_decay: float = 5e-4
    strategy: Strategy = "random"
    knockoff: KnockoffConfig = field(default_factory=KnockoffConfig)
    augment: Augment = "none"
    label_smoothing: float = 0.0
    label_smoothing_min_per_class: int = 0
    ema: float = 0.0
    mixup: float = 0.0
    noisy_student: NoisyStudentConfig = field(default_factory=NoisyStudentConfig)
    select: Select = "random"
    active: ActiveConfig = field(default_factory=ActiveConfig)
    ssl: SSL = "none"
    fixmatch: FixMatchConfig = field(default_factory=FixMatchConfig)
    pretrain: Pretrain = "none"
    pretraining: PretrainConfig = field(default_factory=PretrainConfig)
    cold_start: ColdStart = "random"
    cold_start_size: int | None = None
    query_batch: int = 256
    eval_every: int = 0
    seed: int = 0

    def __post_init__(self) -> None:
        if self.max_distinct is not None and self.max_distinct < 1:
            raise InputError(f"max_distinct must be a positive number of images, got {self.max_distinct}")
        if not (self.tau > 0 and math.isfinite(self.tau)):
            raise InputError(f"tau must be a positive number, got {self.tau}")
        if self.schedule not in _SCHEDULES:
            raise InputError(f"unknown schedule {self.schedule!r}; expected cyclic, step or constant")
        if self.optimizer not in DEFAULT_LR:
            raise InputError(f"unknown student optimizer {self.optimizer!r}; expected sgd or adam")
        if self.strategy not in ("random", "knockoff"):
            raise InputError(f"unknown query strategy {self.strategy!r}; expected random or knockoff")
        if self.select not in SELECTIONS:
            raise InputError(f"unknown selection {self.select!r}; expected one of {', '.join(SELECTIONS)}")
        if self.select != "random" and self.strategy == "knockoff":
            raise InputError(f"selection {self.select!r} replaces the knockoff policy; use one or the other")
        if self.ssl not in ("none", "fixmatch", "soft"):
            raise InputError(f"unknown semi-supervised method {self.ssl!r}; expected none, fixmatch or soft")
        if self.pretrain not in PRETRAINS:
            raise InputError(f"unknown pretraining {self.pretrain!r}; expected one of {', '.join(PRETRAINS)}")
        if self.cold_start not in COLD_STARTS:
            raise InputError(f"unknown cold start {self.cold_start!r}; expected one of {', '.join(COLD_STARTS)}")
        if self.cold_start != "random" and self.strategy == "knockoff":
            raise InputError(f"cold start {self.cold_start!r} chooses the first queries; knockoff's policy "
                             "chooses all of them: use one or the other")
        if self.cold_start_size is not None and self.cold_start_size < 1:
            raise InputError(f"cold_start_size must be a positive number of queries or none (10 per class), "
                             f"got {self.cold_start_size}")
        if self.augment not in ("none", "shift", "shift-flip"):
            raise InputError(f"unknown augmentation {self.augment!r}; expected none, shift or shift-flip")
        if not 0.0 <= self.label_smoothing < 1.0:
            raise InputError(f"label_smoothing must be in [0, 1), got {self.label_smoothing}")
        if self.label_smoothing_min_per_class < 0:
            raise InputError("label_smoothing_min_per_class must be >= 0 (0: smooth at every budget), got "
                             f"{self.label_smoothing_min_per_class}")
        check_alpha(self.mixup)
        check_batching(self.batching)
        check_grad_clip(self.grad_clip)
        if not 0.0 <= self.ema < 1.0:
            raise InputError(f"ema must be a decay in [0, 1) (0: off), got {self.ema}")
        if self.ema > 0 and self.ssl != "none":
            raise InputError(f"ema averages the plain student; with ssl {self.ssl!r} the result already is the "
                             "mean teacher (set fixmatch.ema instead)")
        if self.noisy_student.rounds > 0 and self.ssl != "none":
            raise InputError(f"noisy_student self-trains on the pool after the student; with ssl {self.ssl!r} the "
                             "pool is already used: use one or the other")
        if self.loss not in ("auto", "kl", "ce", "l1"):
            raise InputError(f"unknown student loss {self.loss!r}; expected auto, kl, ce or l1")
        if self.epochs < 1 or self.batch_size < 1 or self.peak_lr <= 0 or self.query_batch < 1 or self.eval_every < 0:
            raise InputError("epochs, batch_size and query_batch must be >= 1, lr > 0, eval_every >= 0")
        if self.min_steps < 0:
            raise InputError(f"min_steps must be >= 0 optimiser steps (0: off), got {self.min_steps}")

    @property
    def peak_lr(self) -> float:
        """The (maximum) learning rate: ``lr``, or the optimiser's default."""
        return self.lr if self.lr is not None else DEFAULT_LR[self.optimizer]

    def student_epochs(self, answers: int, pool_size: int) -> int:
        """The student's epochs on ``answers`` answered images of a ``pool_size``-image pool: ``epochs``, raised
        so that it takes at least ``min_steps`` steps. An epoch has ``ceil(images / batch_size)`` batches (with
        either batching), its images being the answered ones, cycled over the pool with FixMatch
        (:func:`epoch_indices`)."""
        if self.min_steps == 0 or answers == 0:
            return self.epochs
        images = answers
        if self.ssl in ("fixmatch", "soft"):
            images = epoch_indices(torch.arange(answers), pool_size, self.fixmatch).numel()
        return max(self.epochs, math.ceil(self.min_steps / math.ceil(images / self.batch_size)))

    def train_config(self) -> TrainConfig:
        return TrainConfig(epochs=self.epochs, batch_size=self.batch_size, optimizer=self.optimizer,  # type: ignore[arg-type]
                           lr=self.peak_lr,
                           momentum=self.momentum, weight_decay=self.weight_decay,
                           schedule=_SCHEDULES[self.schedule], seed=self.seed,  # type: ignore[arg-type]
                           batching=self.batching, grad_clip=self.grad_clip)


def augment_batch(x: torch.Tensor, kind: Augment, gen: torch.Generator, pad: int = 2) -> torch.Tensor:
    """Random translations by up to ``pad`` pixels (zero fill), plus horizontal flips for ``shift-flip``."""
    if kind == "none":
        return x
    return shift_images(x, pad, gen, flip=kind == "shift-flip")


def epoch_indices(indices: torch.Tensor, pool_size: int, fm: FixMatchConfig) -> torch.Tensor:
    """The labelled indices an epoch visits under FixMatch: cycled until the ``mu`` unlabelled images drawn
    per labelled one cover the pool once (``fm.epoch == "pool"``, as FixMatch counts training by unlabelled
    data), or each once (``"labelled"``, the plain attack's epoch)."""
    if fm.epoch == "labelled" or indices.numel() == 0:
        return indices
    want = max(indices.numel(), math.ceil(pool_size / fm.mu))
    return indices.repeat(math.ceil(want / indices.numel()))[:want]


def train_student(
    student: nn.Module,
    cache: AnswerCache,
    indices: torch.Tensor,
    loss_fn: LossFn,
    config: SurrogateConfig,
    *,
    on_epoch: Callable[[int, nn.Module, dict[str, float]], None] | None = None,
    device: str | torch.device = "cpu",
    wrap: Callable[[BatchLoss], BatchLoss] | None = None,
) -> list[dict[str, float]]:
    """Train ``student`` on the images ``cache.x[indices]`` against their cached answers (queried when first
    needed). SGD (or ``optimizer``) with the A.2 schedule; returns one ``{"epoch", "loss", "lr"}`` per epoch. With ``ssl``
    ``fixmatch`` every step adds FixMatch's loss on images drawn from the whole pool ``cache.x``; ``wrap`` wraps the
    answers' loss (the noisy student's pool term)."""
    tc = replace(config.train_config(), seed=config.seed)

    mix_answers = resolve_loss(config.loss, cache.oracle.mode) != "ce"  # MixUp: vectors mixed, or CE weighted

    def labelled(model: nn.Module, idx: torch.Tensor, _: torch.Tensor, gen: torch.Generator) -> torch.Tensor:
        idx = idx.cpu()
        answers = cache.get(idx).to(device)  # queried the first time an image is needed, then reused
        x = augment_batch(cache.x[idx], config.augment, gen).to(device)
        if config.mixup > 0:
            return mixup_loss(model, x, answers, loss_fn, config.mixup, gen, mix_answers=mix_answers)
        return loss_fn(model(x), answers)

    batch_loss: Callable[..., torch.Tensor] = labelled if wrap is None else wrap(labelled)
    if config.ema > 0:
        batch_loss = WeightEMA(batch_loss, config.ema)
    # LP-FT: a pretrained student first trains only its last layer (not when frozen for good)
    probe = config.pretraining.probe_epochs if config.pretrain != "none" and not config.pretraining.freeze else 0
    if probe:
        train_only_head(student, True)
    if config.ssl in ("fixmatch", "soft"):
        indices = epoch_indices(indices, len(cache), config.fixmatch)
        steps = math.ceil(indices.numel() / tc.batch_size) * tc.epochs
        batch_loss = (SoftTargetLoss if config.ssl == "soft" else FixMatchLoss)(labelled, cache.x, config.fixmatch, device, total_steps=steps,
                                  answers=lambda idx: cache.answers[idx.cpu()],  # type: ignore[index]
                                  num_classes=cache.oracle.num_classes)

    def epoch_done(epoch: int, rec: dict[str, float]) -> None:
        if epoch == probe:
            train_only_head(student, False)
        if epoch == tc.epochs and isinstance(batch_loss, (FixMatchLoss, WeightEMA)):
            batch_loss.finish(student)  # FixMatch's mean teacher, or the weight average, becomes the student
        if on_epoch is not None:
            on_epoch(epoch, student, rec)
            student.train()

    # the loop's "inputs" are the pool indices: images and answers are looked up per batch
    return fit(student, indices, indices, tc, batch_loss=batch_loss, on_epoch=epoch_done, device=device,
               desc=f"student ({indices.numel()} images)")


def extract_surrogate(
    oracle: Oracle,
    pool: torch.Tensor,
    *,
    make_student: Callable[[], nn.Module],
    config: SurrogateConfig,
    evaluator: Evaluator | None = None,
    pool_labels: torch.Tensor | None = None,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    on_epoch: Callable[[int, nn.Module, dict[str, float]], None] | None = None,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    device: str | torch.device = "cpu",
    pretrain_cache: Path | None = None,
) -> ExtractionResult:
    """Steal ``oracle`` by querying images of the surrogate ``pool`` ``[N, C, H, W]`` and distilling them.

    The pool is shuffled with ``config.seed`` and cut to the distinct-sample cap (the pool size, the cap and
    the budget left, whichever is least); ``random`` then queries all of it while the student trains (epoch 1
    answers, later epochs re-use), ``knockoff`` chooses which images to query with the adaptive policy
    (``pool_labels`` name its actions; without them the pool is clustered). The ledger's count is the
    number of distinct images answered. ``on_epoch(epoch, student, record)`` sees training as it goes.
    An active ``select`` queries in rounds (:func:`stealkit.extract.surrogate_data.active.active_rounds`); with
    ``checkpoint_dir`` the rounds are saved there and ``resume`` continues them without paying twice. When the
    budget answers the whole pool (and nothing is pretrained) there is nothing to select: the pool is queried as
    ``random`` does, without rounds (``extra["select_skipped"]``).
    Rotation-pretrained weights are saved as ``checkpoint_dir/pretrained.safetensors`` and reused on
    ``resume``; ``pretrain_cache`` (a file, used when there is no ``checkpoint_dir``) is reused whenever it
    exists with the same settings, seed and pool (benchmarks share one pretraining between cells).
    """
    if pool.dim() != 4 or tuple(pool.shape[1:]) != tuple(oracle.input_shape):
        raise InputError(f"the surrogate pool must have shape [N, {', '.join(map(str, oracle.input_shape))}], "
                         f"got {list(pool.shape)}; adapt it with stealkit.data.adapt_images")
    if pool.shape[0] == 0:
        raise InputError("the surrogate pool is empty")
    gen = torch.Generator().manual_seed(config.seed)
    order = torch.randperm(pool.shape[0], generator=gen)
    queries_before = oracle.ledger.total
    t_start = time.perf_counter()
    n = distinct_cap(oracle, pool.shape[0], config.max_distinct)
    if n == 0:
        raise InputError("the oracle's budget allows no query at all; raise --budget")
    extra: dict[str, Any] = {}
    whole_pool = config.select != "random" and n >= pool.shape[0] and config.cold_start == "random" \
        and config.pretrain == "none"
    if whole_pool:  # the budget answers the whole pool: nothing to choose, so no rounds (the plain path's images)
        if resume:
            raise InputError("nothing to resume: the budget answers the whole pool, so this run queries it in one "
                             "pass without active rounds or a checkpoint; run it again without --resume")
        config = replace(config, select="random")
        extra["select_skipped"] = "the budget answers the whole pool"
    if config.min_steps:  # the student's epochs for this budget (the round substitutes keep theirs)
        epochs = config.student_epochs(n, pool.shape[0])
        every = config.eval_every * math.ceil(epochs / config.epochs)  # as many curve points as without the floor
        config = replace(config, epochs=epochs, eval_every=every)
        extra["epochs"], extra["eval_every"] = epochs, every
    if config.label_smoothing and (n < config.label_smoothing_min_per_class * oracle.num_classes
                                   or resolve_loss(config.loss, oracle.mode) != "ce"):
        config = replace(config, label_smoothing=0.0)  # too few answers per class, or no cross entropy
    loss_fn = make_student_loss(config.loss, oracle.mode, config.tau, config.label_smoothing)
    featurize: Callable[[], nn.Module] | None = None  # the cold start's feature extractor
    if config.pretrain != "none":
        warm = config.pretraining.warm_start(n, oracle.num_classes)
        if warm or config.cold_start != "random":
            path = checkpoint_dir / "pretrained.safetensors" if checkpoint_dir is not None else pretrain_cache
            state, extra["pretraining"] = pretrained_weights(
                path, config.pretrain, make_student, pool[order], config.pretraining, seed=config.seed,
                reuse=resume or checkpoint_dir is None, flip=config.fixmatch.flip, device=device)
            featurize = from_pretrained(make_student, state)
        if warm:  # every student starts from the pretrained weights, at its own peak learning rate
            make_student = from_pretrained(make_student, state, config.pretraining.freeze)
            config = replace(config, lr=config.pretraining.finetune_lr or config.peak_lr)
        else:  # a budget above the pretrained start's: fresh students, as the plain attack's
            config = replace(config, pretraining=replace(config.pretraining, probe_epochs=0))
        extra["warm_start"], extra["finetune_lr"] = warm, config.peak_lr
    if config.strategy == "knockoff":
        labels = pool_labels[order] if pool_labels is not None else None
        cache = AnswerCache(oracle, pool[order], query_batch=config.query_batch)
        indices, trace = knockoff_select(cache, n, make_student=make_student, loss_fn=loss_fn,
                                         config=config.knockoff, actions=labels, seed=config.seed, device=device)
        extra["knockoff"] = trace
    elif config.select == "random" and config.cold_start == "random" and (checkpoint_dir is None or whole_pool):
        # the first n of the shuffle, queried while the student trains; the rest is FixMatch's unlabelled pool
        cache = AnswerCache(oracle, pool[order], query_batch=config.query_batch)
        indices = torch.arange(n)
    else:
        cache, indices, active = _active(oracle, pool[order], n, loss_fn, make_student, config, evaluator,
                                         checkpoint_dir, resume, device, featurize)
        extra.update(active)
    curve: list[dict[str, Any]] = []

    def epoch_hook(epoch: int, student: nn.Module, rec: dict[str, float]) -> None:
        last = epoch == config.epochs
        if evaluator is not None and (last or (config.eval_every and epoch % config.eval_every == 0)):
            point = curve_point(oracle, evaluator, student, epoch=epoch, n_distinct=cache.n_answered,
                                loss=rec["loss"])
            curve.append(point)
            if on_point is not None:
                on_point(point)
            log.info("epoch %d: accuracy %.4f fidelity %s (queries %d)", epoch, point["accuracy"],
                     point["fidelity"], point["queries"])
        if on_epoch is not None:
            on_epoch(epoch, student, rec)

    # self-training needs unqueried images; with the whole pool answered it is off (the same student)
    rounds = config.noisy_student.rounds if indices.numel() < len(cache) else 0
    student = make_student()
    history = train_student(student, cache, indices, loss_fn, config, on_epoch=None if rounds else epoch_hook,
                            device=device)
    if config.noisy_student.rounds:
        extra["noisy_student"] = {"rounds": 0, "skipped": "no unqueried image"}
    if rounds:
        def train_round(s: nn.Module, wrap: Callable[[BatchLoss], BatchLoss], last: bool) -> None:
            history[:] = train_student(s, cache, indices, loss_fn, config, on_epoch=epoch_hook if last else None,
                                       device=device, wrap=wrap)

        student, extra["noisy_student"] = noisy_student_rounds(
            student, cache.x, indices, make_student, train_round, config.noisy_student, config.fixmatch,
            score=evaluator, device=device)
        if not curve:  # the rounds were skipped: the teacher is the result
            epoch_hook(config.epochs, student, history[-1])
    final = curve[-1] if curve else {"accuracy": None, "fidelity": None}
    return ExtractionResult(
        method="surrogate" if config.strategy == "random" else "surrogate-knockoff",
        student=student,
        queries=oracle.ledger.as_dict(),
        accuracy=final["accuracy"],
        fidelity=final["fidelity"],
        victim_accuracy=evaluator.victim_accuracy if evaluator is not None else None,
        curve=curve,
        extra={"mode": oracle.mode.value, "loss": resolve_loss(config.loss, oracle.mode), "tau": config.tau,
               "schedule": config.schedule, "optimizer": config.optimizer, "lr": config.peak_lr,
               "strategy": config.strategy, "select": config.select,
               "ssl": config.ssl, "pretrain": config.pretrain, "cold_start": config.cold_start,
               "augment": config.augment, "label_smoothing": config.label_smoothing, "ema": config.ema,
               "mixup": config.mixup, "batching": config.batching, "grad_clip": config.grad_clip,
               "seconds": round(time.perf_counter() - t_start, 2), "n_distinct": cache.n_answered,
               "queries_spent": oracle.ledger.total - queries_before, "cache_hits": cache.hits,
               "final_train_loss": history[-1]["loss"], **extra},
    )


def _active(oracle: Oracle, pool: torch.Tensor, n: int, loss_fn: LossFn, make_student: Callable[[], nn.Module],
            config: SurrogateConfig, evaluator: Evaluator | None, checkpoint_dir: Path | None, resume: bool,
            device: str | torch.device, featurize: Callable[[], nn.Module] | None = None,
            ) -> tuple[AnswerCache, torch.Tensor, dict[str, Any]]:
    """Query ``n`` images of ``pool`` in active rounds; each round's substitute is scored into the trace.
    ``featurize()``: the pretrained student whose features the cold start clusters (``None``: the pixels)."""
    from stealkit.extract.journal import JournalOracle

    answering: Oracle = JournalOracle(oracle) if checkpoint_dir is not None else oracle  # type: ignore[assignment]
    cache = AnswerCache(answering, pool, query_batch=config.query_batch)
    scores: list[dict[str, Any]] = []

    def train(idx: torch.Tensor, epochs: int) -> nn.Module:
        student = make_student()
        ssl = config.ssl if config.active.round_ssl else "none"
        train_student(student, cache, idx, loss_fn, replace(config, epochs=epochs, ssl=ssl), device=device)
        return student

    def on_round(student: nn.Module, rec: dict[str, Any]) -> None:
        if evaluator is not None:
            scores.append({**rec, "queries": rec["answered"], **evaluator(student)})

    def first(m: int) -> torch.Tensor:
        """The cold start: the first round in the (pretrained) student's features, or the pixels."""
        from stealkit.extract.surrogate_data.active import probs_and_features

        feats = (cache.x.flatten(1) if featurize is None else
                 probs_and_features(featurize(), cache.x, batch=config.active.score_batch, device=device)[1])
        return budget_aware_start(config.cold_start, feats, m, size, torch.Generator().manual_seed(config.seed))

    size = config.cold_start_size or PER_CLASS * oracle.num_classes
    identity: dict[str, Any] = {"cold_start": config.cold_start, "lr": config.peak_lr, "warm": featurize is not None and
                                config.pretraining.warm_start(n, oracle.num_classes),
                                "cold_start_size": size if config.cold_start != "random" else None}

    if config.cold_start != "random":
        pick: Callable[[int], torch.Tensor] | None = first
    elif config.select == "random":  # checkpointed only for pretraining: the same images as the plain path
        pick = torch.arange
    else:
        pick = None
    indices, trace = active_rounds(cache, n, strategy=config.select, config=config.active, train=train,
                                   seed=config.seed, on_round=on_round, checkpoint_dir=checkpoint_dir,
                                   resume=resume, device=device, first=pick, identity=identity)
    trace["round_scores"] = scores
    return cache, indices, {"active": trace, "cold_start_size": identity["cold_start_size"]}
