"""PGD speed and success against torchattacks and ART, in one run, on the same model, images and threads.

PGD Linf (eps 0.1, step 0.01, 20 steps, one random start, untargeted) on Fashion-MNIST test images against
the standard CNN victim (``standard_victim("fmnist-conv2")``), attacked white-box. Each library runs at the
same batch sizes. Each timed call returns the adversarial batch *and* the model's labels on it (stealkit's
``pgd`` result carries them; for the others the benchmark adds one forward pass inside the timing), so every
library does the same work: an attack whose success the caller can read. Runs are interleaved (library by
library within each repeat) so machine load hits all alike, and the median wall time is reported. Success
rate = the fraction of images the model misclassifies after the attack (the anchors' definition);
``asr_on_correct`` counts only images it got right before.

    .venv/bin/python benchmarks/attack_speed.py                  # 1,000 images, batches 32 and 1000, 3 repeats
    .venv/bin/python benchmarks/attack_speed.py --quick          # smoke run: 200 images, batch 100, 1 repeat
    python3 benchmarks/attack_speed.py --device cuda --n 10000 --batches 256,1000   # the GPU check's row

Per-step mode (issue 53): ``--per-step 5,20`` times every library at two step counts (seeds 0..repeats-1,
interleaved: repeat by repeat, step count by step count, library by library) and reports the slope, the time
of one step of one batch (``per_step_ms``: forward, backward, projection and whatever the loop adds), and the
intercept (``fixed_ms``: the random starts, the labels, the checks, once per call); ``--ops`` adds the number of
torch operations per step of stealkit's loop and of the plain loop (torch.profiler, the difference of two step
counts), the measure of what the loop does beyond the forward, the backward and the projection:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/attack_speed.py --victim digits-conv2 --n 256 \
        --batches 8,64 --per-step 5,20 --repeats 5 --threads 1 --libraries stealkit,plain,torchattacks --ops

On a GPU every library gets the model and the images on the device (ART as ``device_type="gpu"``), and each
timing ends with ``torch.cuda.synchronize()``; one untimed warm-up call per library and batch comes first.

The anchors are benchmark-only extras: ``pip install adversarial-robustness-toolbox==1.20.1`` and
``pip install --no-deps torchattacks==3.5.1`` (its torchvision requirement is not needed for PGD). A library
that is not installed is reported as such and skipped.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
from collections.abc import Callable
from pathlib import Path

import numpy as np
import torch
from torch import nn

Result = tuple[torch.Tensor, torch.Tensor]  # the adversarial batch and the model's labels on it


def labelled(model: nn.Module, x_adv: torch.Tensor, batch: int) -> Result:
    """What an attack result must tell its user; the anchors return only images, so this adds the labels."""
    from stealkit.evade.base import model_labels

    return x_adv, model_labels(model, x_adv, batch_size=batch)


def run_stealkit(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, seed: int, steps: int = 20) -> Result:
    from stealkit.evade.gradient_based.gradient import pgd

    r = pgd(model, x, y, eps=0.1, step=0.01, steps=steps, random_start=True, seed=seed, batch_size=batch)
    return r.x_adv, r.labels  # stealkit's result already carries the labels (and per-example success, norms)


def run_torchattacks(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, seed: int,
                     steps: int = 20) -> Result:
    import torchattacks

    torch.manual_seed(seed)
    atk = torchattacks.PGD(model, eps=0.1, alpha=0.01, steps=steps, random_start=True)
    return labelled(model, torch.cat([atk(x[i : i + batch], y[i : i + batch]) for i in range(0, x.shape[0], batch)]),
                    batch)


def run_art(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, seed: int, steps: int = 20) -> Result:
    """ART takes and returns numpy arrays: the copies to and from the host are part of its cost."""
    from art.attacks.evasion import ProjectedGradientDescent
    from art.estimators.classification import PyTorchClassifier

    np.random.seed(seed)
    clf = PyTorchClassifier(model=model, loss=nn.CrossEntropyLoss(), input_shape=tuple(x.shape[1:]),
                            nb_classes=10, clip_values=(0.0, 1.0),
                            device_type="gpu" if x.device.type == "cuda" else "cpu")
    atk = ProjectedGradientDescent(clf, norm=np.inf, eps=0.1, eps_step=0.01, max_iter=steps, num_random_init=1,
                                   targeted=False, batch_size=batch, verbose=False)
    x_adv = torch.from_numpy(atk.generate(x.cpu().numpy(), y=y.cpu().numpy())).to(x.device)
    return labelled(model, x_adv, batch)


def run_plain(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, seed: int, steps: int = 20) -> Result:
    """The textbook loop (what most research code does), for reference."""
    torch.manual_seed(seed)
    outs = []
    for i in range(0, x.shape[0], batch):
        xb, yb = x[i : i + batch], y[i : i + batch]
        xa = (xb + torch.empty_like(xb).uniform_(-0.1, 0.1)).clamp(0, 1)
        for _ in range(steps):
            xa.requires_grad_(True)
            loss = nn.functional.cross_entropy(model(xa), yb)
            (g,) = torch.autograd.grad(loss, xa)
            xa = torch.min(torch.max(xa.detach() + 0.01 * g.sign(), xb - 0.1), xb + 0.1).clamp(0, 1)
        outs.append(xa)
    return labelled(model, torch.cat(outs), batch)


Attack = Callable[[nn.Module, torch.Tensor, torch.Tensor, int, int, int], Result]
LIBRARIES: dict[str, Attack] = {"stealkit": run_stealkit, "torchattacks": run_torchattacks, "art": run_art,
                                "plain": run_plain}


def add_before(path: str) -> None:
    """Load another version of the gradient loop as the library ``stealkit-before`` (same package otherwise)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("stealkit_gradient_before", path)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # its dataclasses look their module up
    spec.loader.exec_module(module)

    def run(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, seed: int, steps: int = 20) -> Result:
        r = module.pgd(model, x, y, eps=0.1, step=0.01, steps=steps, random_start=True, seed=seed, batch_size=batch)
        return r.x_adv, r.labels

    LIBRARIES["stealkit-before"] = run


def available(name: str) -> str | None:
    try:
        if name == "torchattacks":
            import torchattacks  # noqa: F401
        elif name == "art":
            import art  # noqa: F401
    except Exception as exc:  # noqa: BLE001 - any import failure means "not available"
        return f"{type(exc).__name__}: {exc}"
    return None


def ops_per_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, batch: int, lib: str,
                 counts: tuple[int, int]) -> dict[str, float]:
    """Torch operations (``aten::`` calls and autograd nodes, as torch.profiler records them) per step of one batch:
    the difference between two step counts, so the per-call work (starts, labels, checks) cancels."""
    import collections

    from torch.profiler import ProfilerActivity, profile

    seen = []
    for steps in counts:
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            LIBRARIES[lib](model, x[:batch], y[:batch], batch, 0, steps)
        seen.append(collections.Counter(e.name for e in prof.events()
                                        if e.name.startswith(("aten::", "autograd::engine::evaluate_function"))))
    span = counts[1] - counts[0]
    names = set(seen[0]) | set(seen[1])
    per = {k: (seen[1][k] - seen[0][k]) / span for k in names if seen[1][k] != seen[0][k]}
    return {"total": sum(per.values()), **{k: per[k] for k in sorted(per, key=lambda k: (-per[k], k))}}


def per_step(model: nn.Module, x: torch.Tensor, y: torch.Tensor, args: argparse.Namespace, libs: list[str],
             batches: list[int], missing: dict[str, str], sync: Callable[[], None]) -> dict[str, object]:
    """``--per-step S1,S2``: every library at both step counts, interleaved; per batch the slope and intercept."""
    counts = tuple(int(v) for v in args.per_step.split(","))
    if len(counts) != 2 or not 0 < counts[0] < counts[1]:
        raise SystemExit("--per-step needs two step counts S1 < S2, e.g. 5,20")
    times: dict[tuple[str, int, int], list[float]] = {(lib, b, s): [] for lib in libs for b in batches
                                                      for s in counts}
    cpu: dict[tuple[str, int, int], list[float]] = {k: [] for k in times}  # this process's CPU time: less
    # sensitive than wall time to other jobs on a shared machine (with --threads 1, the same as wall time idle)
    for r in range(args.repeats):
        for b in batches:
            for s in counts:
                order = libs if r % 2 == 0 else libs[::-1]
                for lib in order:
                    sync()
                    t0, c0 = time.perf_counter(), time.process_time()
                    x_adv, _ = LIBRARIES[lib](model, x, y, b, r, s)
                    sync()
                    times[(lib, b, s)].append(time.perf_counter() - t0)
                    cpu[(lib, b, s)].append(time.process_time() - c0)
                    assert float((x_adv - x).abs().max()) <= 0.1 + 1e-5, lib
                print(f"repeat {r} batch {b} steps {s}: " + ", ".join(
                    f"{lib} {times[(lib, b, s)][-1]:.3f}s" for lib in libs), file=sys.stderr, flush=True)
    rows = []
    for b in batches:
        calls = -(-x.shape[0] // b)  # batches per call
        for lib in libs:
            lo, hi = (statistics.median(times[(lib, b, s)]) for s in counts)
            slope = (hi - lo) / (counts[1] - counts[0])
            clo, chi = (statistics.median(cpu[(lib, b, s)]) for s in counts)
            cslope = (chi - clo) / (counts[1] - counts[0])
            rows.append({"library": lib, "batch": b, "per_step_ms": round(1e3 * slope / calls, 4),
                         "fixed_ms": round(1e3 * (lo - slope * counts[0]), 2),
                         "per_step_cpu_ms": round(1e3 * cslope / calls, 4),
                         "fixed_cpu_ms": round(1e3 * (clo - cslope * counts[0]), 2),
                         **{f"median_s_steps_{s}": round(statistics.median(times[(lib, b, s)]), 4) for s in counts},
                         "times_s": {str(s): [round(t, 4) for t in times[(lib, b, s)]] for s in counts}})
        for key in ("per_step_ms", "per_step_cpu_ms"):
            ref = {r["library"]: r[key] for r in rows if r["batch"] == b}
            for r in rows:
                if r["batch"] == b and ref.get("plain", 0) > 0:
                    r[key.replace("_ms", "_over_plain")] = round(r[key] / ref["plain"], 3)
    out: dict[str, object] = {
        "benchmark": "pgd_linf_per_step", "attack": {"eps": 0.1, "step": 0.01, "random_start": True},
        "step_counts": counts, "victim": args.victim, "n": int(x.shape[0]), "device": str(x.device),
        "threads": args.threads, "repeats": args.repeats, "seeds": list(range(args.repeats)),
        "versions": {"torch": torch.__version__}, "skipped": missing, "results": rows}
    if args.ops:
        out["ops_per_step"] = {f"{lib} batch {batches[0]}": ops_per_step(model, x, y, batches[0], lib, counts)
                               for lib in libs if lib in ("stealkit", "stealkit-before", "plain", "torchattacks")}
    return out


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--n", type=int, default=1000)
    ap.add_argument("--batches", default="32,1000", help="comma-separated batch sizes")
    ap.add_argument("--repeats", type=int, default=3)
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--libraries", default="stealkit,torchattacks,art,plain")
    ap.add_argument("--victim", default="fmnist-conv2",
                    help="standard victim name, or a model directory (a Fashion-MNIST classifier)")
    ap.add_argument("--device", default="cpu", help="torch device of the model and images (cpu, cuda, cuda:N)")
    ap.add_argument("--quick", action="store_true", help="smoke run: 200 images, batch 100, 1 repeat")
    ap.add_argument("--per-step", default="", metavar="S1,S2",
                    help="time at two step counts and report the time of one step and the fixed cost per call")
    ap.add_argument("--ops", action="store_true", help="with --per-step: torch operations per step (profiler)")
    ap.add_argument("--jsonl", default=None, metavar="PATH",
                    help="also append one row per repeat, batch and library (raw rows; its .meta.json at the end)")
    ap.add_argument("--before", default=None, metavar="GRADIENT_PY",
                    help="another version of stealkit/evade/gradient_based/gradient.py (e.g. from `git show "
                         "COMMIT:src/...`), timed beside the current one as library 'stealkit-before'")
    args = ap.parse_args(argv)
    if args.quick:
        args.n, args.batches, args.repeats = 200, "100", 1
    torch.set_num_threads(args.threads)
    if args.before:
        add_before(args.before)
        args.libraries += ",stealkit-before"
    from stealkit.data import load_splits
    from stealkit.victims import standard_victim

    dataset = "fashion-mnist"
    if Path(args.victim).is_dir():
        from stealkit.models import load_model

        model = load_model(args.victim)[0].eval()
    else:
        from stealkit.victims import RECIPES

        model = standard_victim(args.victim, device=args.device).model.eval()
        dataset = RECIPES[args.victim].dataset if args.victim in RECIPES else dataset
    device = torch.device(args.device)
    model = model.to(device)
    test = load_splits(dataset).test
    x, y = test.x[: args.n].contiguous().to(device), test.y[: args.n].to(device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    with torch.no_grad():
        clean_pred = model(x).argmax(1)
    correct = clean_pred == y
    libs = [s for s in args.libraries.split(",") if s]
    missing = {lib: why for lib in libs if (why := available(lib))}
    libs = [lib for lib in libs if lib not in missing]
    batches = [int(b) for b in args.batches.split(",")]
    times: dict[tuple[str, int], list[float]] = {(lib, b): [] for lib in libs for b in batches}
    rates: dict[tuple[str, int], list[tuple[float, float]]] = {k: [] for k in times}
    if device.type == "cuda":  # kernels, cuDNN plans and allocator pools are made once, outside the timings
        for b in batches:
            for lib in libs:
                LIBRARIES[lib](model, x[: 2 * b], y[: 2 * b], b, 0, 20)
    if args.per_step:
        print(json.dumps(per_step(model, x, y, args, libs, batches, missing, sync), indent=2))
        return 0
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rowmeta

    meta = rowmeta.start(args.jsonl, seeds=f"0-{args.repeats - 1} (repeat r: seed r)", device=str(device),
                         victim=args.victim, images=f"the first {int(x.shape[0]):,} {dataset} test images",
                         data={"attacked images": x.cpu()}, threads=args.threads, skipped=missing)
    for r in range(args.repeats):
        for b in batches:
            for lib in libs:
                sync()
                t0 = time.perf_counter()
                x_adv, labels = LIBRARIES[lib](model, x, y, b, r, 20)
                sync()
                times[(lib, b)].append(time.perf_counter() - t0)
                with torch.no_grad():
                    wrong = model(x_adv).argmax(1) != y
                assert torch.equal(wrong, labels != y), lib
                linf = float((x_adv - x).abs().max())
                assert linf <= 0.1 + 1e-5, (lib, linf)
                rates[(lib, b)].append((float(wrong.float().mean()), float(wrong[correct].float().mean())))
                print(f"repeat {r} batch {b} {lib}: {times[(lib, b)][-1]:.2f}s success {rates[(lib, b)][-1][0]:.4f}",
                      file=sys.stderr, flush=True)
                if args.jsonl:
                    with open(args.jsonl, "a", encoding="utf-8") as fh:
                        fh.write(json.dumps({"library": lib, "batch": b, "repeat": r, "seconds": times[(lib, b)][-1],
                                             "success_rate": rates[(lib, b)][-1][0],
                                             "asr_on_correct": rates[(lib, b)][-1][1],
                                             "load_average": os.getloadavg()[0]}) + "\n")
    results = []
    for (lib, b), ts in times.items():
        rs = rates[(lib, b)]
        results.append({"library": lib, "batch": b, "median_s": round(statistics.median(ts), 3),
                        "times_s": [round(t, 3) for t in ts],
                        "success_rate": round(statistics.mean(r[0] for r in rs), 4),
                        "asr_on_correct": round(statistics.mean(r[1] for r in rs), 4)})
    import stealkit

    versions = {"stealkit": stealkit.__version__, "torch": torch.__version__}
    if device.type == "cuda":
        versions |= {"cuda": torch.version.cuda, "gpu": torch.cuda.get_device_name(device)}
    for lib, mod in (("torchattacks", "torchattacks"), ("art", "art")):
        if lib in libs:
            versions[lib] = __import__(mod).__version__
    rowmeta.finish(meta, versions=versions)
    print(json.dumps({
        "benchmark": "pgd_linf_speed", "attack": {"eps": 0.1, "step": 0.01, "steps": 20, "random_start": True},
        "victim": args.victim, "n": int(x.shape[0]), "clean_accuracy": round(float(correct.float().mean()), 4),
        "device": str(device), "threads": args.threads, "repeats": args.repeats, "versions": versions, "skipped": missing,
        "results": results}, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())
