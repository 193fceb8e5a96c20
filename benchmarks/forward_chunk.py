"""Victim forward throughput (images/s) against the chunk size, and the chunk stealkit's oracle chooses.

The LocalOracle answers a large query in chunks; on a CPU the chunk decides whether the activations stay in
cache (:mod:`stealkit.chunking`). For each standard victim this times the forward pass over the same
``--images`` random images at every chunk size in ``--sizes``, the sizes interleaved within each of
``--repeats`` rounds (so a change in the machine's load hits every size alike), under ``torch.inference_mode``
with ``--threads`` torch threads, and prints one JSON document: per victim and size the median, min and max
images/s, the largest layer output per image and the chunk :func:`~stealkit.chunking.forward_chunk`
picks. Run on a quiet machine:

    OMP_NUM_THREADS=1 PYTHONPATH=src .venv/bin/python benchmarks/forward_chunk.py
    PYTHONPATH=src python benchmarks/forward_chunk.py --device cuda --threads 16
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import statistics
import sys
import time


def main(argv: list[str] | None = None) -> int:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--victims", default="fmnist-conv2,fmnist-cnn4,digits-conv2")
    p.add_argument("--sizes", default="16,32,64,128,256,384,512,768,1024")
    p.add_argument("--images", type=int, default=8192)
    p.add_argument("--repeats", type=int, default=7)
    p.add_argument("--threads", type=int, default=1)
    p.add_argument("--device", default="cpu")
    args = p.parse_args(argv)

    import torch

    from stealkit.chunking import forward_chunk, largest_activation_bytes
    from stealkit.victims import standard_victim

    torch.set_num_threads(args.threads)
    sizes = [int(s) for s in args.sizes.split(",")]
    device = torch.device(args.device)
    out: dict[str, object] = {"torch": torch.__version__, "device": str(device), "threads": args.threads,
                              "machine": f"{platform.machine()} {os.cpu_count()} cores", "images": args.images,
                              "repeats": args.repeats, "date": time.strftime("%Y-%m-%d %H:%M"), "victims": {}}
    for name in args.victims.split(","):
        trained = standard_victim(name, device=str(device))
        model = trained.model.eval()
        shape = tuple(trained.spec.input_shape)
        x = torch.rand(args.images, *shape, generator=torch.Generator().manual_seed(0)).to(device)
        rates: dict[int, list[float]] = {s: [] for s in sizes}
        load = [os.getloadavg()[0]]
        with torch.inference_mode():
            model(x[: sizes[0]])  # warm-up
            for _ in range(args.repeats):
                for s in sizes:
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    t0 = time.perf_counter()
                    for i in range(0, args.images, s):
                        model(x[i : i + s])
                    if device.type == "cuda":
                        torch.cuda.synchronize()
                    rates[s].append(args.images / (time.perf_counter() - t0))
                load.append(os.getloadavg()[0])
        out["victims"][name] = {  # type: ignore[index]
            "input_shape": list(shape),
            "largest_activation_bytes": largest_activation_bytes(model, shape, device),
            "chosen_chunk": forward_chunk(model, shape, device),
            "load_avg_1min": [round(v, 2) for v in load],
            "images_per_s": {str(s): {"median": round(statistics.median(r)), "min": round(min(r)),
                                      "max": round(max(r))} for s, r in rates.items()},
        }
        print(f"{name}: done", file=sys.stderr, flush=True)
    print(json.dumps(out, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
