"""Surrogate-data extraction against ART's KnockoffNets and CopycatCNN, side by side in one run.

Victim: ``standard_victim("fmnist-conv2")`` (the anchors' 2-conv + 2-dense Fashion-MNIST CNN, about 0.90).
Every attack queries the same attacker pool (Fashion-MNIST train[50k:]) and trains the same student
architecture; each budget gets a fresh oracle. Our query counts come from the ledger; ART keeps none, so its
victim is wrapped in a module that counts the images it is asked about.

ART configurations (the anchors' set, listed in docs/notebook/benchmarks.md): KnockoffNets random and adaptive with labels, CopycatCNN with labels,
KnockoffNets ``use_probability=True`` against a victim returning logits and against one returning softmax.
ART is a benchmark-only extra: ``pip install adversarial-robustness-toolbox==1.20.1``.

Equal footing (issue 20, item 7): by default every tool trains the same student architecture (``--student``)
for the same number of epochs (``--epochs``; ART's ``nb_epochs`` follows it unless ``--art-epochs`` is given),
with the same batch size (``--batch-size``, also ART's ``batch_size_fit``) and the same student initialisation
(seeded alike). ART's random-selection attacks (KnockoffNets random, CopycatCNN) are given exactly the images
our random strategy queries (the first ``budget`` images of the pool in the seed's order), so both train on the
same data; the adaptive policies choose from the whole pool. What still differs is each tool's optimiser:
ours SGD with a one-cycle schedule (max lr 0.1), ART's thief Adam 1e-3 (as in the anchors). ``--art-epochs 10``
reproduces the anchors' ART default; the JSON records whether the run was equalised.

Every row states the optimiser steps its student took (``student_steps``: ours from the configuration, ART's
counted on its thief's optimiser) and which images it queried (``images``). ``--art-search`` gives ART's thief a
search over its learning rate and schedule (``ART_SEARCH``), chosen on pool images the row did not query (true
labels), never the test split; each image is paid for once across the candidates (random-selection attacks only:
the adaptive policy's queries depend on the thief). ``--active`` (below) compares the command's default, resolved
exactly as ``stealkit extract surrogate`` resolves it, with ART at equal epochs (``art``) or equal optimiser steps
(``art-steps``).

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/surrogate_extraction.py            # full (1k and 10k)
    .venv/bin/python benchmarks/surrogate_extraction.py --quick                      # smoke run on digits

Prints one JSON object: the settings, and one row per (attack, budget).
"""

from __future__ import annotations

import argparse
import json
import logging
import math
import os
import platform
import sys
import time
from pathlib import Path
from typing import Any

import torch
from torch import nn

from stealkit.commands.common import parse_kv
from stealkit.data import load_query_source
from stealkit.extract.common import pool_holdout, student_factory
from stealkit.extract.surrogate_data.knockoff import KnockoffConfig
from stealkit.extract.surrogate_data.run import SurrogateOptions, resolve_surrogate
from stealkit.extract.surrogate_data.surrogate import SurrogateConfig, extract_surrogate
from stealkit.metrics import Evaluator
from stealkit.oracle.victim import make_evaluator, open_victim, victim_splits
from stealkit.victims import standard_victim

log = logging.getLogger("bench.surrogate")

#: the command's own defaults (``stealkit extract surrogate`` with nothing but a budget): epochs and batch size
CLI_DEFAULTS = {"epochs": SurrogateOptions().epochs, "batch_size": SurrogateOptions().batch_size}
#: ``--art-search``: ART's thief learning rates and schedules (Adam; per-epoch cosine annealing or constant)
ART_SEARCH = tuple((lr, schedule) for lr in (1e-3, 3e-3, 1e-2) for schedule in ("constant", "cosine"))


class CountingModel(nn.Module):
    """Wraps a victim for ART and counts every image it answers (ART keeps no query count). After
    :meth:`replay` (a search's later candidates) an image answered before is answered from memory, unpaid."""

    def __init__(self, model: nn.Module, softmax: bool) -> None:
        super().__init__()
        self.model, self.softmax, self.count = model, softmax, 0
        self.memo: dict[bytes, torch.Tensor] = {}
        self.replaying = False

    def replay(self) -> None:
        self.replaying = True

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        keys = [row.numpy().tobytes() for row in x.detach().cpu().reshape(x.shape[0], -1)]
        if self.replaying and all(k in self.memo for k in keys):
            return torch.stack([self.memo[k] for k in keys]).to(x.device)
        if self.replaying:  # an image not answered before: paid for
            self.count += len({k for k in keys if k not in self.memo})
        else:
            self.count += int(x.shape[0])
        out = self.model(x)
        out = torch.softmax(out, dim=1) if self.softmax else out
        for k, o in zip(keys, out.detach(), strict=True):
            self.memo.setdefault(k, o)
        return out


def images_rule(config: SurrogateConfig, budget: int) -> str:
    """Which images an ours row queried, in words."""
    if config.strategy == "knockoff":
        return f"Knockoff Nets' adaptive policy over the whole pool, {budget} images"
    if config.select == "random":
        return f"random: the seed's first {budget} images of the pool"
    return (f"{config.select}: {config.active.initial:.0%} of {budget} at random, the rest in {config.active.rounds} "
            f"rounds by the round substitute's {config.select}")


def ours(name: str, victim_dir: str, mode: str, pool: torch.Tensor, labels: torch.Tensor, budget: int,
         evaluator: Evaluator, args: argparse.Namespace, strategy: str) -> dict[str, Any]:
    v = open_victim(victim_dir, mode=mode, budget=budget)
    config = SurrogateConfig(max_distinct=budget, tau=args.tau, epochs=args.epochs, batch_size=args.batch_size,
                             schedule=args.schedule, strategy=strategy,  # type: ignore[arg-type]
                             knockoff=KnockoffConfig(step_batch=args.knockoff_step), seed=args.seed)
    t0 = time.perf_counter()
    r = extract_surrogate(v.oracle, pool, make_student=student_factory(args.student, v, args.seed), config=config,
                          evaluator=evaluator, pool_labels=labels)
    return {"attack": name, "budget": budget, "seed": args.seed, "accuracy": r.accuracy, "fidelity": r.fidelity,
            "queries": r.queries["predict"], "epochs": args.epochs, "batch_size": args.batch_size,
            "student_steps": r.extra["steps"], "images": images_rule(config, budget),
            "seconds": round(time.perf_counter() - t0, 1)}


def art(name: str, victim_model: nn.Module, pool: torch.Tensor, labels: torch.Tensor, budget: int,
        evaluator: Evaluator, args: argparse.Namespace, input_shape: tuple[int, ...], k: int) -> dict[str, Any]:
    """One ART attack. Random-selection attacks get exactly the images ours queries (see the module doc). A
    name ending in ``-defaults`` runs it with ART's own defaults (``nb_epochs=10, batch_size_fit=1,
    batch_size_query=1``) instead of the equal training: a second row, never the comparison; ``-steps``: as many
    epochs as give the thief our default's optimiser steps (``args.art_steps_epochs``, set by ``--active``). With
    ``args.art_search`` the thief's learning rate and schedule are chosen over ``ART_SEARCH`` on pool images the
    row did not query (their true labels), never the test split; the row reports the chosen one's test scores."""
    import numpy as np
    from art.attacks.extraction import CopycatCNN, KnockoffNets

    own = name.endswith("-defaults")
    steps_kind = name.endswith("-steps")
    base = name.removesuffix("-defaults").removesuffix("-steps")
    softmax = base.endswith("softmax")
    counter = CountingModel(victim_model, softmax)
    epochs = 10 if own else (args.art_steps_epochs if steps_kind else args.art_epochs)
    batch = 1 if own else args.art_batch
    common = {"batch_size_fit": batch, "batch_size_query": 1 if own else 256, "nb_epochs": epochs,
              "nb_stolen": budget}
    adaptive = "adaptive" in base
    held_x = held_y = None
    if not adaptive:  # same images as ours: the seed's first `budget` of the pool, all of them stolen
        order = torch.randperm(pool.shape[0], generator=torch.Generator().manual_seed(args.seed))
        rest = order[budget : budget + args.art_holdout]  # never queried by this row: the search's holdout
        held_x, held_y = pool[rest], labels[rest]
        pool, labels = pool[order[:budget]], labels[order[:budget]]
    search = bool(getattr(args, "art_search", False)) and not own and not adaptive and held_x is not None \
        and held_x.shape[0] > 0
    candidates = ART_SEARCH if search else ((1e-3, "constant"),)
    x, y = pool.numpy(), np.eye(k, dtype=np.float32)[labels.numpy()]
    tried, best = [], None
    t0 = time.perf_counter()
    for lr, schedule in candidates:
        np.random.seed(args.seed)
        torch.manual_seed(args.seed)
        victim = _classifier(counter, input_shape, k)
        thief, steps = _thief(args, input_shape, k, lr, schedule)
        if base.startswith("art-copycat"):
            attack = CopycatCNN(victim, **common)
        else:
            attack = KnockoffNets(victim, sampling_strategy="adaptive" if adaptive else "random", verbose=False,
                                  use_probability="prob" in base, **common)
        model = attack.extract(x, y=y, thieved_classifier=thief).model.eval()
        counter.replay()  # later candidates: the images answered already cost nothing again
        record = {"lr": lr, "schedule": schedule, "steps": steps[0]}
        if search:
            assert held_x is not None and held_y is not None
            with torch.no_grad():
                record["holdout_accuracy"] = float((model(held_x).argmax(1) == held_y).float().mean())
        tried.append(record)
        if best is None or record.get("holdout_accuracy", 0.0) > best[0].get("holdout_accuracy", 0.0):
            best = (record, model)
    assert best is not None
    chosen, model = best
    scores = evaluator(model)
    row = {"attack": name, "budget": budget, "seed": args.seed, **scores, "queries": counter.count,
           "epochs": epochs, "batch_size": batch, "student_steps": chosen["steps"], "lr": chosen["lr"],
           "schedule": chosen["schedule"],
           "images": (f"ART's adaptive policy over the whole pool, {budget} images" if adaptive else
                      f"random: the seed's first {budget} images of the pool (the same as ours)"),
           "seconds": round(time.perf_counter() - t0, 1)}
    if search:
        row["search"] = {"holdout": int(held_x.shape[0]) if held_x is not None else 0, "tried": tried}
    return row


def _classifier(model: nn.Module, input_shape: tuple[int, ...], k: int) -> Any:
    from art.estimators.classification import PyTorchClassifier

    return PyTorchClassifier(model, loss=nn.CrossEntropyLoss(), input_shape=input_shape, nb_classes=k,
                             clip_values=(0.0, 1.0))


def _thief(args: argparse.Namespace, input_shape: tuple[int, ...], k: int, lr: float,
           schedule: str) -> tuple[Any, list[int]]:
    """ART's thief (Adam at ``lr``, as in the anchors at 1e-3), seeded like our student; with ``schedule`` cosine,
    its learning rate is annealed per epoch of every fit; and a one-element list counting its optimiser steps."""
    from art.estimators.classification import PyTorchClassifier

    class Thief(PyTorchClassifier):  # type: ignore[misc]
        def fit(self, x: Any, y: Any, batch_size: int = 128, nb_epochs: int = 10, **kwargs: Any) -> None:
            if schedule == "cosine" and kwargs.get("scheduler") is None:
                kwargs["scheduler"] = torch.optim.lr_scheduler.CosineAnnealingLR(self._optimizer, T_max=nb_epochs)
            super().fit(x, y, batch_size=batch_size, nb_epochs=nb_epochs, **kwargs)

    student = student_factory(args.student, _Shape(input_shape, k), args.seed)()
    optimizer = torch.optim.Adam(student.parameters(), lr=lr)
    steps = [0]

    def count(*_: Any) -> None:
        steps[0] += 1

    optimizer.register_step_post_hook(count)
    thief = Thief(student, loss=nn.CrossEntropyLoss(), optimizer=optimizer, input_shape=input_shape, nb_classes=k,
                  clip_values=(0.0, 1.0))
    return thief, steps


class _Shape:
    """What :func:`student_factory` reads from a victim: its input shape and class count."""

    def __init__(self, input_shape: tuple[int, ...], k: int) -> None:
        self.input_shape, self.num_classes = input_shape, k


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--victim", default="fmnist-conv2", help="standard victim name")
    p.add_argument("--budgets", default="1000,10000")
    p.add_argument("--student", default="conv2")
    p.add_argument("--tau", type=float, default=1.0)
    p.add_argument("--epochs", type=int, default=CLI_DEFAULTS["epochs"])
    p.add_argument("--batch-size", type=int, default=CLI_DEFAULTS["batch_size"])
    p.add_argument("--schedule", default="cyclic", choices=["cyclic", "step"])
    p.add_argument("--knockoff-step", type=int, default=16)
    p.add_argument("--art-epochs", type=int, default=None,
                   help="thief epochs of the ART attacks (default: --epochs, the equalised setting; anchors: 10)")
    p.add_argument("--art-batch", type=int, default=None, help="ART's batch_size_fit (default: --batch-size)")
    _art_search_options(p)
    p.add_argument("--attacks", default="all",
                   help="comma list of: ours-probs, ours-probs-knockoff, ours-label, art-knockoff-random, "
                        "art-knockoff-adaptive, art-copycat, art-knockoff-prob-logits, art-knockoff-prob-softmax")
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--seeds", default=None, help="comma list of seeds, each a full repetition (overrides --seed)")
    p.add_argument("--jsonl", default=None, help="also append each row to this file as soon as it is measured")
    p.add_argument("--quick", action="store_true", help="smoke run: digits victim, budgets 100,300, 5 epochs")
    args = p.parse_args(argv)
    if args.quick:
        args.victim, args.budgets, args.epochs = "digits-conv2", "100,300", 5  # ART follows --epochs
    if args.art_epochs is None:
        args.art_epochs = args.epochs
    if args.art_batch is None:
        args.art_batch = args.batch_size
    equalised = args.art_epochs == args.epochs and args.art_batch == args.batch_size
    seeds = [int(x) for x in args.seeds.split(",")] if args.seeds else [args.seed]
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    budgets = [int(b) for b in args.budgets.split(",")]
    trained = standard_victim(args.victim)
    v = open_victim(trained.path, mode="probs")
    splits = victim_splits(v)
    evaluator = make_evaluator(v, splits.test.x, splits.test.y)
    all_attacks = ["ours-probs", "ours-probs-knockoff", "ours-label", "art-knockoff-random",
                   "art-knockoff-adaptive", "art-copycat", "art-knockoff-prob-logits", "art-knockoff-prob-softmax"]
    attacks = all_attacks if args.attacks == "all" else args.attacks.split(",")
    rows = []
    for seed in seeds:
        args.seed = seed
        pool = load_query_source("pool", input_shape=v.input_shape, n=None, seed=seed, victim_dataset=v.dataset)
        pool_ds = splits.attacker_pool  # labels of the same images, for the adaptive policies' actions
        order = torch.randperm(len(pool_ds), generator=torch.Generator().manual_seed(seed))
        labels = pool_ds.y[order]
        assert torch.equal(pool_ds.x[order], pool), "pool and labels out of step"
        rows += run_seed(args, attacks, budgets, trained, v, pool, labels, evaluator)
    out = {"benchmark": "surrogate_extraction", "victim": args.victim,
           "victim_accuracy": evaluator.victim_accuracy, "equalised": equalised, "seeds": seeds,
           "settings": vars(args),
           "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(),
                       "cpus": os.cpu_count(), "load_average": os.getloadavg(),
                       "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS")},
           "rows": rows}
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


def run_seed(args: argparse.Namespace, attacks: list[str], budgets: list[int], trained: Any, v: Any,
             pool: torch.Tensor, labels: torch.Tensor, evaluator: Evaluator) -> list[dict[str, Any]]:
    rows = []
    for budget in budgets:
        for name in attacks:
            log.info("%s at %d queries, seed %d", name, budget, args.seed)
            if name.startswith("ours"):
                mode = "label" if name == "ours-label" else "probs"
                strategy = "knockoff" if "knockoff" in name else "random"
                row = ours(name, str(trained.path), mode, pool, labels, budget, evaluator, args, strategy)
            else:
                row = art(name, trained.model, pool, labels, budget, evaluator, args, tuple(v.input_shape),
                          v.num_classes)
            log.info("%s", row)
            rows.append(row)
            if args.jsonl:
                with open(args.jsonl, "a", encoding="utf-8") as fh:
                    fh.write(json.dumps(row) + "\n")
    return rows


# --------------------------------------------------------------------------------------------------------
# Active selection and FixMatch (docs/notebook/surrogate-active.md): ``--active`` runs this part instead of main()
# --------------------------------------------------------------------------------------------------------
ACTIVE_ROWS = {  # row -> (select, ssl); "ours-default" is the command's default, resolved as the command does
    "ours-plain": ("random", "none"),
    "ours-ssl": ("random", "fixmatch"),
    "ours-active": ("kcenter", "none"),
}
COMBO_KEYS = ("select", "ssl")


def row_combo(row_name: str, budget: int = 10**9, num_classes: int = 10, mode: str = "label") -> dict[str, Any]:
    """The settings of an ``ours`` row other than ``ours-default``: a name of ``ACTIVE_ROWS``, ``ours-preset-NAME``
    (a named preset, ``ours-preset-paper``) or ``SELECT/SSL`` (e.g. ``margin/none``); what is not given is plain."""
    from stealkit.extract.surrogate_data.presets import resolve_preset

    if row_name.startswith("ours-preset-"):
        return resolve_preset(row_name.removeprefix("ours-preset-"), budget, num_classes, mode=mode)[1]
    parts = row_name.split("/") if "/" in row_name else list(ACTIVE_ROWS[row_name])
    return {**dict(zip(COMBO_KEYS, ("random", "none"), strict=True)), **dict(zip(COMBO_KEYS, parts, strict=False))}


ART_ROWS = {"label": ["art-knockoff-random", "art-knockoff-adaptive", "art-copycat"],
            "probs": ["art-knockoff-prob-softmax"]}
ART_KINDS = ("", "-defaults", "-steps")


def art_rows(row: str, mode: str) -> list[str]:
    """The ART attacks a ``--rows`` entry names for ``mode``: ``art`` (all, equal epochs), ``art-steps`` (all, as
    many optimiser steps as our default's student), ``art-defaults`` (all, ART's own defaults), or one attack by
    name with or without ``-steps``/``-defaults`` (none if not of ``mode``)."""
    for kind in ART_KINDS:
        if row == "art" + kind:
            return [name + kind for name in ART_ROWS[mode]]
    base = row.removesuffix("-defaults").removesuffix("-steps")
    return [row] if base in ART_ROWS[mode] else []


def default_config(args: argparse.Namespace, budget: int, num_classes: int, mode: str,
                   flip: bool = False) -> SurrogateConfig:
    """What ``ours-default`` runs at ``budget``: the configuration ``stealkit extract surrogate --budget BUDGET
    --mode MODE --seed SEED`` runs (:func:`stealkit.extract.surrogate_data.run.resolve_surrogate` of those
    options), with the benchmark's ``--epochs``/``--batch-size`` (by default the command's) and ``--set`` values
    given to it as options."""
    options = SurrogateOptions(mode=mode, epochs=args.epochs, batch_size=args.batch_size,
                               settings=parse_kv(tuple(args.set)))
    return resolve_surrogate(options, budget, num_classes, flip=flip, seed=getattr(args, "seed", 0))[1]


def default_epochs(args: argparse.Namespace, budget: int, num_classes: int, mode: str, pool_size: int) -> int:
    """The epochs ``ours-default``'s student trains at ``budget`` (``--epochs``, raised by the default's
    ``min_steps`` at small budgets, after ``--set``): the ``art`` rows' thief trains as many epochs on the same
    number of answered images with the same batch (equal epochs; below 10 label answers per class our FixMatch
    epoch is longer, see :func:`default_steps`)."""
    return default_config(args, budget, num_classes, mode).student_epochs(min(budget, pool_size), pool_size)


def default_steps(args: argparse.Namespace, budget: int, num_classes: int, mode: str, pool_size: int) -> int:
    """The optimiser steps ``ours-default``'s student takes at ``budget`` (FixMatch cycles the answers over a
    third of the pool each epoch, so below 10 label answers per class that is many more than its epochs'
    batches of answers)."""
    return default_config(args, budget, num_classes, mode).student_steps(min(budget, pool_size), pool_size)


def steps_epochs(args: argparse.Namespace, budget: int, num_classes: int, mode: str, pool_size: int) -> int:
    """The epochs that give ART's thief (``budget`` stolen images at batch ``--batch-size``, a last partial batch
    kept) at least :func:`default_steps` optimiser steps: the ``-steps`` rows."""
    batches = math.ceil(min(budget, pool_size) / args.batch_size)
    return math.ceil(default_steps(args, budget, num_classes, mode, pool_size) / batches)


def _given(args: argparse.Namespace) -> dict[str, Any]:
    """The ``--set KEY=VALUE`` settings of an ours row (the command's and the row's own), parsed."""
    from stealkit.settings import parse_value

    return {k: parse_value(x) for k, _, x in (s.partition("=") for s in args.set)}


def _setting(config: Any, key: str) -> Any:
    """The value of setting ``key`` of ``config`` (``"active.initial"``: a field of a group)."""
    for part in key.split("."):
        config = getattr(config, part)
    return config


def ours_variant(name: str, victim_dir: str, mode: str, pool: torch.Tensor, budget: int, evaluator: Evaluator,
                 args: argparse.Namespace, flip: bool) -> dict[str, Any]:
    """One run of ``extract_surrogate`` for the ``ours`` row ``name`` (``ours-default``: exactly what the command
    runs, :func:`default_config`; else :func:`row_combo` on the plain attack with the same student, epochs and
    batch), with the row's ``--set`` values."""
    from stealkit.extract.surrogate_data.surrogate import resolve_config

    v = open_victim(victim_dir, mode=mode, budget=budget)
    base = name.split("+")[0]
    if base == "ours-default":
        config, combo = default_config(args, budget, v.num_classes, mode, flip), {}
    else:
        combo = row_combo(base, budget, v.num_classes, mode)
        config = resolve_config("paper", budget, v.num_classes, mode=mode, flip=flip, settings={**combo, **_given(args)},
                                max_distinct=budget, epochs=args.epochs, batch_size=args.batch_size, seed=args.seed)[1]
    t0 = time.perf_counter()
    r = extract_surrogate(v.oracle, pool, make_student=student_factory(args.student, v, args.seed), config=config,
                          evaluator=evaluator)
    rounds = r.extra.get("active", {}).get("rounds", [])
    return {"attack": name, "mode": mode, "budget": budget, "seed": args.seed,
            "select": config.select, "ssl": config.ssl, **{k: _setting(config, k) for k in combo},
            "label_smoothing_used": r.extra.get("label_smoothing"),
            "accuracy": r.accuracy, "fidelity": r.fidelity, "queries": r.queries["predict"],
            "seconds": round(time.perf_counter() - t0, 1), "settings": list(args.set), "lr": config.peak_lr,
            "schedule": config.schedule, "batching": config.batching, "batch_size": config.batch_size,
            "tau": config.tau, "grad_clip": config.grad_clip, "epochs": r.extra.get("epochs", config.epochs),
            "student_steps": r.extra["steps"], "images": images_rule(config, budget),
            "select_seconds": round(sum(x["select_seconds"] for x in rounds), 2),
            "round_train_seconds": round(sum(x["train_seconds"] for x in rounds), 2)}


def _art_search_options(p: argparse.ArgumentParser) -> None:
    p.add_argument("--art-search", action="store_true",
                   help="choose ART's thief learning rate and schedule (lr 1e-3/3e-3/1e-2 x constant/cosine) on pool "
                        "images the row did not query (never the test split); random-selection attacks only")
    p.add_argument("--art-holdout", type=int, default=2000,
                   help="unqueried pool images (true labels) the --art-search choice is made on")


def _write_comparison_run(path: str, out: dict[str, Any]) -> None:
    """A run directory (kind ``extract surrogate``) whose report shows the comparison's accuracy curves."""
    from stealkit.report.builders import build_report
    from stealkit.rundir import RunDir

    run = RunDir(path).create(command="extract surrogate", seed=None, config={"benchmark": out["settings"]})
    note = (f"benchmarks/surrogate_extraction.py --active: victim {out['victim']}, every tool trains the same "
            f"student ({out['settings']['student']}) with batch {out['settings']['batch_size']} on the same pool: "
            f"'art' rows for as many epochs as our default's student at each budget ({out['settings']['epochs']}, "
            f"or more where its step floor min_steps raises them), '-steps' rows for as many optimiser steps (each "
            f"row's student_steps); seeds {out['settings']['seeds']}; "
            f"{'validation split' if out['validate'] else 'test split'}.")
    run.write_summary({"method": "surrogate-comparison", "victim_accuracy": out["victim_accuracy"],
                       "strategy": "comparison", "comparison": {"table": out["table"], "note": note}})
    run.write_report(build_report(run))


def _per_image(evaluator: Evaluator, accuracy: float) -> dict[str, Any]:
    """Which test images the row's model got right (``benchmarks/evidence.py``), for the paired intervals."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    from evidence import per_image

    return per_image(evaluator, accuracy)


def _rowmeta() -> Any:
    """``benchmarks/rowmeta.py``: the meta file beside ``--jsonl``'s rows."""
    here = str(Path(__file__).resolve().parent)
    if here not in sys.path:
        sys.path.insert(0, here)
    import rowmeta

    return rowmeta


def _append_jsonl(path: str | None, row: dict[str, Any]) -> None:
    if path:
        with open(path, "a", encoding="utf-8") as fh:
            fh.write(json.dumps(row) + "\n")


def _aggregate(rows: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Mean and sample standard deviation over seeds of each (attack, mode, budget)."""
    groups: dict[tuple[str, str, int], list[dict[str, Any]]] = {}
    for r in rows:
        groups.setdefault((r["attack"], r["mode"], r["budget"]), []).append(r)
    out = []
    for (attack, mode, budget), rs in groups.items():
        row: dict[str, Any] = {"attack": attack, "mode": mode, "budget": budget, "seeds": len(rs)}
        for key in ("accuracy", "fidelity", "seconds", "student_steps"):
            t = torch.tensor([float(r.get(key, 0.0)) for r in rs], dtype=torch.float64)
            row[key] = round(float(t.mean()), 4)
            row[f"{key}_std"] = round(float(t.std()), 4) if len(rs) > 1 else 0.0
        out.append(row)
    return out


def _combine(paths: list[str], report_out: str | None) -> int:
    """One table (and report) from several runs of the same victim and split, e.g. one per budget."""
    from stealkit.errors import InputError

    runs = [json.loads(Path(path).read_text(encoding="utf-8")) for path in paths]
    if len({(r["victim"], r["validate"]) for r in runs}) != 1:
        raise InputError("--combine: the runs must share the victim and the split")
    out = {**runs[0], "rows": [row for r in runs for row in r["rows"]], "combined": paths,
           "seconds": round(sum(r["seconds"] for r in runs), 1),
           "machine": {**runs[0]["machine"], "loadavg_each": [r["machine"]["loadavg"] for r in runs]}}
    out["table"] = _aggregate(out["rows"])
    out["settings"] = {**runs[0]["settings"], "budgets": ",".join(str(r["settings"]["budgets"]) for r in runs)}
    if report_out:
        _write_comparison_run(report_out, out)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


def active_parser() -> argparse.ArgumentParser:
    """The options of ``--active`` (:func:`active_main`)."""
    p = argparse.ArgumentParser(description=active_main.__doc__)
    p.add_argument("--active", action="store_true")
    p.add_argument("--victim", default="fmnist-conv2")
    p.add_argument("--budgets", default="100,300,1000")
    p.add_argument("--modes", default="label,probs")
    p.add_argument("--seeds", default="0,1,2")
    p.add_argument("--rows", default="ours-default,ours-plain,ours-ssl,ours-active,art,art-steps",
                   help="comma list of ours-default (what the command runs), ours-preset-paper, ours-plain, ours-ssl, "
                        "ours-active, SELECT/SSL pairs (e.g. margin/none), art (equal epochs), art-steps (as many "
                        "optimiser steps as ours-default's student), art-defaults (ART's own epochs and batch: a "
                        "second row), one ART attack by name (e.g. art-copycat, art-copycat-steps, "
                        "art-copycat-defaults); ROW+key=value+... gives one ours row its own --set values (e.g. "
                        "ours-default+label_smoothing=0)")
    p.add_argument("--student", default="conv2")
    p.add_argument("--epochs", type=int, default=CLI_DEFAULTS["epochs"],
                   help="epochs of every tool's student (equal training; default: the command's); where the "
                        "default's step floor (min_steps) raises its student's epochs at a budget, ART's thief "
                        "trains as many")
    p.add_argument("--batch-size", type=int, default=CLI_DEFAULTS["batch_size"],
                   help="batch of every tool's student (default: the command's)")
    p.add_argument("--validate", action="store_true", help="score on a held-out part of the pool, not the test split")
    p.add_argument("--set", action="append", default=[],
                   help="a SurrogateConfig setting for every ours row, e.g. fixmatch.ema=0")
    p.add_argument("--jsonl", default=None)
    _art_search_options(p)
    p.add_argument("--report-out", default=None,
                   help="also write a run directory whose report plots accuracy against queries for every row")
    p.add_argument("--combine", default=None,
                   help="comma list of earlier --active JSON outputs (e.g. one per budget): merge their rows into "
                        "one table and --report-out, running nothing")
    return p


def active_main(argv: list[str] | None = None) -> int:
    """Stealkit's default (exactly what ``stealkit extract surrogate`` runs), each ingredient alone and ART at
    equal training (student, batch, pool; equal epochs, or with ``art-steps`` equal optimiser steps).

    ``--validate`` holds out the last fifth of the attacker pool (true labels) as a validation split and
    scores on it instead of the test split: this is how the default combination is chosen.
    """
    import os

    from stealkit.extract.surrogate_data.presets import SMALL_BUDGET_PER_CLASS, resolve_preset
    from stealkit.extract.surrogate_data.surrogate import DEFAULT_PRESET, FLIP_INVARIANT

    args = active_parser().parse_args(argv)
    if args.combine:
        return _combine(args.combine.split(","), args.report_out)
    args.art_batch = args.batch_size  # equal training for ART (its epochs: the default's, per budget)
    logging.basicConfig(level=logging.INFO, stream=sys.stderr, format="%(asctime)s %(name)s: %(message)s")
    trained = standard_victim(args.victim)
    v = open_victim(trained.path, mode="probs")
    splits = victim_splits(v)
    flip = v.dataset in FLIP_INVARIANT
    pool_ds = splits.attacker_pool
    if args.validate:
        pool, labels, x_val, y_val = pool_holdout(pool_ds)
        evaluator = make_evaluator(v, x_val, y_val)
    else:
        order = torch.randperm(len(pool_ds), generator=torch.Generator().manual_seed(1234))
        pool, labels = pool_ds.x[order], pool_ds.y[order]
        evaluator = make_evaluator(v, splits.test.x, splits.test.y)
    rows: list[dict[str, Any]] = []
    meta = _rowmeta().start(args.jsonl, seeds=args.seeds, victim=args.victim,
                            data={"pool": pool, "scored on": x_val if args.validate else splits.test.x})
    t_all = time.perf_counter()
    for budget in [int(b) for b in args.budgets.split(",")]:
        for mode in args.modes.split(","):
            for seed in [int(s) for s in args.seeds.split(",")]:
                a = argparse.Namespace(**{**vars(args), "seed": seed})
                a.art_epochs = default_epochs(args, budget, v.num_classes, mode, pool.shape[0])  # equal epochs
                a.art_steps_epochs = steps_epochs(args, budget, v.num_classes, mode, pool.shape[0])  # equal steps
                for row_name in args.rows.split(","):
                    if row_name.startswith("art"):
                        for art_name in art_rows(row_name, mode):
                            row = {**art(art_name, trained.model, pool, labels, budget, evaluator, a,
                                         tuple(v.input_shape), v.num_classes), "mode": mode, "seed": seed}
                            row.update(_per_image(evaluator, row["accuracy"]))
                            rows.append(row)
                            log.info("%s", row)
                            _append_jsonl(args.jsonl, row)
                        continue
                    _, *row_sets = row_name.split("+")  # ROW+key=value+...: settings of this row only
                    a.set = [*args.set, *row_sets]
                    row = ours_variant(row_name, str(trained.path), mode, pool, budget, evaluator, a, flip)
                    row.update(_per_image(evaluator, row["accuracy"]))
                    rows.append(row)
                    log.info("%s", row)
                    _append_jsonl(args.jsonl, row)
    out = {"benchmark": "surrogate_extraction/active", "victim": args.victim, "validate": args.validate,
           "victim_accuracy": evaluator.victim_accuracy, "settings": vars(args),
           "default": {"preset": DEFAULT_PRESET, "small_budget_per_class": SMALL_BUDGET_PER_CLASS,
                       **{f"{b}/{m}": resolve_preset(DEFAULT_PRESET, int(b), v.num_classes, mode=m)[0]
                          for b in args.budgets.split(",") for m in args.modes.split(",")}}, "seconds": round(time.perf_counter() - t_all, 1),
           "machine": {"platform": platform.platform(), "threads": torch.get_num_threads(),
                       "torch": torch.__version__, "loadavg": list(os.getloadavg())},
           "table": _aggregate(rows), "rows": rows}
    _rowmeta().finish(meta, victim_accuracy=evaluator.victim_accuracy)
    if args.report_out:
        _write_comparison_run(args.report_out, out)
    json.dump(out, sys.stdout, indent=1)
    print()
    return 0


if __name__ == "__main__":
    from stealkit.errors import InputError

    try:
        sys.exit(active_main() if "--active" in sys.argv else main())
    except InputError as e:
        sys.exit(f"error: {e}")
