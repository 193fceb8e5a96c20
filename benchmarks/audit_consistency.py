"""The audit's headline figures reproduced by the separate commands it ran (issue 39, "Must show": consistency).

Runs a small ``stealkit audit`` on a local victim, then, as a user would, the separate commands behind its
headline figures with the same arguments and seed, each into its own folder:

- the best stolen copy's fidelity (the copy the attacks start from): ``stealkit extract surrogate`` with the
  part's budget, answer kind, pool and seed and the audit's ``--set`` recipe as that command's flags;
- PGD's transfer success from that copy: ``stealkit attack pgd --substitute <the audit's part folder>`` at the
  paper's eps (the command the audit recorded, with another ``--out``);
- HopSkipJump's median L2 without and with the copy: ``stealkit attack hopskipjump`` (likewise).

Each figure is compared at the precision the separate command writes it (``summary.json``: 6 decimals); the
headline's value (the audit's ``summary.json``) must be the same to the last digit. Prints JSON; exits 1 when a
figure differs.

    python benchmarks/audit_consistency.py --out runs/audit-consistency
    python benchmarks/audit_consistency.py --answers label --budgets 20 --transfer-images 10 --decision-images 2 \\
        --decision-queries 20 --set student=mlp2 --out /tmp/c
"""

from __future__ import annotations

import argparse
import json
import os
import shlex
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]


def stealkit(args: list[str]) -> float:
    """Run ``stealkit ARGS`` as a separate process (one CPU thread); its seconds."""
    env = os.environ | {"OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1"),
                        "PYTHONPATH": os.pathsep.join([str(ROOT / "src"), os.environ.get("PYTHONPATH", "")])}
    started = time.perf_counter()
    proc = subprocess.run([sys.executable, "-m", "stealkit.cli", "-q", *args], cwd=ROOT, env=env,
                          capture_output=True, text=True, check=False)
    if proc.returncode != 0:
        raise SystemExit(f"stealkit {shlex.join(args)} exited {proc.returncode}:\n{proc.stderr[-3000:]}")
    return round(time.perf_counter() - started, 1)


def summary(path: Path) -> dict[str, Any]:
    return json.loads((path / "summary.json").read_text(encoding="utf-8"))


def retarget(command: str, out: Path) -> list[str]:
    """The audit's recorded ``stealkit attack ...`` command, writing to ``out`` instead of the audit's folder."""
    args = shlex.split(command)[1:]  # drop "stealkit"
    i = args.index("--out")
    return [*args[:i + 1], str(out), *args[i + 2:]]


def compare(name: str, audit: float | None, separate: float | None, command: list[str]) -> dict[str, Any]:
    same = audit is not None and separate is not None and round(audit, 6) == separate
    return {"figure": name, "audit": audit, "separate": separate, "equal": same,
            "command": "stealkit " + shlex.join(command)}


def surrogate_flags(settings: list[str]) -> list[str]:
    """The audit's ``--set`` recipe as ``stealkit extract surrogate``'s own flags: an option (``epochs=5`` ->
    ``--epochs 5``), ``student.KEY=V`` -> ``--student-arg KEY=V``, any other setting -> ``--set KEY=V``."""
    from dataclasses import fields

    from stealkit.extract.surrogate_data.run import SurrogateOptions

    names = {f.name for f in fields(SurrogateOptions)}
    out: list[str] = []
    for kv in settings:
        key, value = kv.split("=", 1)
        if key.startswith("student."):
            out += ["--student-arg", f"{key.split('.', 1)[1]}={value}"]
        elif key in names:
            out += [f"--{key.replace('_', '-')}", value]
        else:
            out += ["--set", kv]
    return out


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--victim", default="standard:digits-conv2")
    ap.add_argument("--answers", default="label,probs")
    ap.add_argument("--budgets", default="50,100")
    ap.add_argument("--transfer-images", default="100")
    ap.add_argument("--decision-images", default="5")
    ap.add_argument("--decision-queries", default="200")
    ap.add_argument("--set", dest="settings", action="append", default=[], metavar="KEY=VALUE",
                    help="a --set of the audit's surrogate recipe (repeat)")
    ap.add_argument("--seed", default="0")
    ap.add_argument("--device", default="cpu")
    ap.add_argument("--out", type=Path, required=True, help="folder: the audit and each separate run inside")
    args = ap.parse_args()
    out: Path = args.out
    audit_dir = out / "audit"
    audit_args = ["audit", "--victim", args.victim, "--answers", args.answers, "--budgets", args.budgets,
                  "--transfer-images", args.transfer_images, "--decision-images", args.decision_images,
                  "--decision-queries", args.decision_queries, "--datafree-budget", "0", "--seed", args.seed,
                  "--device", args.device, *(a for kv in args.settings for a in ("--set", kv)), "--out", str(audit_dir)]
    seconds = {"audit": stealkit(audit_args)}
    s = summary(audit_dir)
    parts = {p["id"]: p for p in s["parts"]}
    figures = []

    transfer = next(p for p in s["parts"] if p["part"]["kind"] == "transfer")
    copy = parts[transfer["copy"]]
    cell = next(r for r in s["headline"] if r["answers"] == copy["part"]["answers"]
                and r["attacker"] == copy["part"]["attacker"] and r.get("defence", "none") == "none")
    extract = ["extract", "surrogate", "--victim", args.victim, "--budget", str(copy["part"]["budget"]), "--mode",
               copy["part"]["answers"], "--pool", copy["part"]["pool"], "--seed", args.seed,
               *surrogate_flags(args.settings), "--device", args.device, "--out", str(out / "extract")]
    seconds["extract surrogate"] = stealkit(extract)
    figures.append(compare(f"fidelity of {copy['id']} (headline: fidelity @{copy['part']['budget']}, "
                           f"{copy['part']['answers']} {copy['part']['attacker']})",
                           cell[f"fidelity @{copy['part']['budget']}"], summary(out / "extract")["fidelity"], extract))

    rows = {r["attack"]: r for r in s["enables"]}
    pgd = retarget(transfer["command"], out / "pgd")
    seconds["attack pgd"] = stealkit(pgd)
    row = next(r for a, r in rows.items() if a.startswith("PGD transfer"))
    figures.append(compare("PGD transfer success from the best copy (what the stolen copy enables)", row["success"],
                           summary(out / "pgd")["asr"], pgd))

    for p in s["parts"]:
        if p["part"]["kind"] != "decision":
            continue
        name = "with" if p["part"]["substitute"] else "without"
        hsj = retarget(p["command"], out / f"hsj-{name}")
        seconds[f"attack hopskipjump {name} the copy"] = stealkit(hsj)
        row = rows["HopSkipJump with the copy" if p["part"]["substitute"] else "HopSkipJump without a copy"]
        figures.append(compare(f"HopSkipJump median L2 {name} the copy", row["median L2"],
                               summary(out / f"hsj-{name}")["median_norm_successful"], hsj))

    doc = {"audit_command": "stealkit " + shlex.join(audit_args), "figures": figures,
           "all_equal": all(f["equal"] for f in figures), "seconds": seconds,
           "threads": os.environ.get("OMP_NUM_THREADS", "1"), "load_average": [round(x, 2) for x in os.getloadavg()]}
    print(json.dumps(doc, indent=2))
    if not doc["all_equal"]:
        sys.exit(1)


if __name__ == "__main__":
    main()
