"""The ART adapter: ART's attacks run through a metered stealkit oracle, and the ledger counts every image."""

from __future__ import annotations

from collections.abc import Callable

import numpy as np
import pytest
import torch
from torch import nn

from stealkit.errors import BudgetExhausted, InputError
from stealkit.interop.art_adapter import oracle_classifier
from stealkit.oracle import LocalOracle

pytest.importorskip("art")


@pytest.fixture(scope="module")
def digits() -> tuple[nn.Module, np.ndarray, np.ndarray]:
    """A tiny linear victim trained briefly on digits (1x8x8), and attacker pool images."""
    from stealkit.data import load_splits
    from stealkit.train import TrainConfig, fit

    splits = load_splits("digits")
    torch.manual_seed(0)
    victim = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    fit(victim, splits.victim_train.x, splits.victim_train.y, TrainConfig(epochs=3, batch_size=64, lr=1e-2))
    pool = splits.attacker_pool
    return victim.eval(), pool.x[:200].numpy(), pool.y[:200].numpy()


def _counted(clf: object) -> list[int]:
    """Wrap ``clf.predict`` to count, independently of the ledger, the images ART sends."""
    sent: list[int] = []
    inner: Callable[..., np.ndarray] = clf.predict  # type: ignore[attr-defined]

    def predict(x: np.ndarray, *args: object, **kwargs: object) -> np.ndarray:
        sent.append(int(np.shape(x)[0]))
        return inner(x, *args, **kwargs)

    clf.predict = predict  # type: ignore[attr-defined]
    return sent


def _thief() -> object:
    from art.estimators.classification import PyTorchClassifier

    torch.manual_seed(1)
    net = nn.Sequential(nn.Flatten(), nn.Linear(64, 10))
    return PyTorchClassifier(net, loss=nn.CrossEntropyLoss(), optimizer=torch.optim.Adam(net.parameters(), 1e-2),
                             input_shape=(1, 8, 8), nb_classes=10, clip_values=(0.0, 1.0))


def test_copycat_extraction_is_charged_image_for_image(digits: tuple) -> None:
    from art.attacks.extraction import CopycatCNN

    victim, x, y = digits
    oracle = LocalOracle(victim, (1, 8, 8), mode="label", budget=1000)
    clf = oracle_classifier(oracle)
    sent = _counted(clf)
    np.random.seed(0)
    attack = CopycatCNN(clf, batch_size_fit=32, batch_size_query=32, nb_epochs=5, nb_stolen=150)
    stolen = attack.extract(x, thieved_classifier=_thief())
    assert sum(sent) == 150
    assert oracle.ledger.as_dict()["predict"] == sum(sent)
    agree = (stolen.predict(x).argmax(1) == victim(torch.from_numpy(x)).argmax(1).numpy()).mean()
    assert agree > 0.5  # the thief learned from the one-hot labels ART got through the oracle


def test_hopskipjump_decision_attack_is_charged_image_for_image(digits: tuple) -> None:
    from art.attacks.evasion import HopSkipJump

    victim, x, _ = digits
    oracle = LocalOracle(victim, (1, 8, 8), mode="label")
    clf = oracle_classifier(oracle)
    sent = _counted(clf)
    np.random.seed(0)
    attack = HopSkipJump(clf, max_iter=2, max_eval=40, init_eval=10, init_size=20, verbose=False)
    adv = attack.generate(x[:2])
    assert adv.shape == x[:2].shape and adv.min() >= 0 and adv.max() <= 1
    assert sum(sent) > 2  # the decision attack queried many points, all through the oracle
    assert oracle.ledger.as_dict()["predict"] == sum(sent)


def test_budget_running_dry_is_an_error_not_a_truncation(digits: tuple) -> None:
    from art.attacks.extraction import CopycatCNN

    victim, x, _ = digits
    oracle = LocalOracle(victim, (1, 8, 8), mode="label", budget=100)
    attack = CopycatCNN(oracle_classifier(oracle), batch_size_query=32, nb_epochs=1, nb_stolen=150)
    with pytest.raises(BudgetExhausted, match="150 predictions but only 100 remain"):
        attack.extract(x, thieved_classifier=_thief())
    assert oracle.ledger.total == 0  # refused whole: nothing sent, nothing charged


def test_budget_running_dry_inside_a_decision_attack_stops_it(digits: tuple) -> None:
    from art.attacks.evasion import HopSkipJump

    victim, x, _ = digits
    oracle = LocalOracle(victim, (1, 8, 8), mode="label", budget=30)
    attack = HopSkipJump(oracle_classifier(oracle), max_iter=5, max_eval=40, init_eval=10, verbose=False)
    with pytest.raises(BudgetExhausted):
        attack.generate(x[:2])
    assert oracle.ledger.total <= 30


def test_output_modes_and_layouts(digits: tuple) -> None:
    victim, x, _ = digits
    probs = LocalOracle(victim, (1, 8, 8), mode="probs")
    expected = probs.query(torch.from_numpy(x[:5])).numpy()
    out = oracle_classifier(probs).predict(x[:5])
    assert out.dtype == np.float32 and np.allclose(out, expected, atol=1e-6)
    nhwc = oracle_classifier(probs, channels_first=False)
    assert nhwc.input_shape == (8, 8, 1)
    assert np.allclose(nhwc.predict(x[:5].transpose(0, 2, 3, 1).astype(np.float64)), expected, atol=1e-6)
    logits = oracle_classifier(LocalOracle(victim, (1, 8, 8), mode="logits")).predict(x[:5])
    assert np.allclose(logits, expected, atol=1e-5)
    onehot = oracle_classifier(LocalOracle(victim, (1, 8, 8), mode="label")).predict(x[:5])
    assert set(np.unique(onehot)) <= {0.0, 1.0} and (onehot.argmax(1) == expected.argmax(1)).all()
    assert probs.ledger.as_dict()["predict"] == 5 + 5 + 5


def test_bad_input_is_one_clear_error(digits: tuple) -> None:
    victim, x, _ = digits
    clf = oracle_classifier(LocalOracle(victim, (1, 8, 8), mode="probs"))
    with pytest.raises(InputError, match=r"pixels in \[0, 1\]"):
        clf.predict(x[:2] * 255)
    with pytest.raises(InputError, match="needs a stealkit Oracle"):
        oracle_classifier(victim)  # type: ignore[arg-type]


@pytest.mark.slow
def test_an_http_oracle_is_charged_on_the_server_too(tmp_path) -> None:  # noqa: ANN001
    """Over HTTP the server's own ledger charges the same images as the client's and as ART sent."""
    from art.attacks.evasion import HopSkipJump
    from fastapi.testclient import TestClient

    from stealkit.data import load_splits
    from stealkit.models import ModelSpec, build_model, save_model
    from stealkit.oracle.http import HttpOracle
    from stealkit.serve.app import create_app
    from stealkit.train import TrainConfig, fit
    from tests.test_serve_support import write_keys

    torch.manual_seed(0)
    model = build_model("logistic", input_shape=(1, 8, 8), num_classes=10)
    train = load_splits("digits").victim_train
    fit(model, train.x, train.y, TrainConfig(epochs=2, batch_size=64, lr=1e-2))
    victim = save_model(model.eval(), ModelSpec.from_model(model, extra={"dataset": "digits"}), tmp_path / "victim")
    key = "art-key-Zx81QpLw6RtV3mNb7Yc4"
    keys = write_keys(tmp_path / "keys.toml", [{"key": key, "name": "art", "mode": "label", "budget": 400}])
    client = TestClient(create_app(victim, keys, tmp_path / "db.sqlite"))
    oracle = HttpOracle("http://testserver", key=key, transport=client._transport, backoff=0.0)
    clf = oracle_classifier(oracle)
    sent = _counted(clf)
    np.random.seed(0)
    x = torch.rand(2, 1, 8, 8, generator=torch.Generator().manual_seed(0)).numpy()
    HopSkipJump(clf, max_iter=2, max_eval=40, init_eval=10, init_size=20, verbose=False).generate(x)
    server = client.get("/v1/info", headers={"Authorization": f"Bearer {key}"}).json()["queries_used"]["predict"]
    assert sum(sent) > 2 and oracle.ledger.as_dict()["predict"] == sum(sent) == server
    with pytest.raises(BudgetExhausted):  # the server's budget, mirrored by the client's ledger
        clf.predict(np.repeat(x, 400 - server + 1, axis=0)[: 400 - server + 1])
    assert client.get("/v1/info", headers={"Authorization": f"Bearer {key}"}).json()["queries_used"]["predict"] \
        == server
