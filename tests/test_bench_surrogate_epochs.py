"""benchmarks/surrogate_extraction.py --active: ART's thief trains as many epochs as the default's student."""

from __future__ import annotations

import argparse
import math

import pytest

from stealkit.extract.surrogate_data.surrogate_presets import STUDENT_MIN_STEPS
from tests.conftest import load_benchmark


def _args(*settings: str) -> argparse.Namespace:
    return argparse.Namespace(epochs=30, batch_size=64, set=list(settings))


@pytest.mark.parametrize("budget", [100, 300, 1000, 10_000])
def test_art_gets_the_epochs_the_default_raises_its_student_to(budget):
    bench = load_benchmark("surrogate_extraction")
    batches = math.ceil(budget / 64)
    want = max(30, math.ceil(STUDENT_MIN_STEPS / batches))
    assert bench.default_epochs(_args(), budget, 10, "probs", 10_000) == want
    assert want * batches >= STUDENT_MIN_STEPS  # the same steps as the default's student, at the same batch
    assert bench.default_epochs(_args(), budget, 10, "label", 10_000) == 30  # label answers: no floor


def test_below_ten_per_class_and_with_the_floor_off_art_keeps_the_given_epochs():
    bench = load_benchmark("surrogate_extraction")
    assert bench.default_epochs(_args(), 50, 10, "label", 10_000) == 30  # FixMatch on labels: no floor
    assert bench.default_epochs(_args(), 50, 10, "probs", 10_000) == 3000  # probabilities: the floor, 1 batch
    assert bench.default_epochs(_args("min_steps=0"), 100, 10, "probs", 10_000) == 30  # --set reaches ART too
    assert bench.default_epochs(_args("min_steps=500"), 100, 10, "probs", 10_000) == 250
    assert bench.default_epochs(_args(), 100, 10, "probs", 60) == STUDENT_MIN_STEPS  # 60 answered: 1 batch
