"""The feature-vector victim of docs/guide/tabular.md and docs/results.md: scikit-learn's breast-cancer data (569
rows, 30 raw features), a StandardScaler + MLPClassifier pipeline trained on the owner's 200 rows, converted to ONNX
by skl2onnx, and the owner's other arrays: the attacker's pool and the labelled test split.

    python benchmarks/breast_cancer_victim.py --out runs/bc
    stealkit audit --victim runs/bc/bc.onnx --pool runs/bc/pool.npz --test-data runs/bc/test.npz --quick \\
        --set min_steps=0 --out runs/audit-bc

Writes bc.onnx (probabilities as one float tensor, zipmap off), pool.npz (x: 198 rows), test.npz (x, y: 171 rows)
and prints the pipeline's accuracy on the test split, computed by scikit-learn (the audit must report the same).
"""

from __future__ import annotations

import argparse
import json
from pathlib import Path

import numpy as np


def build(out: Path, seed: int = 0) -> dict[str, float | int]:
    """Write the victim and the owner's arrays under ``out``; its test accuracy and the split sizes."""
    from skl2onnx import to_onnx
    from sklearn.datasets import load_breast_cancer
    from sklearn.model_selection import train_test_split
    from sklearn.neural_network import MLPClassifier
    from sklearn.pipeline import make_pipeline
    from sklearn.preprocessing import StandardScaler

    out.mkdir(parents=True, exist_ok=True)
    x, y = load_breast_cancer(return_X_y=True)
    x = x.astype(np.float32)
    x_train, x_test, y_train, y_test = train_test_split(x, y, test_size=0.3, random_state=seed, stratify=y)
    model = make_pipeline(StandardScaler(), MLPClassifier((32,), max_iter=2000, random_state=seed))
    model.fit(x_train[:200], y_train[:200])  # the owner's training rows; the rest of the split is the pool
    clf = model.steps[-1][1]
    onnx = to_onnx(model, x_train[:1], options={id(clf): {"zipmap": False}})
    (out / "bc.onnx").write_bytes(onnx.SerializeToString())
    np.savez(out / "pool.npz", x=x_train[200:])
    np.savez(out / "test.npz", x=x_test, y=y_test)
    return {"test_accuracy": float((model.predict(x_test) == y_test).mean()), "train": 200,
            "pool": len(x_train) - 200, "test": len(x_test), "features": int(x.shape[1])}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", type=Path, required=True, help="directory to write the victim and arrays to")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    print(json.dumps(build(args.out, args.seed)))


if __name__ == "__main__":
    main()
