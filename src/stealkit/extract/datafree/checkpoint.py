"""Checkpoints of a data-free run: safetensors + JSON, never pickles.

Model and optimiser tensors and the random-generator states go to ``state-<iteration>.safetensors``; optimiser
scalars, the ledger's ``state_dict()``, the iteration counter, the curve and the loss records go to
``checkpoint.json`` (written last, atomically, so it always names a complete state). Each checkpoint starts a
fresh answer journal (:mod:`stealkit.extract.journal`).
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

import torch

from stealkit.errors import InputError
from stealkit.extract.datafree.attack import DataFreeAttack
from stealkit.fsutil import atomic_path, atomic_write_json, to_jsonable
from stealkit.oracle.ledger import QueryLedger

CHECKPOINT_FORMAT = "stealkit-datafree-checkpoint/1"


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
