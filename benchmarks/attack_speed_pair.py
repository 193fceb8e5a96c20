"""stealkit PGD against torchattacks PGD in one process, alternating which goes first: a low-variance check.

Same attack as ``attack_speed.py`` (PGD Linf, eps 0.1, step 0.01, 20 steps, random start) on the first ``--n``
Fashion-MNIST test images against ``standard_victim("fmnist-conv2")``; prints JSON with every time and the
medians.

    .venv/bin/python benchmarks/attack_speed_pair.py --n 300 --batch 32 --repeats 7 --threads 1
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys
import time
from pathlib import Path

import torch


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--n", type=int, default=300)
    ap.add_argument("--batch", type=int, default=32)
    ap.add_argument("--repeats", type=int, default=7)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    try:
        import torchattacks  # noqa: F401
    except ImportError:
        sys.exit("torchattacks is not installed: pip install --no-deps torchattacks==3.5.1 (a benchmark-only extra)")
    sys.path.insert(0, str(Path(__file__).parent))
    from attack_speed import run_stealkit, run_torchattacks
    from stealkit.data import load_splits
    from stealkit.victims import standard_victim

    torch.set_num_threads(args.threads)
    model = standard_victim("fmnist-conv2").model.eval()
    test = load_splits("fashion-mnist").test
    x, y = test.x[: args.n], test.y[: args.n]
    pair = [("stealkit", run_stealkit), ("torchattacks", run_torchattacks)]
    times: dict[str, list[float]] = {name: [] for name, _ in pair}
    for r in range(args.repeats):
        for name, fn in pair if r % 2 == 0 else pair[::-1]:
            t0 = time.perf_counter()
            fn(model, x, y, args.batch, 0)
            times[name].append(round(time.perf_counter() - t0, 3))
    print(json.dumps({"benchmark": "pgd_linf_speed_pair", "args": vars(args), "times_s": times,
                      "median_s": {k: statistics.median(v) for k, v in times.items()}}, indent=1))


if __name__ == "__main__":
    main()
