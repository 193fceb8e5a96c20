"""Choosing what to ask: active selection of surrogate-pool queries (ActiveThief; k-center greedy).

ActiveThief (Pal, Gupta, Shukla, Kanade, Shevade & Ganapathy, *ActiveThief: Model Extraction Using Active
Learning and Unannotated Public Data*, AAAI 2020, Section 3 and Algorithm 1) spends the query budget in rounds:
an initial random seed set is queried, then each round trains the substitute on everything answered so far,
scores the unqueried pool with it and queries the ``m`` images a *subset selection strategy* picks:

* ``entropy`` -- uncertainty: the largest entropy ``-sum_k p_k log p_k`` of the substitute's prediction;
* ``margin`` -- uncertainty: the smallest gap between the two most probable classes (a common variant; the
  paper's DeepFool strategy ranks by the smallest adversarial perturbation, which the margin approximates
  to first order and which costs a DeepFool run per image on a CPU);
* ``kcenter`` -- coverage: k-center greedy (Sener & Savarese, *Active Learning for Convolutional Neural
  Networks: A Core-Set Approach*, ICLR 2018, Section 4.2, Algorithm 1) in the substitute's penultimate-layer
  feature space: repeatedly take the pool image farthest from its nearest already-chosen or answered image.

``margin`` is part of the default from 20 answers per class (:mod:`stealkit.extract.surrogate_data.presets`);
``entropy`` and ``kcenter`` are reached with ``--select``.

Every answer goes through the :class:`~stealkit.extract.answer_cache.AnswerCache`, so each image is paid for
once and charged to the oracle's ledger; the round schedule never asks for more than the distinct-sample cap.

Resumable like the data-free loop: after each round the answered indices, their answers and the ledger go to
``active.json`` + ``active.safetensors`` in the checkpoint directory (:mod:`stealkit.fsutil`'s atomic writes,
JSON written last), and the queries of the round under way to an answer journal
(:class:`~stealkit.extract.journal.JournalOracle`). A resumed run restores the last round, retrains its
substitute (seeded, no queries) and replays the journal, so it never pays twice for an image.
"""

from __future__ import annotations

import json
import logging
import math
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Literal

import torch
from torch import nn

from stealkit.chunking import forward_chunk
from stealkit.errors import InputError
from stealkit.extract.answer_cache import AnswerCache
from stealkit.fsutil import atomic_path, atomic_write_json, to_jsonable
from stealkit.oracle.ledger import QueryLedger

log = logging.getLogger(__name__)

Select = Literal["random", "entropy", "margin", "kcenter"]
SELECTIONS = ("random", "entropy", "margin", "kcenter")
ACTIVE_FORMAT = "stealkit-active-rounds/1"


@dataclass(frozen=True)
class ActiveConfig:
    """Rounds of query -> train -> select (ActiveThief, Algorithm 1).

    ``initial``: the fraction of the budget queried at random first (the seed set). ``rounds``: how many
    selection rounds share the rest. ``round_epochs``: epochs of each round's substitute (the final student
    trains for the extraction's own epochs; the substitutes train on the answered images only, without the
    semi-supervised loss). ``score_batch``: images per forward pass when scoring the pool (``None``: the device's
    forward chunk, :func:`stealkit.chunking.forward_chunk`). ``candidates``: the uncertainty and
    k-center strategies choose among at most this many unanswered images, drawn at random each round (0:
    all of them); only those and the answered images are scored, so a pool much larger than the budget
    costs a round no more than a pool of ``candidates`` images (k-center greedy is ``O(candidates * m)``
    distances per round). 10,000 by default: at a 10k budget with a 60,000-image pool the selection step
    then takes 22 % of a round's wall time instead of 64 % (docs/archive.md, ``benchmarks/selection_cost.py``); pools with
    at most that many unanswered images are unaffected. Scoring runs 2x2 max-pooling as strided maxima and
    k-center's distances come from precomputed augmented features (:func:`strided_max_pooling`,
    :func:`distances_to_row`): bitwise the same scores and picks as the plain computation, the selection step
    2.7x faster at the 10k setting (docs/archive.md, ``active.fast_select``).
    """

    initial: float = 0.2
    rounds: int = 4
    round_epochs: int = 10
    score_batch: int | None = None
    candidates: int = 10_000

    def __post_init__(self) -> None:
        if not 0.0 < self.initial <= 1.0:
            raise InputError(f"active initial must be a fraction in (0, 1], got {self.initial}")
        if self.rounds < 1 or self.round_epochs < 1 or (self.score_batch is not None and self.score_batch < 1):
            raise InputError("active rounds, round_epochs and score_batch must be >= 1")
        if self.candidates < 0:
            raise InputError(f"active candidates must be >= 0 (0: every unanswered image), got {self.candidates}")

    def schedule(self, n: int) -> list[int]:
        """How many images each round queries: the seed set, then the rest in ``rounds`` near-equal parts."""
        first = min(n, max(1, math.ceil(self.initial * n)))
        rest = n - first
        parts = [rest // self.rounds + (1 if r < rest % self.rounds else 0) for r in range(self.rounds)]
        return [first, *[p for p in parts if p > 0]]


# --------------------------------------------------------------------------------------------------------
# Scores
# --------------------------------------------------------------------------------------------------------
def last_linear(model: nn.Module) -> nn.Linear:
    """The model's last ``nn.Linear`` (the logits layer); its input is the penultimate feature vector."""
    linears = [m for m in model.modules() if isinstance(m, nn.Linear)]
    if not linears:
        raise InputError("k-center selection needs a student whose last layer is nn.Linear")
    return linears[-1]


def max_2x2(x: torch.Tensor) -> torch.Tensor:
    """2x2 max-pooling with stride 2 (odd edges dropped, as ``F.max_pool2d(x, 2)``) as the elementwise maximum
    of four strided views: a maximum is exact, so the output is bitwise ``F.max_pool2d``'s (NaN propagates
    alike), without computing the argmax indices. On this project's CPU (torch 2.13, 1 thread) it takes a
    fifth of ``max_pool2d``'s time on the conv2 student's first pooling layer (docs/archive.md,
    ``benchmarks/scoring_forward.py``)."""
    h, w = x.shape[-2] // 2 * 2, x.shape[-1] // 2 * 2
    x = x[..., :h, :w]
    return torch.maximum(torch.maximum(x[..., 0::2, 0::2], x[..., 1::2, 0::2]),
                         torch.maximum(x[..., 0::2, 1::2], x[..., 1::2, 1::2]))


def _plain_2x2(mod: nn.MaxPool2d) -> bool:
    def pair(v: Any) -> tuple[Any, ...]:
        return tuple(v) if isinstance(v, tuple | list) else (v, v)

    return (pair(mod.kernel_size) == (2, 2) and pair(mod.stride) == (2, 2) and pair(mod.padding) == (0, 0)
            and pair(mod.dilation) == (1, 1) and not mod.ceil_mode and not mod.return_indices)


@contextmanager
def strided_max_pooling(model: nn.Module) -> Iterator[int]:
    """Within the block every plain 2x2 ``nn.MaxPool2d`` of ``model`` runs :func:`max_2x2` (bitwise the same
    output); yields how many were swapped. Other pooling layers are left as they are."""
    swapped = [m for m in model.modules()
               if isinstance(m, nn.MaxPool2d) and _plain_2x2(m) and "forward" not in vars(m)]
    for m in swapped:
        m.forward = max_2x2  # type: ignore[method-assign]
    try:
        yield len(swapped)
    finally:
        for m in swapped:
            del m.forward


@torch.no_grad()
def probs_and_features(model: nn.Module, x: torch.Tensor, *, batch: int | None = None,
                       device: str | torch.device = "cpu", fast: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """Softmax outputs ``[N, K]`` and penultimate features ``[N, D]`` of ``model`` on ``x`` (on the CPU), in
    chunks of ``batch`` images (``None``: the device's forward chunk). ``fast``: 2x2 max-pooling as strided
    maxima (:func:`strided_max_pooling`; bitwise the same outputs)."""
    if batch is None:
        batch = forward_chunk(model, tuple(x.shape[1:]), device)
    feats: list[torch.Tensor] = []
    hook = last_linear(model).register_forward_hook(lambda _m, inp, _o: feats.append(inp[0].flatten(1).cpu()))
    was_training = model.training
    model.eval()
    probs = []
    try:
        with strided_max_pooling(model) if fast else nullcontext():
            for i in range(0, x.shape[0], batch):
                probs.append(torch.softmax(model(x[i : i + batch].to(device)).float(), dim=1).cpu())
    finally:
        hook.remove()
        model.train(was_training)
    return torch.cat(probs), torch.cat(feats).float()


def score_subset(model: nn.Module, x: torch.Tensor, rows: torch.Tensor, *, batch: int | None = None,
                 device: str | torch.device = "cpu", fast: bool = False) -> tuple[torch.Tensor, torch.Tensor]:
    """:func:`probs_and_features` of ``x[rows]`` only, placed at their pool indices (the other rows zero)."""
    if rows.numel() == x.shape[0]:
        return probs_and_features(model, x, batch=batch, device=device, fast=fast)
    probs, feats = probs_and_features(model, x[rows], batch=batch, device=device, fast=fast)
    p_all = torch.zeros((x.shape[0], probs.shape[1]))
    f_all = torch.zeros((x.shape[0], feats.shape[1]))
    p_all[rows], f_all[rows] = probs, feats
    return p_all, f_all


def entropy(p: torch.Tensor) -> torch.Tensor:
    return -(p * p.clamp_min(1e-12).log()).sum(dim=1)


def margin(p: torch.Tensor) -> torch.Tensor:
    top = p.topk(min(2, p.shape[1]), dim=1).values
    return top[:, 0] - (top[:, 1] if p.shape[1] > 1 else 0)


def distances_to_row(feats: torch.Tensor) -> Callable[[int], torch.Tensor]:
    """``d(j)``: the Euclidean distances of every row of ``feats`` ``[N, D]`` to row ``j``, bitwise equal to
    ``torch.cdist(feats, feats[j : j + 1]).flatten()``. For ``N > 25`` ``cdist`` (its default compute mode)
    multiplies the augmented rows ``[-2 x, |x|^2, 1]`` by ``[y, 1, |y|^2]``; building those once instead of
    at every call turns each pick's distances into one matrix-vector product."""
    n = feats.shape[0]
    if n <= 25:  # cdist computes the differences directly here: keep it (the pool is tiny anyway)
        return lambda j: torch.cdist(feats, feats[j : j + 1]).flatten()
    norms = feats.pow(2).sum(-1, keepdim=True)
    rows = torch.cat([feats.mul(-2), norms, torch.ones_like(norms)], -1)
    ones = feats.new_ones(1)
    return lambda j: rows.matmul(torch.cat([feats[j], ones, norms[j]])[:, None]).flatten().clamp_min_(0).sqrt_()


def kcenter_greedy(feats: torch.Tensor, centres: torch.Tensor, m: int, *, fast: bool = False) -> torch.Tensor:
    """Sener & Savarese (2018), Algorithm 1: ``m`` rows of ``feats`` chosen one at a time, each the farthest
    (Euclidean) from its nearest centre; ``centres`` ``[C, D]`` are the points already covered (may be empty).
    Returns indices into ``feats``. ``fast``: the per-pick distances from :func:`distances_to_row` (the same
    picks, bitwise the same distances)."""
    n = feats.shape[0]
    dmin = torch.full((n,), math.inf)
    for i in range(0, centres.shape[0], 1024):
        dmin = torch.minimum(dmin, torch.cdist(feats, centres[i : i + 1024]).min(dim=1).values)
    dist: Callable[[int], torch.Tensor] = (
        distances_to_row(feats) if fast else lambda j: torch.cdist(feats, feats[j : j + 1]).flatten())
    picked: list[int] = []
    for _ in range(min(m, n)):
        # with no centre yet every distance is infinite: start from the first point (the paper: a random one)
        j = int(dmin.argmax()) if math.isfinite(float(dmin.max())) else 0
        picked.append(j)
        dmin = torch.minimum(dmin, dist(j))
        dmin[j] = -1.0  # never twice
    return torch.tensor(picked, dtype=torch.long)


def select_batch(strategy: Select, m: int, candidates: torch.Tensor, probs: torch.Tensor, feats: torch.Tensor,
                 answered: torch.Tensor, *, gen: torch.Generator, fast: bool = True) -> torch.Tensor:
    """``m`` indices among ``candidates`` (pool indices not yet answered) by ``strategy``; ``probs`` and
    ``feats`` are the substitute's outputs on the whole pool and ``answered`` the pool indices already paid for."""
    m = min(m, candidates.numel())
    if strategy == "random":
        return candidates[torch.randperm(candidates.numel(), generator=gen)[:m]]
    if strategy == "entropy":
        return candidates[entropy(probs[candidates]).topk(m).indices]
    if strategy == "margin":
        return candidates[(-margin(probs[candidates])).topk(m).indices]
    if strategy == "kcenter":
        return candidates[kcenter_greedy(feats[candidates], feats[answered], m, fast=fast)]
    raise InputError(f"unknown selection {strategy!r}; expected one of {', '.join(SELECTIONS)}")


# --------------------------------------------------------------------------------------------------------
# Checkpoints of the rounds
# --------------------------------------------------------------------------------------------------------
def save_round(directory: Path, cache: AnswerCache, ledger: QueryLedger, state: dict[str, Any]) -> None:
    """Answered indices and answers (safetensors) and the round state with the ledger (JSON, written last)."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    idx = cache.answered_indices()
    assert cache.answers is not None
    with atomic_path(directory / "active.safetensors") as tmp:
        save_file({"indices": idx.contiguous(), "answers": cache.answers[idx].contiguous()}, str(tmp))
    atomic_write_json(directory / "active.json",
                      to_jsonable({"format": ACTIVE_FORMAT, "ledger": ledger.state_dict(), **state}))


def load_round(directory: Path, cache: AnswerCache, ledger: QueryLedger) -> dict[str, Any] | None:
    """Restore the last completed round into ``cache`` and ``ledger``; ``None`` if none was saved."""
    from safetensors.torch import load_file

    path = directory / "active.json"
    if not path.exists():
        return None
    meta = json.loads(path.read_text(encoding="utf-8"))
    if meta.get("format") != ACTIVE_FORMAT:
        raise InputError(f"{path} is not a stealkit active-selection checkpoint (format {meta.get('format')!r})")
    if meta.get("pool_size") != len(cache):
        raise InputError(f"{path} was saved for a pool of {meta.get('pool_size')} images, not {len(cache)}: "
                         "resume with the same --pool, --seed and budget")
    tensors = load_file(str(directory / "active.safetensors"))
    idx, answers = tensors["indices"].long(), tensors["answers"]
    cache.answers = torch.zeros((len(cache), *answers.shape[1:]), dtype=answers.dtype)
    cache.answers[idx] = answers
    cache.answered[idx] = True
    ledger.load_state_dict(meta["ledger"])
    return meta


# --------------------------------------------------------------------------------------------------------
# The rounds
# --------------------------------------------------------------------------------------------------------
def active_rounds(
    cache: AnswerCache,
    n: int,
    *,
    strategy: Select,
    config: ActiveConfig,
    train: Callable[[torch.Tensor, int], nn.Module],
    seed: int = 0,
    on_round: Callable[[nn.Module, dict[str, Any]], None] | None = None,
    checkpoint_dir: Path | None = None,
    resume: bool = False,
    device: str | torch.device = "cpu",
    first: Callable[[int], torch.Tensor] | None = None,
    identity: dict[str, Any] | None = None,
) -> tuple[torch.Tensor, dict[str, Any]]:
    """Query ``n`` distinct images of ``cache.x`` in rounds (ActiveThief, Algorithm 1); returns the answered
    indices and a trace (per round: queries, seconds spent training the substitute and selecting).

    ``train(indices, epochs)`` returns a fresh substitute trained on ``cache.x[indices]`` and their answers;
    ``on_round(substitute, record)`` sees each round's substitute (e.g. to score it). With ``checkpoint_dir``
    each round is saved; ``resume`` continues from the last saved round (see the module docstring).
    ``first(m)`` chooses the first round's ``m`` images (a cold start: ``extract_surrogate``'s ``first_round``);
    without it they are random. ``identity``: further settings the rounds depend on (e.g. the learning rate),
    saved with each round; a resume with other values is refused.
    """
    from stealkit.extract.journal import JournalOracle

    sizes = [n] if strategy == "random" else config.schedule(n)  # random needs no substitute
    gen = torch.Generator().manual_seed(seed)
    order = torch.randperm(len(cache), generator=gen)
    rounds: list[dict[str, Any]] = []
    start = 0
    journal = cache.oracle if isinstance(cache.oracle, JournalOracle) else None
    if checkpoint_dir is not None:
        checkpoint_dir.mkdir(parents=True, exist_ok=True)
    if checkpoint_dir is not None and resume:
        meta = load_round(checkpoint_dir, cache, cache.oracle.ledger)
        if meta is not None:
            if meta.get("sizes") != sizes or meta.get("strategy") != strategy:
                raise InputError(f"the checkpoint in {checkpoint_dir} was made with selection "
                                 f"{meta.get('strategy')} and rounds {meta.get('sizes')}, not {strategy} and "
                                 f"{sizes}: resume with the same settings")
            if meta.get("identity", identity) != identity:  # checkpoints from before identities match any
                raise InputError(f"the checkpoint in {checkpoint_dir} was made with {meta.get('identity')}, not "
                                 f"{identity}: resume with the same --set values")
            start, rounds = int(meta["round"]) + 1, list(meta["rounds"])
            gen.set_state(torch.tensor(meta["rng"], dtype=torch.uint8))
            log.info("resumed after round %d (%d images answered)", start - 1, cache.n_answered)
    for r in range(start, len(sizes)):
        if journal is not None and checkpoint_dir is not None:
            journal.open(checkpoint_dir / f"journal-{r}.bin", replay=resume and r == start)
        t0 = time.perf_counter()
        answered = cache.answered_indices()
        train_s = select_s = 0.0
        if r == 0:
            picked = order[: sizes[0]] if first is None else first(sizes[0])
            select_s = time.perf_counter() - t0
        else:
            substitute = train(answered, config.round_epochs)
            train_s = time.perf_counter() - t0
            t1 = time.perf_counter()
            candidates = (~cache.answered).nonzero().flatten()
            if strategy == "random":
                probs = feats = torch.empty(0)
            else:
                if 0 < config.candidates < candidates.numel():  # a random subset: the cost is the subset's
                    keep = torch.randperm(candidates.numel(), generator=gen)[: config.candidates]
                    candidates = candidates[keep.sort().values]
                probs, feats = score_subset(substitute, cache.x, torch.cat([candidates, answered]),
                                            batch=config.score_batch, device=device, fast=True)
            picked = select_batch(strategy, sizes[r], candidates, probs, feats, answered, gen=gen)
            select_s = time.perf_counter() - t1
            if on_round is not None:
                on_round(substitute, {"round": r, "answered": int(answered.numel())})
        cache.get(picked)
        rec = {"round": r, "selected": int(picked.numel()), "answered": cache.n_answered,
               "train_seconds": round(train_s, 3), "select_seconds": round(select_s, 3),
               "query_seconds": round(time.perf_counter() - t0 - train_s - select_s, 3)}
        rounds.append(rec)
        log.info("active round %d: %d selected, %d answered (train %.1f s, select %.1f s, query %.1f s)", r,
                 rec["selected"], rec["answered"], train_s, select_s, rec["query_seconds"])
        if checkpoint_dir is not None:
            save_round(checkpoint_dir, cache, cache.oracle.ledger,
                       {"round": r, "rounds": rounds, "sizes": sizes, "strategy": strategy,
                        "pool_size": len(cache), "rng": gen.get_state().tolist(), "identity": identity})
            if journal is not None:
                journal.close()
                (checkpoint_dir / f"journal-{r}.bin").unlink(missing_ok=True)
    if journal is not None:
        journal.close()
    return cache.answered_indices(), {"strategy": strategy, "sizes": sizes, "rounds": rounds}
