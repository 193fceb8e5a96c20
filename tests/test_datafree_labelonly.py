"""The label-only parts of the data-free loop: DisGUIDE's objective, CaBaGE-style balanced filtering and hard
replay, the held-out-agreement selection of the reported student, and the named recipes. (Ledger counts and
stop/resume for these configurations run with the other methods in tests/test_datafree.py.)"""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from torch import nn

from stealkit.errors import InputError
from stealkit.extract.datafree.cabage import HardReplayBuffer, balanced_selection
from stealkit.extract.datafree.codfe import CoDFeAttack, CoDFeConfig, codfe_cost, extract_codfe
from stealkit.extract.datafree.disguide import class_diversity_loss, disagreement_loss, sample_disagreement
from stealkit.extract.datafree.loop import LoopConfig
from stealkit.extract.datafree.recipes import (
    DEFAULT,
    PAPER,
    RECIPES,
    SMALL_SIZES,
    VALIDATED,
    recipe_settings,
    recipe_sizes,
)
from stealkit.extract.datafree.selection import (
    ExponentialAverage,
    HeldOutStore,
    Selector,
    StudentSelector,
    agreement,
)
from stealkit.oracle import LocalOracle, OutputMode

from .test_datafree import SHAPE, Victim, student, tiny_victim_dir


@pytest.fixture(autouse=True)
def _one_thread() -> None:
    torch.set_num_threads(1)


# -- DisGUIDE ------------------------------------------------------------------------------------------------------
def test_disagreement_is_zero_for_agreeing_clones_and_its_gradient_stays_finite() -> None:
    p = torch.softmax(torch.randn(5, 1, 4), dim=2).repeat(1, 2, 1).requires_grad_(True)
    loss = disagreement_loss(p)
    loss.backward()
    assert abs(float(loss.detach())) < 1e-5
    assert torch.isfinite(p.grad).all()


def test_disagreement_grows_as_the_clones_part() -> None:
    a = torch.tensor([[0.7, 0.1, 0.1, 0.1]])
    close = torch.stack([a, torch.tensor([[0.6, 0.2, 0.1, 0.1]])], dim=1)
    far = torch.stack([a, torch.tensor([[0.1, 0.1, 0.1, 0.7]])], dim=1)
    assert float(disagreement_loss(far)) < float(disagreement_loss(close)) < 0
    assert float(sample_disagreement(far)[0]) > float(sample_disagreement(close)[0])


def test_class_diversity_is_lowest_for_a_balanced_batch() -> None:
    balanced = torch.eye(4).unsqueeze(1)  # four samples, one clone, one class each
    one_class = torch.eye(4)[[0, 0, 0, 0]].unsqueeze(1)
    assert float(class_diversity_loss(balanced)) < float(class_diversity_loss(one_class))


# -- CaBaGE-style filtering and replay -------------------------------------------------------------------------------
def test_balanced_selection_fills_the_rare_class_first_hardest_first() -> None:
    pred = torch.tensor([0, 0, 0, 0, 1, 1, 1, 1])
    hard = torch.tensor([0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8])
    counts = torch.tensor([0, 100])  # class 0 was never answered: its whole quota
    pick = balanced_selection(pred, hard, counts, 3)
    assert sorted(pick.tolist()) == [1, 2, 3]
    pick = balanced_selection(pred, hard, torch.tensor([10, 10]), 4)
    assert sorted(pick.tolist()) == [2, 3, 6, 7]  # even quotas, the hardest of each class
    assert balanced_selection(pred, hard, counts, 20).tolist() == list(range(8))


def test_hard_replay_draws_hard_rows_more_often() -> None:
    buf = HardReplayBuffer(10, (1, 2, 2), 3, hard=1.0)
    buf.add(torch.zeros(10, 1, 2, 2), torch.eye(3)[torch.arange(10) % 3])
    g = torch.Generator().manual_seed(0)
    buf.sample(10, g, "cpu")
    losses = torch.full((10,), 0.01)
    losses[buf.last_idx == 4] = 10.0  # row 4 is hard
    buf.update_hardness(losses)
    buf.sample(1000, g, "cpu")
    assert float((buf.last_idx == 4).float().mean()) > 0.5
    restored = HardReplayBuffer(10, (1, 2, 2), 3, hard=1.0)
    restored.load(buf.tensors(), buf.scalars())
    assert torch.equal(restored.w[:10], buf.w[:10])


# -- choosing the student without labels ---------------------------------------------------------------------------
def test_selector_never_trades_its_student_for_a_worse_one() -> None:
    x = torch.randn(50, 1, 8, 8)
    good = student()
    labels = good(x).argmax(1)
    bad = student()
    torch.manual_seed(11)
    for layer in bad.modules():
        if hasattr(layer, "reset_parameters"):
            layer.reset_parameters()
    assert agreement(bad, x, labels) < 1.0
    sel = StudentSelector(student(), 100, SHAPE, 4, "cpu")
    sel.add(x, torch.eye(4)[labels])
    assert sel.consider({"good": good}) == "good"
    assert agreement(sel.snapshot, x, labels) == 1.0
    assert sel.consider({"bad": bad}) == "good" and sel.score == 1.0
    assert agreement(sel.snapshot, x, labels) == 1.0


def test_reservoir_store_keeps_rows_from_every_round_and_recent_store_only_the_last() -> None:
    recent = HeldOutStore(50, (1,), 2, keep="recent")
    every = HeldOutStore(50, (1,), 2, keep="all", seed=3)
    for r in range(20):  # 20 rounds of 10 rows; row value = its round
        x, p = torch.full((10, 1), float(r)), torch.eye(2)[torch.zeros(10, dtype=torch.long)]
        recent.add(x, p)
        every.add(x, p)
    assert len(recent) == len(every) == 50 and every.seen == 200
    assert set(recent.x[:, 0].float().tolist()) == {15.0, 16.0, 17.0, 18.0, 19.0}
    kept = every.x[:, 0].float()
    assert float((kept < 10).float().mean()) > 0.25  # about half of a uniform sample is from the first ten rounds
    twin = HeldOutStore(50, (1,), 2, keep="all", seed=3)
    twin.load(every.tensors(), every.scalars())
    for store in (every, twin):
        store.add(torch.full((10, 1), 99.0), torch.eye(2)[torch.zeros(10, dtype=torch.long)])
    assert torch.equal(every.x, twin.x)  # the draws depend on (seed, rows seen) only: resume draws the same


def test_selection_margin_keeps_the_snapshot_within_the_store_noise() -> None:
    sel = StudentSelector(student(), 100, SHAPE, 4, "cpu", margin=1.0)
    se = (0.8 * 0.2 / 100) ** 0.5
    assert not sel.beats(0.8 + 0.5 * se, 0.8, 100) and sel.beats(0.8 + 1.5 * se, 0.8, 100)
    assert sel.beats(0.1, -1.0, 100)  # nothing selected yet: any candidate
    assert StudentSelector(student(), 100, SHAPE, 4, "cpu").beats(0.8, 0.8, 100)  # margin 0: at least as good


class FirstRows(StudentSelector):
    """A plug-in selector (the hook's tiny test): judge on the first held-out rows only, a store frozen once full
    (what ``holdout_keep="first"`` did before it was measured and not adopted, docs/notebook/label-only.md)."""

    def add(self, x: torch.Tensor, soft: torch.Tensor) -> None:
        room = self.store.capacity - len(self.store)
        if room > 0:
            super().add(x[:room], soft[:room])


def test_a_selector_plugs_in_through_make_selector() -> None:
    from stealkit.extract.datafree.dfme import DFMEAttack, DFMEConfig

    made: list[Selector] = []

    def make(snapshot: nn.Module) -> Selector:
        made.append(FirstRows(snapshot, 6, SHAPE, 4, "cpu"))
        return made[-1]

    config = CoDFeConfig(noise_set=20, batch_size=8, substitute_iterations=2, generator_iterations=1, nz=8, ngf=4,
                         holdout=0.25, ema=0.9)
    attack = CoDFeAttack(input_shape=SHAPE, num_classes=4, mode=OutputMode.LABEL, make_student=student,
                         config=config, make_selector=make)
    victim = Victim().eval()
    firsts = []
    for _ in range(3):
        out = attack.step(lambda x: (firsts.append(x.clone()), victim(x).argmax(1))[1], 0.0)
    assert attack.selector is made[0] and len(made) == 1 and len(made[0].store) == 6
    assert out["selected_agreement"] >= 0 and attack.reported() is made[0].snapshot
    assert made[0].source in {"student", "ema"}
    # the plug-in's own state travels through the checkpoint plumbing
    assert "holdout_buffer_x" in attack.extra_tensors() and attack.extra_scalars()["selector"]["holdout"]["filled"] == 6
    dfme = DFMEAttack(input_shape=SHAPE, num_classes=4, mode=OutputMode.LABEL, make_student=student,
                      config=DFMEConfig(objective="disagreement", holdout=0.25, batch_size=8, nz=8, ngf=4),
                      make_selector=make)
    assert dfme.selector is made[1] and isinstance(made[1], FirstRows)


def test_exponential_average_moves_towards_the_weights() -> None:
    m = nn.Linear(2, 2)
    avg = ExponentialAverage(m, 0.5)
    with torch.no_grad():
        m.weight.add_(2.0)
    before = avg.module.weight.clone()
    avg.update(m)
    assert torch.allclose(avg.module.weight, before + 1.0)


def _rows(x: torch.Tensor) -> list[bytes]:
    """Each row of ``x`` as bytes at half precision (the replay and held-out stores keep rows in float16)."""
    return [r.numpy().tobytes() for r in x.detach().cpu().float().half().flatten(1)]


def test_holdout_rows_are_paid_for_but_never_trained_on(monkeypatch: pytest.MonkeyPatch) -> None:
    """Every row any student step trains on (fresh or replayed) is recorded by a forward pre-hook on the student
    (a training forward: grad on and the student's weights trainable, which excludes scoring, filtering and the
    generator steps); every row given to the selector is recorded by a spy; every row the victim answers by a
    wrapper. No held-out row is ever trained on, and every held-out row was paid for."""
    held: list[bytes] = []
    trained: list[bytes] = []
    asked: list[bytes] = []
    add = StudentSelector.add

    def spy_add(self: StudentSelector, x: torch.Tensor, soft: torch.Tensor) -> None:
        held.extend(_rows(x))
        add(self, x, soft)

    monkeypatch.setattr(StudentSelector, "add", spy_add)

    class Recorder(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.victim = Victim().eval()

        def forward(self, x: torch.Tensor) -> torch.Tensor:
            asked.extend(_rows(x))
            return self.victim(x)

    def watched_student() -> nn.Module:
        m = student()

        def record(mod: nn.Module, args: tuple[torch.Tensor, ...]) -> None:
            if torch.is_grad_enabled() and any(p.requires_grad for p in mod.parameters()):
                trained.extend(_rows(args[0]))

        m.register_forward_pre_hook(record)
        return m

    loop = LoopConfig(eval_every=10**9, checkpoint_every=0, grid_samples=0, max_iterations=3)
    config = CoDFeConfig(noise_set=20, batch_size=8, substitute_iterations=4, generator_iterations=1, nz=8, ngf=4,
                         holdout=0.25, replay_capacity=100, ema=0.9, fresh_noise=True, candidates=2,
                         hard_replay=0.5, selection_margin=1.0, loop=loop)
    o = LocalOracle(Recorder().eval(), SHAPE, num_classes=4, mode="label", budget=None)
    asked.clear()  # the oracle's own shape probe at construction is not a query
    result = extract_codfe(o, make_student=watched_student, evaluator=None, config=config)
    assert o.ledger.as_dict()["predict"] == 3 * codfe_cost(config) == 60 == len(asked)
    assert len(held) == 3 * 5 == len(set(held))  # a quarter of every round, each row once
    assert set(held) <= set(asked)  # paid for: the victim answered every held-out row
    assert len(trained) >= 3 * 4 * 8 and set(trained) <= set(asked)  # students learn from answered rows only
    assert len(trained) > 3 * 4 * 8  # replay was on (replayed rows joined later batches)
    overlap = set(held) & set(trained)  # ... and never from a held-out one, fresh or replayed
    assert not overlap, f"{len(overlap)} of {len(held)} held-out rows were trained on"
    assert result.extra["losses"][-1]["selected_agreement"] >= 0


def test_cosine_schedule_anneals_only_the_clones_rate() -> None:
    config = CoDFeConfig(noise_set=20, batch_size=8, substitute_iterations=1, generator_iterations=1, nz=8, ngf=4,
                         substitute_schedule="cosine", lr_substitute=0.01, lr_generator=0.002)
    attack = CoDFeAttack(input_shape=SHAPE, num_classes=4, mode=OutputMode.LABEL, make_student=student,
                         config=config)
    victim = Victim().eval()
    attack.step(lambda x: victim(x).argmax(1), 0.5)
    rates = {name: opt.param_groups[0]["lr"] for name, opt in attack.optimizers.items()}
    assert rates == {"student": pytest.approx(0.005), "generator": 0.002}
    with pytest.raises(InputError, match="substitute_schedule"):
        CoDFeConfig(substitute_schedule="linear")


def test_selection_settings_are_checked() -> None:
    for bad in ({"holdout": 1.0}, {"ema": -0.1}, {"hard_replay": 2.0}, {"candidates": 0},
                {"noise_set": 2, "holdout": 0.6}, {"selection_margin": -1.0}, {"substitute_schedule": "step"}):
        with pytest.raises(InputError):
            CoDFeConfig(**bad)
    with pytest.raises(InputError, match="keep"):
        HeldOutStore(10, (1,), 2, keep="first")  # type: ignore[arg-type]


def test_curve_reports_the_selected_student_and_its_gap() -> None:
    from stealkit.metrics import Evaluator

    x = torch.rand(40, *SHAPE)
    victim = Victim().eval()
    ev = Evaluator(x, victim(x).argmax(1), victim(x).argmax(1))
    loop = LoopConfig(eval_every=40, checkpoint_every=0, grid_samples=0, max_iterations=4)
    config = CoDFeConfig(noise_set=20, batch_size=8, substitute_iterations=2, generator_iterations=1, nz=8, ngf=4,
                         holdout=0.25, ema=0.9, loop=loop)
    o = LocalOracle(victim, SHAPE, num_classes=4, mode="label", budget=None)
    result = extract_codfe(o, make_student=student, evaluator=ev, config=config)
    for point in result.curve:
        assert set(point["candidates"]) == {"student", "ema"}
        assert point["best_in_hindsight"] >= point["accuracy"]
        assert point["selection_gap_points"] == pytest.approx(100 * (point["best_in_hindsight"] - point["accuracy"]),
                                                              abs=0.01)
    assert result.accuracy == ev(result.student)["accuracy"]


# -- recipes ------------------------------------------------------------------------------------------------------
def test_paper_recipe_is_the_dataclass_defaults_and_the_validated_one_is_valid() -> None:
    assert set(RECIPES) == {PAPER, VALIDATED} and DEFAULT == VALIDATED == "labelonly-v3"  # the recorded name
    assert recipe_settings(PAPER, "codfe", "label") == {} and recipe_settings(PAPER, "dfme", "probs") == {}
    for mode in ("label", "probs", "topk"):
        CoDFeConfig(**recipe_settings(VALIDATED, "codfe", mode))
    from stealkit.commands.extract_datafree import datafree_options

    preset = next(p for p in datafree_options(lambda **kw: None).__click_params__ if p.name == "preset")
    assert list(preset.type.choices) == [VALIDATED, PAPER] and preset.default == DEFAULT
    assert "the default" in (preset.help or "")
    with pytest.raises(InputError, match="unknown recipe"):
        recipe_settings("best", "codfe", "label")


def test_recipe_sizes_follow_the_input_size() -> None:
    assert recipe_sizes(VALIDATED, "codfe", (1, 8, 8), "conv2") == SMALL_SIZES
    assert recipe_sizes(VALIDATED, "maze", (1, 8, 8), "mlp2") == {"ngf": SMALL_SIZES["ngf"]}
    assert recipe_sizes(VALIDATED, "codfe", (1, 28, 28), "conv2") == {}  # not validated there yet
    assert recipe_sizes(PAPER, "codfe", (1, 8, 8), "conv2") == {}
    assert recipe_sizes(VALIDATED, "dast", (1, 8, 8), "conv2") == {}  # no validated DaST recipe


@pytest.mark.slow
def test_cli_default_is_the_validated_recipe_and_names_it(tmp_path: Path) -> None:
    from stealkit.cli import main

    victim = tiny_victim_dir(tmp_path)
    common = ["-q", "extract", "codfe", "--victim", str(victim), "--budget", "4000", "--mode", "label", "--student",
              "mlp2", "--student-arg", "hidden=8", "--ngf", "4", "--max-iterations", "1"]
    assert main([*common, "--out", str(tmp_path / "a")]) == 0
    assert main([*common, "--preset", "paper", "--out", str(tmp_path / "b")]) == 0
    a = json.loads((tmp_path / "a" / "config.json").read_text())
    b = json.loads((tmp_path / "b" / "config.json").read_text())
    assert json.dumps(a).count(VALIDATED) >= 1 and json.dumps(b).count('"paper"') >= 1
    want = CoDFeConfig(**recipe_settings(VALIDATED, "codfe", "label"), ngf=4)
    assert json.loads((tmp_path / "a" / "summary.json").read_text())["queries"]["predict"] == want.noise_set
    assert a["config"]["codfe"]["ngf"] == 4 and a["config"]["recipe_sizes"] == {"ngf": 16}  # --ngf overrides
    # a conv2 student with no options: the sizes the recipe was validated at on 8x8 inputs, recorded
    conv = ["-q", "extract", "codfe", "--victim", str(victim), "--budget", "4000", "--mode", "label",
            "--max-iterations", "1"]
    assert main([*conv, "--student-arg", "hidden=32", "--out", str(tmp_path / "c")]) == 0
    c = json.loads((tmp_path / "c" / "config.json").read_text())["config"]
    assert c["recipe_sizes"] == SMALL_SIZES and c["codfe"]["ngf"] == SMALL_SIZES["ngf"]
    assert c["student_kwargs"] == SMALL_SIZES["student_kwargs"] | {"hidden": 32}


def test_disagreement_objective_costs_only_the_clone_steps_and_needs_no_smoothing() -> None:
    from stealkit.extract.datafree.dfme import DFMEConfig, dfme_cost, extract_dfme
    from stealkit.extract.datafree.maze import MAZEConfig, maze_cost

    assert dfme_cost(DFMEConfig(objective="disagreement")) == 256 * 5
    assert maze_cost(MAZEConfig(objective="disagreement")) == 128 * 5
    with pytest.raises(InputError, match="students >= 2"):
        MAZEConfig(objective="disagreement", students=1)
    loop = LoopConfig(eval_every=10**9, checkpoint_every=0, grid_samples=0, max_iterations=2)
    config = DFMEConfig(batch_size=8, nz=8, ngf=4, student_steps=2, objective="disagreement", label_smoothing=0.0,
                        loop=loop)
    o = LocalOracle(Victim().eval(), SHAPE, num_classes=4, mode="label", budget=None)
    extract_dfme(o, make_student=student, evaluator=None, config=config)
    assert o.ledger.as_dict()["predict"] == 2 * 16
