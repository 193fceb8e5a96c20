"""Certification benchmark: stealkit's smoothed classifier against ART's randomized smoothing, same model,
same images (issue 8, "Must show").

Model: the anchors' 2-conv + 2-dense CNN trained with sigma = 0.5 Gaussian augmentation on Fashion-MNIST
train[:50k] (cached by ``stealkit.victims.robust_victim``). Images: the first ``--num`` test images.
Each certifier runs in its own subprocess (so that peak RSS is its own) with ``--threads`` torch threads:

- ``stealkit``: ``certify`` (n0 selection + n estimation samples, noise batch by batch, several images per
  forward batch, channels-last inference copy); Cohen, Renyi and PixelDP radii from the same counts;
- ``stealkit-plain`` (``--with-plain``): the same code with ``fast=False`` (plain NCHW model), to show where
  the speed comes from;
- ``art``: ``PyTorchRandomizedSmoothing(sample_size=n0, scale=sigma, alpha).certify(x, n, batch_size)`` at
  ART's default batch size 32 (``--art-batch`` to change it).

Speed at equal batch (issue 20, item 10): ``--equal-batches 32,400 --repeats 3`` times both certifiers at each
listed batch size (noisy copies per forward pass: stealkit's ``batch_size``, ART's ``certify(batch_size=...)``),
repeats interleaved (stealkit, ART, ART, stealkit, ... alternating which goes first), and reports the median
images/s of each and their ratio per batch. The main table's single pair (stealkit at ``--batch``, ART at
``--art-batch``) compares each tool at its own default batch, which is not an equal-batch comparison.

Rate against the bare loop (the GPU check, issue 41): ``--rate-batches 1000,10000 --device cuda`` times
``certify`` beside a ``bare`` worker that only draws the same ``n0 + n`` Gaussian copies of each image at the
same batch, runs the model and counts the argmax (no bookkeeping, no bounds): the ratio says how much of the
device's noise+forward rate the certifier keeps. Repeats interleaved; median images/s.

Before and after (issue 53): ``--before FILE`` adds a worker ``stealkit-before`` that certifies with another
version of ``stealkit/certify/smoothing.py`` (``git show COMMIT:src/stealkit/certify/smoothing.py > FILE``),
interleaved with the others in ``--rate-batches``; ``cpu_seconds`` shows the host time each spent:

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/certify.py --dataset digits --num 100 --n 1000 --threads 1 \
        --rate-batches 400,4000 --repeats 3 --skip-art --mem-ns '' --before /tmp/smoothing_before.py

Memory scaling: ``--mem-ns`` runs each certifier on ``--mem-num`` images for growing n and reports peak RSS.
Prints one JSON object. ``--jsonl PATH`` also appends the raw rows (``part``: ``accuracy``, one row per certifier
with each image's label, prediction and radius; ``equal-batch`` / ``rate``, one row per timed run; ``memory``) and
writes ``PATH``'s ``.meta.json`` at the end (``benchmarks/rowmeta.py``). ``--quick`` is a smoke run (20 images, small n).

    OMP_NUM_THREADS=2 .venv/bin/python benchmarks/certify.py            # full: 200 images, n0=100, n=1000
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/certify.py --num 20 --threads 1 --equal-batches 32,400 \
        --repeats 3 --mem-ns ''                                         # equal-batch speed only
    .venv/bin/python benchmarks/certify.py --quick
    python3 benchmarks/certify.py --device cuda --n 10000 --rate-batches 1000,10000 --repeats 3 --skip-art \
        --mem-ns ''                                                     # the GPU check's certification row
"""

from __future__ import annotations

import argparse
import contextlib
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

RADII = (0.0, 0.25, 0.5, 0.75, 1.0)


def _proc_status_mib(key: str) -> float:
    """``VmHWM`` (peak RSS of this process image) or ``VmRSS`` from /proc, in MiB (ru_maxrss would include
    the parent's memory, which Linux carries across fork + exec)."""
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) / 1024
    return float("nan")


def _reset_peak() -> None:
    """Reset VmHWM to the current RSS (Linux >= 4.0), so the peak measured is the certifier's."""
    with contextlib.suppress(OSError):
        Path("/proc/self/clear_refs").write_text("5")


def _load(args: argparse.Namespace) -> tuple[Any, Any, Any]:
    """The model and the images handed over by the parent (the worker never loads the whole data set, so
    its peak RSS is the certifier's own plus the interpreter and torch)."""
    import numpy as np
    import torch

    torch.set_num_threads(args.threads)
    trained = _model(args.dataset)
    x = torch.from_numpy(np.load(Path(args.images) / "x.npy"))[: args.num]
    y = torch.from_numpy(np.load(Path(args.images) / "y.npy"))[: args.num]
    device = torch.device(args.device)
    model = trained.model.eval().to(device)
    if device.type == "cuda":  # CUDA context, kernels and cuDNN plans made before the timing
        with torch.no_grad():
            model(torch.rand(args.batch, *x.shape[1:], device=device))
        torch.cuda.synchronize(device)
    return model, x.to(device), y


def _recipe(dataset: str) -> Any:
    """The benchmark's model (Fashion-MNIST), or the same recipe on digits for a smoke run."""
    from stealkit.victims import benchmark_recipe, robust_recipe

    return benchmark_recipe() if dataset == "fashion-mnist" else robust_recipe(dataset, "conv2", "gaussian", 0.5)


def _model(dataset: str, device: str = "cpu") -> Any:
    from stealkit.victims import robust_victim

    return robust_victim(_recipe(dataset), device=device)


def _sync(x: Any) -> None:
    import torch

    if x.device.type == "cuda":
        torch.cuda.synchronize(x.device)


def bare_counts(model: Any, x: Any, samples: int, sigma: float, batch: int, seed: int) -> Any:
    """The floor of any certifier: ``samples`` Gaussian copies of each image, the model's argmax counted."""
    import torch

    gen = torch.Generator(device=x.device).manual_seed(seed)
    counts = torch.zeros(x.shape[0], 10, dtype=torch.long, device=x.device)
    with torch.no_grad():
        for i in range(x.shape[0]):
            left = samples
            while left > 0:
                b = min(batch, left)
                noisy = x[i].expand(b, *x.shape[1:]) + sigma * torch.randn(b, *x.shape[1:], device=x.device,
                                                                           generator=gen)
                counts[i] += torch.bincount(model(noisy).argmax(1), minlength=10)
                left -= b
    return counts.cpu()


def worker(args: argparse.Namespace) -> dict[str, Any]:
    """Certify in this process; returns labels, radii, seconds and peak RSS."""
    import numpy as np

    model, x, y = _load(args)
    _reset_peak()
    base_rss = _proc_status_mib("VmRSS")
    if args.worker == "bare":
        t0, c0 = time.perf_counter(), time.process_time()
        counts = bare_counts(model, x, args.n0 + args.n, args.sigma, args.batch, args.seed)
        _sync(x)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        labels = {"argmax": [int(v) for v in counts.argmax(1)]}
        radii = {"argmax": [0.0] * len(x)}
    elif args.worker.startswith("stealkit"):
        from stealkit.certify.smoothing import SmoothingConfig, certify

        if args.worker == "stealkit-before":
            import importlib.util

            spec = importlib.util.spec_from_file_location("stealkit_smoothing_before", args.before)
            assert spec is not None and spec.loader is not None
            before = importlib.util.module_from_spec(spec)
            sys.modules[spec.name] = before  # its dataclasses look their module up
            spec.loader.exec_module(before)
            SmoothingConfig, certify = before.SmoothingConfig, before.certify  # noqa: N806

        cfg = SmoothingConfig(sigma=args.sigma, n0=args.n0, n=args.n, alpha=args.alpha, batch_size=args.batch,
                              seed=args.seed, fast=args.worker != "stealkit-plain")
        t0, c0 = time.perf_counter(), time.process_time()
        certs = certify(model, x, cfg)
        _sync(x)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        labels = {b: [c.prediction(b) for c in certs] for b in cfg.bounds}
        radii = {b: [c.radius[b] or 0.0 for c in certs] for b in cfg.bounds}
    else:
        from art.estimators.certification.randomized_smoothing import PyTorchRandomizedSmoothing
        from torch import nn

        np.random.seed(args.seed)
        clf = PyTorchRandomizedSmoothing(model=model, loss=nn.CrossEntropyLoss(), input_shape=tuple(x.shape[1:]),
                                         nb_classes=10, clip_values=(0.0, 1.0),
                                         device_type="gpu" if x.device.type == "cuda" else "cpu",
                                         sample_size=args.n0, scale=args.sigma, alpha=args.alpha)
        t0, c0 = time.perf_counter(), time.process_time()
        pred, rad = clf.certify(x.cpu().numpy(), n=args.n, batch_size=args.art_batch)
        seconds, cpu = time.perf_counter() - t0, time.process_time() - c0
        labels = {"cohen": [int(v) for v in pred]}
        radii = {"cohen": [float(v) for v in rad]}
    return {"worker": args.worker, "n": args.n, "num": len(x), "seconds": seconds, "cpu_seconds": cpu,
            "images_per_second": len(x) / seconds,
            "peak_rss_mib": _proc_status_mib("VmHWM"), "rss_before_mib": base_rss, "y": [int(v) for v in y],
            "labels": labels, "radii": radii}


def certified_accuracy(res: dict[str, Any], bound: str) -> dict[str, float]:
    y, lab, rad = res["y"], res["labels"][bound], res["radii"][bound]
    return {f"{r:g}": round(sum(lb == t and lb != -1 and rd >= r for t, lb, rd in zip(y, lab, rad, strict=True)) / len(y), 4)
            for r in RADII}


def spawn(args: argparse.Namespace, name: str, n: int, num: int) -> dict[str, Any]:
    cmd = [sys.executable, str(Path(__file__).resolve()), "--worker", name, "--n", str(n), "--num", str(num),
           "--n0", str(args.n0), "--sigma", str(args.sigma), "--alpha", str(args.alpha), "--threads",
           str(args.threads), "--seed", str(args.seed), "--batch", str(args.batch), "--art-batch", str(args.art_batch),
           "--images", args.images, "--dataset", args.dataset, "--device", args.device] + (
               ["--before", args.before] if args.before else [])
    out = subprocess.run(cmd, capture_output=True, text=True, check=False)
    if out.returncode != 0:
        return {"worker": name, "error": out.stderr.strip().splitlines()[-1:] or ["failed"]}
    return json.loads(out.stdout.strip().splitlines()[-1])


def _row(args: argparse.Namespace, row: dict[str, Any]) -> None:
    """One raw row appended to ``--jsonl`` (nothing without it)."""
    if getattr(args, "jsonl", None):
        import os

        with open(args.jsonl, "a", encoding="utf-8") as fh:
            fh.write(json.dumps({**row, "load_average": round(os.getloadavg()[0], 2)}) + "\n")


def interleaved(a: argparse.Namespace, names: tuple[str, ...], repeats: int,
                on_error: Callable[[str, dict[str, Any]], None]) -> dict[str, Any]:
    """Images/s of certifiers at ``a``'s settings, each run in its own process, the order alternating per
    repeat; a failed run is handed to ``on_error`` and counts as NaN. The medians and each over the last."""
    ips: dict[str, list[float]] = {n: [] for n in names}
    cpu: dict[str, list[float]] = {n: [] for n in names}
    for r in range(repeats):
        for name in (names if r % 2 == 0 else names[::-1]):
            res = spawn(a, name, a.n, a.num)
            _row(a, {"part": getattr(a, "part", "timing"), "batch": a.art_batch if name == "art" else a.batch,
                     "certifier": name, "repeat": r, "n": a.n, "num": a.num,
                     **{k: res.get(k) for k in ("images_per_second", "cpu_seconds", "seconds", "error")}})
            if "error" in res:
                on_error(name, res)
                ips[name].append(float("nan"))
                cpu[name].append(float("nan"))
            else:
                ips[name].append(res["images_per_second"])
                cpu[name].append(res["cpu_seconds"])
    med = {k: statistics.median(v) for k, v in ips.items()}
    return {"images_per_second": {k: [round(x, 3) for x in v] for k, v in ips.items()},
            "cpu_seconds": {k: [round(x, 3) for x in v] for k, v in cpu.items()},
            "median": {k: round(v, 3) for k, v in med.items()},
            **{f"{n}_over_{names[-1]}": round(med[n] / med[names[-1]], 3) for n in names[:-1]}}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--quick", action="store_true", help="smoke run: 20 images, n = 200")
    p.add_argument("--num", type=int, default=200)
    p.add_argument("--n0", type=int, default=100)
    p.add_argument("--n", type=int, default=1000)
    p.add_argument("--alpha", type=float, default=0.001)
    p.add_argument("--sigma", type=float, default=0.5)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--seed", type=int, default=0)
    p.add_argument("--batch", type=int, default=400, help="stealkit: noisy copies per forward pass")
    p.add_argument("--art-batch", type=int, default=32, help="ART's certify batch_size (its default is 32)")
    p.add_argument("--skip-art", action="store_true")
    p.add_argument("--mem-ns", default="1000,10000,30000", help="n values of the memory-scaling runs ('' to skip)")
    p.add_argument("--mem-num", type=int, default=1)
    p.add_argument("--with-plain", action="store_true", help="also time stealkit with fast=False")
    p.add_argument("--equal-batches", default="",
                   help="comma list of batch sizes at which to time both certifiers with interleaved repeats")
    p.add_argument("--repeats", type=int, default=3, help="repeats per certifier and batch for --equal-batches")
    p.add_argument("--dataset", default="fashion-mnist", choices=["fashion-mnist", "digits"],
                   help="fashion-mnist (the benchmark) or digits (a smoke run: the same recipe on 8x8 digits)")
    p.add_argument("--device", default="cpu", help="torch device of the model, images and noise (cpu, cuda)")
    p.add_argument("--rate-batches", default="",
                   help="comma list of batch sizes at which to time certify beside the bare noise+forward loop")
    p.add_argument("--before", default=None, metavar="SMOOTHING_PY",
                   help="with --rate-batches: also time another version of stealkit/certify/smoothing.py")
    p.add_argument("--jsonl", default=None, metavar="PATH", help="also append the raw rows here (and write its .meta.json)")
    p.add_argument("--worker", default=None, help=argparse.SUPPRESS)
    p.add_argument("--images", default=None, help=argparse.SUPPRESS)
    args = p.parse_args()
    if args.worker:
        print(json.dumps(worker(args)))
        return
    if args.quick:
        args.num, args.n, args.mem_ns, args.mem_num = 20, 200, "200,2000", 1
    import tempfile

    import numpy as np

    from stealkit.data import load_splits

    trained = _model(args.dataset, args.device)  # train once (on the device), before any timed worker
    test = load_splits(args.dataset).test
    tmp = tempfile.TemporaryDirectory()
    args.images = tmp.name
    np.save(Path(tmp.name) / "x.npy", test.x[: args.num].numpy())
    np.save(Path(tmp.name) / "y.npy", test.y[: args.num].numpy())
    import os
    import platform

    machine = {"platform": platform.platform(), "cpus": os.cpu_count(), "threads": args.threads,
               "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS"), "load_average_start": os.getloadavg()}
    sys.path.insert(0, str(Path(__file__).resolve().parent))
    import rowmeta

    meta = rowmeta.start(args.jsonl, seeds=args.seed, device=args.device, model=_recipe(args.dataset).name,
                         model_clean_accuracy=trained.metrics.get("test_accuracy"),
                         images=f"the first {args.num} {args.dataset} test images",
                         data={"certified images": test.x[: args.num]},
                         settings={k: getattr(args, k) for k in ("num", "n0", "n", "alpha", "sigma", "threads",
                                                                 "batch", "art_batch")})
    if args.rate_batches:
        rate: dict[str, Any] = {}
        for b in [int(v) for v in args.rate_batches.split(",") if v.strip()]:
            a = argparse.Namespace(**vars(args))
            a.batch, a.part = b, "rate"
            def fail(name: str, res: dict[str, Any], b: int = b) -> None:
                raise SystemExit(f"{name} at batch {b} failed: {res['error']}")

            names = ("stealkit", "stealkit-before", "bare") if args.before else ("stealkit", "bare")
            rate[str(b)] = interleaved(a, names, args.repeats, fail)
        machine["load_average_end"] = os.getloadavg()
        if args.device.startswith("cuda"):
            import torch

            machine |= {"gpu": torch.cuda.get_device_name(0), "cuda": torch.version.cuda}
        rowmeta.finish(meta)
        print(json.dumps({"benchmark": "certify-rate", "model": _recipe(args.dataset).name, "device": args.device,
                          "settings": {k: getattr(args, k) for k in ("num", "n0", "n", "alpha", "sigma", "threads",
                                                                     "seed", "repeats")},
                          "machine": machine, "rate": rate}, indent=1))
        return
    if args.equal_batches:
        eq: dict[str, Any] = {}
        for b in [int(v) for v in args.equal_batches.split(",") if v.strip()]:
            a = argparse.Namespace(**vars(args))
            a.batch, a.art_batch, a.part = b, b, "equal-batch"
            def note(_name: str, res: dict[str, Any], b: int = b) -> None:
                eq.setdefault("errors", []).append({"batch": b, **res})

            eq[str(b)] = interleaved(a, ("stealkit", "art"), args.repeats, note)
        machine["load_average_end"] = os.getloadavg()
        rowmeta.finish(meta)
        print(json.dumps({"benchmark": "certify-equal-batch", "model": _recipe(args.dataset).name,
                          "settings": {k: getattr(args, k) for k in ("num", "n0", "n", "alpha", "sigma", "threads",
                                                                     "seed", "repeats")},
                          "machine": machine, "equal_batch": eq}, indent=1))
        return
    names = ["stealkit"] + (["stealkit-plain"] if args.with_plain else []) + ([] if args.skip_art else ["art"])
    runs = {name: spawn(args, name, args.n, args.num) for name in names}
    table: dict[str, Any] = {}
    for name, res in runs.items():
        _row(args, {"part": "accuracy", "certifier": name, "batch": args.art_batch if name == "art" else args.batch,
                    **{k: res.get(k) for k in ("n", "num", "y", "labels", "radii", "images_per_second", "seconds",
                                               "cpu_seconds", "peak_rss_mib", "error")}})
        if "error" in res:
            table[name] = res
            continue
        row = {"images_per_second": round(res["images_per_second"], 3), "seconds": round(res["seconds"], 1),
               "cpu_seconds": round(res.get("cpu_seconds", float("nan")), 1),
               "peak_rss_mib": round(res["peak_rss_mib"], 1)}
        for b in res["labels"]:
            row[f"certified_accuracy_{b}"] = certified_accuracy(res, b)
            row[f"abstain_{b}"] = round(sum(v == -1 for v in res["labels"][b]) / res["num"], 4)
        table[name] = row
    out: dict[str, Any] = {"benchmark": "certify", "model": _recipe(args.dataset).name,
                           "model_clean_accuracy": trained.metrics.get("test_accuracy"),
                           "settings": {k: getattr(args, k) for k in ("num", "n0", "n", "alpha", "sigma", "threads",
                                                                      "seed", "batch", "art_batch")},
                           "results": table}
    ok = [n for n in ("stealkit", "art") if n in table and "error" not in table[n]]
    if len(ok) == 2:
        a, b = table["stealkit"]["certified_accuracy_cohen"], table["art"]["certified_accuracy_cohen"]
        out["cohen_minus_art_points"] = {r: round(100 * (a[r] - b[r]), 2) for r in a}
        out["speedup_vs_art"] = round(table["stealkit"]["images_per_second"] / table["art"]["images_per_second"], 2)
    mem: dict[str, Any] = {}
    for n in [int(v) for v in args.mem_ns.split(",") if v.strip()]:
        for name in ["stealkit"] + ([] if args.skip_art else ["art"]):
            res = spawn(args, name, n, args.mem_num)
            _row(args, {"part": "memory", "certifier": name, "n": n, "num": args.mem_num,
                        **{k: res.get(k) for k in ("peak_rss_mib", "rss_before_mib", "seconds", "error")}})
            mem[f"{name} n={n}"] = res.get("error") or {"peak_rss_mib": round(res["peak_rss_mib"], 1),
                                                         "rss_before_mib": round(res["rss_before_mib"], 1),
                                                         "seconds": round(res["seconds"], 1)}
    out["memory_scaling"] = {"images": args.mem_num, "runs": mem}
    rowmeta.finish(meta)
    print(json.dumps(out, indent=1))


if __name__ == "__main__":
    main()
