"""What the data-free attacks (DFME, MAZE, DaST, CoDFe) share: the iteration loop, answer handling, the
learning-rate schedules, checkpoint/resume and the generator-sample grid.

A method is a :class:`DataFreeAttack` (its state is real: a student, a generator, their optimisers and a
random generator) that knows its per-iteration query cost and how to take one iteration. :func:`run_datafree`
drives it until the budget cannot pay for another iteration, scores the student on the test split at fixed
query marks (the accuracy-against-queries curve) and records the losses per round (CoDFe Figure 3).

Checkpoints are safetensors + JSON, never pickles: model and optimiser tensors and the random-generator states
go to ``state-<iteration>.safetensors``; optimiser scalars, the ledger's ``state_dict()``, the iteration
counter, the curve and the loss records go to ``checkpoint.json`` (written last, atomically, so it always names
a complete state). Between checkpoints every victim answer is appended to ``journal-<iteration>.bin`` (a JSON
header per record plus raw bytes). A resumed run restores the checkpoint, then serves the journalled answers
instead of querying the victim again (their inputs are checked by digest) and charges them to the ledger, so
it ends with the same student and the same ledger counts as an uninterrupted run and never spends a query
twice. The journal is flushed after each record: it survives a killed process, not a power cut.
"""

from __future__ import annotations

import hashlib
import json
import logging
import math
import struct
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from stealkit.errors import InputError, StealkitError
from stealkit.extract.common import ExtractionResult, curve_point
from stealkit.fsutil import atomic_path, atomic_write_json, to_jsonable
from stealkit.metrics import Evaluator
from stealkit.oracle import Oracle, OutputMode
from stealkit.oracle.ledger import QueryKind, QueryLedger
from stealkit.progress import progress

log = logging.getLogger(__name__)

CHECKPOINT_FORMAT = "stealkit-datafree-checkpoint/1"


# -- schedules -------------------------------------------------------------------------------------------------
def multistep_factor(progress: float, milestones: tuple[float, ...], gamma: float) -> float:
    """``gamma ** (number of milestones passed)`` at ``progress`` in [0, 1] (DFME: 0.3 at 10/30/50%)."""
    return gamma ** sum(progress >= m for m in milestones)


def cosine_factor(progress: float) -> float:
    """Cosine annealing from 1 to 0 over the run (MAZE)."""
    return 0.5 * (1 + math.cos(math.pi * min(max(progress, 0.0), 1.0)))


def set_lr(opt: torch.optim.Optimizer, lr: float) -> None:
    for g in opt.param_groups:
        g["lr"] = lr


@dataclass
class DataFreeResult(ExtractionResult):
    """An :class:`ExtractionResult` that also carries generator samples for the report (not in the summary)."""

    samples: torch.Tensor | None = None


# -- the loop ---------------------------------------------------------------------------------------------------
@dataclass(frozen=True)
class LoopConfig:
    """How the shared loop runs a data-free attack.

    ``eval_every``: score the student every this many victim queries (plus at each of ``eval_at``);
    ``checkpoint_every``: iterations between checkpoints (0: never; needs a checkpoint directory);
    ``log_every``: iterations averaged into one loss record (``None``: about 200 records per run);
    ``max_iterations``: stop earlier than the budget; ``grid_samples``: generator samples in the report.
    """

    eval_every: int = 50_000
    eval_at: tuple[int, ...] = ()
    checkpoint_every: int = 100
    log_every: int | None = None
    max_iterations: int | None = None
    grid_samples: int = 32

    def __post_init__(self) -> None:
        if self.eval_every < 1:
            raise InputError(f"eval_every must be a positive number of queries, got {self.eval_every}")
        if self.checkpoint_every < 0:
            raise InputError(f"checkpoint_every must be >= 0, got {self.checkpoint_every}")
        if self.max_iterations is not None and self.max_iterations < 1:
            raise InputError(f"max_iterations must be positive, got {self.max_iterations}")


QueryFn = Callable[[torch.Tensor], torch.Tensor]


class DataFreeAttack:
    """Base class of the data-free methods: a student, a generator, named optimisers and one RNG.

    Subclasses set ``name``, build :attr:`student`, :attr:`generator` and :attr:`optimizers`, and implement
    :meth:`iteration_cost` (victim queries one iteration spends: the cost formula the tests check against the
    ledger) and :meth:`step`. Extra state (a replay buffer, a fixed noise set, an adaptive weight) is exposed
    through :meth:`extra_tensors` / :meth:`extra_scalars` and restored by :meth:`load_extra`.
    """

    name = "datafree"

    def __init__(self, *, input_shape: tuple[int, int, int], num_classes: int, mode: OutputMode, seed: int,
                 device: str = "cpu") -> None:
        self.input_shape = tuple(int(s) for s in input_shape)
        self.num_classes = int(num_classes)
        self.mode = OutputMode.parse(mode)
        self.seed = int(seed)
        self.device = device
        self.rng = torch.Generator().manual_seed(seed)
        self.student: nn.Module = nn.Identity()
        self.generator: nn.Module = nn.Identity()
        self.optimizers: dict[str, torch.optim.Optimizer] = {}

    # -- what subclasses implement ------------------------------------------------------------------------
    def iteration_cost(self) -> int:
        raise NotImplementedError

    def step(self, query: QueryFn, progress: float) -> dict[str, float]:
        """One iteration; ``progress`` in [0, 1) drives the learning-rate schedule. Returns its losses."""
        raise NotImplementedError

    def extra_tensors(self) -> dict[str, torch.Tensor]:
        return {}

    def extra_scalars(self) -> dict[str, Any]:
        return {}

    def load_extra(self, tensors: dict[str, torch.Tensor], scalars: dict[str, Any]) -> None:
        return None

    def sample_images(self, n: int) -> torch.Tensor:
        """``n`` generator samples for the report, drawn with a fixed seed and without touching any state."""
        import copy

        gen = copy.deepcopy(self.generator)
        z = torch.randn(n, gen.nz, generator=torch.Generator().manual_seed(12345)).to(self.device)
        with torch.no_grad():
            if hasattr(gen, "sample_labels"):
                labels = torch.arange(n, device=self.device) % self.num_classes
                return gen(z, labels).cpu()
            return gen(z).cpu()

    # -- shared helpers ------------------------------------------------------------------------------------
    def noise(self, n: int, nz: int) -> torch.Tensor:
        return torch.randn(n, nz, generator=self.rng).to(self.device)

    def modules(self) -> dict[str, nn.Module]:
        return {"student": self.student, "generator": self.generator}


# -- journal: victim answers since the last checkpoint --------------------------------------------------------
def digest(x: torch.Tensor) -> str:
    arr = np.ascontiguousarray(x.detach().cpu().float().numpy())
    return hashlib.sha256(arr.tobytes()).hexdigest()[:32]


def _write_record(fh: Any, dig: str, answer: torch.Tensor) -> None:
    arr = np.ascontiguousarray(answer.detach().cpu().numpy())
    header = json.dumps({"digest": dig, "dtype": arr.dtype.str, "shape": list(arr.shape)}).encode()
    fh.write(struct.pack("<II", len(header), arr.nbytes) + header + arr.tobytes())
    fh.flush()


def read_journal(path: Path) -> list[tuple[str, torch.Tensor, int, int]]:
    """The complete records of a journal as (digest, answer, start, end offsets); a torn last one is dropped."""
    records: list[tuple[str, torch.Tensor, int, int]] = []
    if not path.exists():
        return records
    data = path.read_bytes()
    pos = 0
    while pos + 8 <= len(data):
        hlen, nbytes = struct.unpack("<II", data[pos : pos + 8])
        end = pos + 8 + hlen + nbytes
        if end > len(data):
            break
        try:
            header = json.loads(data[pos + 8 : pos + 8 + hlen])
            dtype = np.dtype(header["dtype"])
            if dtype.kind not in "iuf":
                raise ValueError(f"unexpected dtype {dtype}")
            arr = np.frombuffer(data[pos + 8 + hlen : end], dtype=dtype).reshape(header["shape"]).copy()
        except (ValueError, KeyError, json.JSONDecodeError):
            break
        records.append((str(header["digest"]), torch.from_numpy(arr), pos, end))
        pos = end
    return records


class JournalOracle:
    """Wraps an oracle: appends every answer to a journal and, after a resume, replays journalled answers.

    Replayed answers are charged to the ledger (they were paid for before the interruption and the restored
    ledger predates them) but never sent to the victim. Satisfies the :class:`~stealkit.oracle.Oracle`
    protocol, so the attacks cannot tell it from the oracle it wraps.
    """

    def __init__(self, oracle: Oracle) -> None:
        self.inner = oracle
        self.num_classes = oracle.num_classes
        self.input_shape = oracle.input_shape
        self.mode = oracle.mode
        self.replayed = 0
        self.live = 0
        self._pending: list[tuple[str, torch.Tensor, int, int]] = []
        self._fh: Any = None

    @property
    def ledger(self) -> QueryLedger:
        return self.inner.ledger

    def open(self, journal: Path, *, replay: bool) -> None:
        """Start writing ``journal``; with ``replay``, first serve the complete records it already holds."""
        self.close()
        self._pending = read_journal(journal) if replay else []
        if not journal.exists():
            journal.write_bytes(b"")
        self._fh = open(journal, "r+b")  # noqa: SIM115 - kept open for the run
        self._truncate(self._pending[-1][3] if self._pending else 0)

    def _truncate(self, end: int) -> None:
        self._fh.truncate(end)  # drop a torn or unusable tail before appending after it
        self._fh.seek(end)

    def close(self) -> None:
        if self._fh is not None:
            self._fh.close()
            self._fh = None

    def query(self, x: torch.Tensor) -> torch.Tensor:
        dig = digest(x) if self._fh is not None else ""
        if self._pending:
            want, answer, start, _ = self._pending[0]
            if want == dig:
                self._pending.pop(0)
                self.ledger.charge(QueryKind.PREDICT, int(x.shape[0]))
                self.replayed += int(x.shape[0])
                return answer.clone()
            log.warning("resumed run diverged from its journal (%d answers unused); querying the victim",
                        len(self._pending))
            self._truncate(start)
            self._pending = []
        answer = self.inner.query(x)
        self.live += int(x.shape[0])
        if self._fh is not None:
            _write_record(self._fh, dig, answer)
        return answer


# -- checkpoints --------------------------------------------------------------------------------------------------
def _optimizer_split(opt: torch.optim.Optimizer, prefix: str) -> tuple[dict[str, torch.Tensor], dict[str, Any]]:
    sd = opt.state_dict()
    tensors: dict[str, torch.Tensor] = {}
    scalars: dict[str, Any] = {"param_groups": sd["param_groups"], "state": {}}
    for pid, st in sd["state"].items():
        scalars["state"][str(pid)] = {}
        for k, v in st.items():
            if isinstance(v, torch.Tensor):
                tensors[f"{prefix}.{pid}.{k}"] = v
                scalars["state"][str(pid)][k] = {"tensor": f"{prefix}.{pid}.{k}"}
            else:
                scalars["state"][str(pid)][k] = {"value": v}
    return tensors, scalars


def _optimizer_join(scalars: dict[str, Any], tensors: dict[str, torch.Tensor]) -> dict[str, Any]:
    state: dict[int, dict[str, Any]] = {}
    for pid, st in scalars["state"].items():
        state[int(pid)] = {k: tensors[v["tensor"]] if "tensor" in v else v["value"] for k, v in st.items()}
    return {"state": state, "param_groups": scalars["param_groups"]}


def save_checkpoint(directory: Path, attack: DataFreeAttack, loop_state: dict[str, Any],
                    ledger: QueryLedger) -> tuple[Path, Path]:
    """Write the attack's full state; returns (weights file, fresh journal file) the new checkpoint names."""
    from safetensors.torch import save_file

    directory.mkdir(parents=True, exist_ok=True)
    it = int(loop_state["iteration"])
    tensors: dict[str, torch.Tensor] = {}
    for name, module in attack.modules().items():
        for k, v in module.state_dict().items():
            tensors[f"module.{name}.{k}"] = v
    optim_scalars: dict[str, Any] = {}
    for name, opt in attack.optimizers.items():
        t, s = _optimizer_split(opt, f"optim.{name}")
        tensors.update(t)
        optim_scalars[name] = s
    tensors["rng.attack"] = attack.rng.get_state()
    tensors["rng.torch"] = torch.get_rng_state()
    for k, v in attack.extra_tensors().items():
        tensors[f"extra.{k}"] = v
    tensors = {k: v.detach().cpu().contiguous().clone() for k, v in tensors.items()}
    weights = directory / f"state-{it}.safetensors"
    with atomic_path(weights) as tmp:
        save_file(tensors, str(tmp))
    journal = directory / f"journal-{it}.bin"
    journal.write_bytes(b"")
    meta = {
        "format": CHECKPOINT_FORMAT,
        "method": attack.name,
        "weights": weights.name,
        "journal": journal.name,
        "ledger": ledger.state_dict(),
        "optimizers": optim_scalars,
        "extra": attack.extra_scalars(),
        "saved": time.time(),
        **loop_state,
    }
    atomic_write_json(directory / "checkpoint.json", to_jsonable(meta))
    for old in list(directory.glob("state-*.safetensors")) + list(directory.glob("journal-*.bin")):
        if old.name not in (weights.name, journal.name):
            old.unlink(missing_ok=True)
    return weights, journal


def load_checkpoint(directory: Path, attack: DataFreeAttack, ledger: QueryLedger) -> dict[str, Any]:
    """Restore a checkpoint into ``attack`` and ``ledger``; returns its JSON part (loop state, journal name)."""
    from safetensors.torch import load_file

    path = directory / "checkpoint.json"
    if not path.exists():
        raise InputError(f"no checkpoint in {directory}; run without --resume to start afresh")
    meta = json.loads(path.read_text(encoding="utf-8"))
    if meta.get("format") != CHECKPOINT_FORMAT:
        raise InputError(f"{path} is not a stealkit data-free checkpoint (format {meta.get('format')!r})")
    if meta.get("method") != attack.name:
        raise InputError(f"{path} is a {meta.get('method')} checkpoint; resume it with `extract {meta.get('method')}`")
    tensors = load_file(str(directory / meta["weights"]))
    for name, module in attack.modules().items():
        pre = f"module.{name}."
        module.load_state_dict({k[len(pre):]: v.to(attack.device) for k, v in tensors.items() if k.startswith(pre)})
    for name, opt in attack.optimizers.items():
        opt.load_state_dict(_optimizer_join(meta["optimizers"][name], tensors))
    attack.rng.set_state(tensors["rng.attack"])
    torch.set_rng_state(tensors["rng.torch"])
    attack.load_extra({k[6:]: v for k, v in tensors.items() if k.startswith("extra.")}, meta.get("extra", {}))
    ledger.load_state_dict(meta["ledger"])
    return meta


# -- driver ------------------------------------------------------------------------------------------------------
def planned_iterations(attack: DataFreeAttack, oracle: Oracle, loop: LoopConfig) -> int:
    left = oracle.ledger.remaining()
    cost = attack.iteration_cost()
    if left is None and loop.max_iterations is None:
        raise InputError("an unlimited oracle needs max_iterations (or give the oracle a --budget)")
    n = loop.max_iterations if left is None else left // cost
    if loop.max_iterations is not None:
        n = min(n, loop.max_iterations)
    if n < 1:
        raise InputError(f"one {attack.name} iteration costs {cost} queries but the budget allows only {left}; "
                         "raise --budget or lower the batch size")
    return int(n)


def _eval_marks(loop: LoopConfig, total_queries: int) -> list[int]:
    marks = set(range(loop.eval_every, total_queries + 1, loop.eval_every)) | {m for m in loop.eval_at if m > 0}
    return sorted(marks)


def run_datafree(
    attack: DataFreeAttack,
    oracle: Oracle,
    *,
    evaluator: Evaluator | None,
    loop: LoopConfig,
    checkpoint_dir: str | Path | None = None,
    resume: bool = False,
    on_point: Callable[[dict[str, Any]], None] | None = None,
    on_losses: Callable[[dict[str, Any]], None] | None = None,
    config: dict[str, Any] | None = None,
) -> DataFreeResult:
    """Run ``attack`` against ``oracle`` until the budget (or ``max_iterations``) is spent.

    With ``checkpoint_dir`` the state is saved every ``loop.checkpoint_every`` iterations and at the end, and
    every answer is journalled; ``resume=True`` continues from the saved state (see the module docstring).
    """
    ckpt = Path(checkpoint_dir) if checkpoint_dir is not None else None
    if resume and ckpt is None:
        raise InputError("resuming needs the checkpoint directory of the stopped run")
    state: dict[str, Any] = {"iteration": 0, "curve": [], "losses": [], "planned": None, "elapsed": 0.0,
                             "config": to_jsonable(config or {})}
    journal: Path | None = None
    if resume and ckpt is not None and (ckpt / "checkpoint.json").exists():
        meta = load_checkpoint(ckpt, attack, oracle.ledger)
        if config is not None and meta.get("config") not in (None, to_jsonable(config)):
            raise InputError(f"the checkpoint in {ckpt} was made with a different configuration; resume with the "
                             "same options, or start a new run in another --out")
        state.update({k: meta[k] for k in ("iteration", "curve", "losses", "planned", "elapsed") if k in meta})
        journal = ckpt / meta["journal"]
        log.info("resumed %s at iteration %d (%s queries)", attack.name, state["iteration"], oracle.ledger.as_dict())
    elif resume:
        log.warning("no checkpoint in %s yet: starting afresh", ckpt)
    if state["planned"] is None:
        state["planned"] = planned_iterations(attack, oracle, loop)
    planned = int(state["planned"])
    cost = attack.iteration_cost()
    journaled = JournalOracle(oracle)
    if ckpt is not None:
        if journal is None:
            _, journal = save_checkpoint(ckpt, attack, state, oracle.ledger)
        journaled.open(journal, replay=True)
    log_every = loop.log_every or max(1, planned // 200)
    counted = sum(oracle.ledger.as_dict().values())
    marks = [m for m in _eval_marks(loop, counted + cost * (planned - state["iteration"]))
             if not state["curve"] or m > state["curve"][-1]["queries"]]
    acc: dict[str, list[float]] = {}
    started = time.perf_counter() - float(state["elapsed"])
    bar = progress(total=planned, initial=state["iteration"], desc=attack.name, unit="it")
    try:
        while state["iteration"] < planned:
            left = oracle.ledger.remaining()
            if left is not None and left < cost:
                break
            losses = attack.step(journaled.query, state["iteration"] / planned)
            state["iteration"] += 1
            bar.update(1)
            for k, v in losses.items():
                acc.setdefault(k, []).append(v)
            if state["iteration"] % log_every == 0 or state["iteration"] == planned:
                rec = {"iteration": state["iteration"], "queries": sum(oracle.ledger.as_dict().values()),
                       **{k: float(np.mean(v)) for k, v in acc.items()}}
                state["losses"].append(rec)
                acc = {}
                if on_losses is not None:
                    on_losses(rec)
                bar.set_postfix({k: f"{v:.3g}" for k, v in rec.items() if k not in ("iteration", "queries")})
            total = sum(oracle.ledger.as_dict().values())
            if marks and total >= marks[0] and evaluator is not None:
                while marks and total >= marks[0]:
                    marks.pop(0)
                point = curve_point(oracle, evaluator, attack.student, iteration=state["iteration"],
                                    seconds=round(time.perf_counter() - started, 2))
                state["curve"].append(point)
                log.info("%s: %d queries, accuracy %.4f", attack.name, total, point["accuracy"])
                if on_point is not None:
                    on_point(point)
            if ckpt is not None and loop.checkpoint_every and state["iteration"] % loop.checkpoint_every == 0:
                state["elapsed"] = time.perf_counter() - started
                _, journal = save_checkpoint(ckpt, attack, state, oracle.ledger)
                journaled.open(journal, replay=False)
    finally:
        bar.close()
        journaled.close()
    total = sum(oracle.ledger.as_dict().values())
    if evaluator is not None and (not state["curve"] or state["curve"][-1]["queries"] != total):
        point = curve_point(oracle, evaluator, attack.student, iteration=state["iteration"],
                            seconds=round(time.perf_counter() - started, 2))
        state["curve"].append(point)
        if on_point is not None:
            on_point(point)
    state["elapsed"] = time.perf_counter() - started
    if ckpt is not None:
        save_checkpoint(ckpt, attack, state, oracle.ledger)
    final = state["curve"][-1] if state["curve"] else {"accuracy": None, "fidelity": None}
    samples = attack.sample_images(loop.grid_samples) if loop.grid_samples > 0 else None
    return DataFreeResult(
        method=attack.name,
        student=attack.student,
        queries=oracle.ledger.as_dict(),
        accuracy=final["accuracy"],
        fidelity=final["fidelity"],
        victim_accuracy=evaluator.victim_accuracy if evaluator is not None else None,
        curve=state["curve"],
        extra={"mode": attack.mode.value, "iterations": state["iteration"], "planned_iterations": planned,
               "cost_per_iteration": cost, "losses": state["losses"], "seconds": round(state["elapsed"], 2),
               "replayed_queries": journaled.replayed},
        samples=samples,
    )


def check_positive(who: str, **values: float) -> None:
    for k, v in values.items():
        if not v > 0:
            raise InputError(f"{who}: {k} must be positive, got {v}")


def needs_probabilities(method: str, mode: OutputMode, label_smoothing: float) -> None:
    """Refuse the label-only adaptation of a probability method when it is switched off."""
    if mode is OutputMode.LABEL and not label_smoothing > 0:
        raise StealkitError(f"{method} needs probabilities; for its label-only adaptation pass a label smoothing "
                            "> 0 (e.g. --label-smoothing 0.1), or query with --mode probs")
