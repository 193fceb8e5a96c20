"""benchmarks/surrogate_extraction.py: its ``ours-default`` rows run exactly what ``stealkit extract surrogate``
runs; the ``art`` rows' thief trains as many epochs as the default's student, the ``art-steps`` rows as many
optimiser steps; ``--art-search`` chooses ART's learning rate and schedule off the test split, paying once."""

from __future__ import annotations

import argparse
import math

import pytest
import torch

from stealkit.extract.surrogate_data.presets import STUDENT_MIN_STEPS
from stealkit.extract.surrogate_data.run import SurrogateOptions, resolve_surrogate
from tests.conftest import TinyNet, load_benchmark


@pytest.fixture(scope="module")
def bench():
    return load_benchmark("surrogate_extraction")


def _args(bench, *settings: str, seed: int = 0) -> argparse.Namespace:
    """The ``--active`` options as a run without them gets them (the benchmark's own defaults)."""
    args = bench.active_parser().parse_args(["--active", *(x for s in settings for x in ("--set", s))])
    args.seed = seed
    return args


def test_the_benchmarks_defaults_are_the_commands(bench):
    args = _args(bench)
    cli = SurrogateOptions()
    assert (args.epochs, args.batch_size) == (cli.epochs, cli.batch_size) == (30, 64)


@pytest.fixture(scope="module")
def victim_dir(tmp_path_factory):
    from stealkit.models import ModelSpec, build_model, save_model

    torch.manual_seed(0)
    model = build_model("mlp2", input_shape=(1, 8, 8), num_classes=10, hidden=8)
    out = tmp_path_factory.mktemp("victim")
    save_model(model, ModelSpec("mlp2", (1, 8, 8), 10, kwargs={"hidden": 8}, extra={"dataset": "digits"}), out)
    return out


@pytest.mark.parametrize("mode,budget", [("label", 50), ("label", 100), ("label", 200), ("probs", 50), ("probs", 200),
                                         ("topk", 50)])
def test_the_benchmarks_default_row_is_what_the_command_runs(bench, victim_dir, tmp_path, monkeypatch, mode, budget):
    """The configuration ``stealkit extract surrogate`` hands to the attack (captured, the run stopped there) is the
    one the benchmark's ``ours-default`` row runs, at the benchmark's own defaults; fails if either ever moves."""
    from stealkit.cli import main
    from stealkit.extract.surrogate_data import surrogate as mod

    seen = []

    class Stop(Exception):
        pass

    def capture(*args, config, **kwargs):
        seen.append(config)
        raise Stop

    monkeypatch.setattr(mod, "extract_surrogate", capture)
    with pytest.raises(Stop):
        main(["-q", "extract", "surrogate", "--victim", str(victim_dir), "--mode", mode, "--budget", str(budget),
              "--seed", "2", "--out", str(tmp_path / "run")])
    assert seen[0] == bench.default_config(_args(bench, seed=2), budget, 10, mode)
    assert seen[0] == resolve_surrogate(SurrogateOptions(mode=mode), budget, 10, seed=2)[1]
    assert seen[0].batch_size == 64


@pytest.mark.parametrize("budget", [100, 300, 1000, 10_000])
def test_art_gets_the_epochs_the_default_raises_its_student_to(bench, budget):
    batches = math.ceil(budget / 64)
    want = max(30, math.ceil(STUDENT_MIN_STEPS / batches))
    assert bench.default_epochs(_args(bench), budget, 10, "probs", 10_000) == want
    assert want * batches >= STUDENT_MIN_STEPS  # the same steps as the default's student, at the same batch
    assert bench.default_epochs(_args(bench), budget, 10, "label", 10_000) == 30  # label answers: no floor
    for mode in ("probs", "label"):  # from 10 per class equal epochs are equal steps: the -steps rows are the same
        assert bench.steps_epochs(_args(bench), budget, 10, mode, 10_000) == \
            bench.default_epochs(_args(bench), budget, 10, mode, 10_000)


def test_below_ten_per_class_and_with_the_floor_off_art_keeps_the_given_epochs(bench):
    assert bench.default_epochs(_args(bench), 50, 10, "label", 10_000) == 30  # FixMatch on labels: no floor
    assert bench.default_epochs(_args(bench), 50, 10, "probs", 10_000) == 3000  # probabilities: the floor, 1 batch
    assert bench.default_epochs(_args(bench, "min_steps=0"), 100, 10, "probs", 10_000) == 30  # --set reaches ART
    assert bench.default_epochs(_args(bench, "min_steps=500"), 100, 10, "probs", 10_000) == 250
    assert bench.default_epochs(_args(bench), 100, 10, "probs", 60) == STUDENT_MIN_STEPS  # 60 answered: 1 batch


@pytest.mark.parametrize("budget,pool,factor", [(50, 10_000, 53), (50, 3_000, 16), (20, 1_000, 6)])
def test_below_ten_label_answers_per_class_the_steps_rows_give_art_fixmatchs_steps(bench, budget, pool, factor):
    """FixMatch cycles the answers over a third of the pool each epoch: at equal epochs our student takes
    ``factor`` times ART's steps (3-53x on Fashion-MNIST's 10k pool); the ``-steps`` rows give ART as many."""
    args = _args(bench)
    ours = bench.default_steps(args, budget, 10, "label", pool)
    assert ours == 30 * math.ceil(math.ceil(pool / 3) / 64)
    art_epochs = bench.default_epochs(args, budget, 10, "label", pool)
    batches = math.ceil(budget / 64)
    assert ours == factor * art_epochs * batches  # the gap the equal-epoch rows leave
    epochs = bench.steps_epochs(args, budget, 10, "label", pool)
    assert ours <= epochs * batches < ours + batches  # the -steps rows: at least as many, within one epoch


def test_art_row_names(bench):
    assert bench.art_rows("art", "label") == ["art-knockoff-random", "art-knockoff-adaptive", "art-copycat"]
    assert bench.art_rows("art-steps", "probs") == ["art-knockoff-prob-softmax-steps"]
    assert bench.art_rows("art-copycat-steps", "label") == ["art-copycat-steps"]
    assert bench.art_rows("art-copycat-steps", "probs") == []
    assert bench.art_rows("art-defaults", "probs") == ["art-knockoff-prob-softmax-defaults"]


def test_the_counting_victim_charges_an_image_once_across_replays(bench):
    counter = bench.CountingModel(TinyNet(seed=1).eval(), softmax=True)
    x = torch.rand(6, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    first = counter(x)
    counter(x[:2])
    assert counter.count == 8  # before replay: every image asked, as ART asks it
    counter.replay()
    assert torch.equal(counter(x[[3, 1]]), first[[3, 1]]) and counter.count == 8  # answered before: free
    counter(torch.cat([x[:1], torch.rand(2, 1, 4, 4)]))
    assert counter.count == 10  # two new images paid for


def test_art_search_chooses_on_unqueried_pool_images_and_pays_once(bench):
    """``--art-search``: six candidates (three learning rates, constant or cosine), each a fresh thief trained on
    the same stolen images; the choice is the best on the row's holdout (pool images it never queried); the
    victim answers each stolen image once; the row states the steps and the images."""
    pytest.importorskip("art")
    k, budget = 3, 24
    victim = TinyNet(seed=1).eval()
    pool = torch.rand(120, 1, 4, 4, generator=torch.Generator().manual_seed(0))
    with torch.no_grad():
        labels = victim(pool).argmax(1)
    args = argparse.Namespace(seed=0, student="mlp2", art_epochs=2, art_batch=8, art_steps_epochs=5,
                              art_search=True, art_holdout=40)
    scored = []

    def evaluator(model):
        scored.append(model)
        return {"accuracy": 0.5, "fidelity": 0.5}

    row = bench.art("art-copycat", victim, pool, labels, budget, evaluator, args, (1, 4, 4), k)
    assert row["queries"] == budget  # six thieves, one payment per image
    tried = row["search"]["tried"]
    assert [(t["lr"], t["schedule"]) for t in tried] == list(bench.ART_SEARCH) and row["search"]["holdout"] == 40
    best = max(tried, key=lambda t: t["holdout_accuracy"])
    assert (row["lr"], row["schedule"]) == (best["lr"], best["schedule"]) and len(scored) == 1  # one test score
    assert all(t["steps"] == 2 * math.ceil(budget / 8) for t in tried) and row["student_steps"] == 6
    assert row["images"].startswith("random: the seed's first 24")
    steps_row = bench.art("art-copycat-steps", victim, pool, labels, budget, evaluator,
                          argparse.Namespace(**{**vars(args), "art_search": False}), (1, 4, 4), k)
    assert steps_row["student_steps"] == 5 * math.ceil(budget / 8) and "search" not in steps_row
