"""An extraction part's answer journal (the one journal of :mod:`stealkit.extract.journal`): a part stopped
midway and run again pays no query twice."""

from __future__ import annotations

from pathlib import Path

import torch
from torch import nn

from stealkit.extract.journal import JournalOracle
from stealkit.oracle import LocalOracle


class Counting(nn.Module):
    """A linear model that counts the images it answered (what the victim was asked)."""

    def __init__(self) -> None:
        super().__init__()
        self.fc = nn.Linear(4, 3)
        self.seen = 0

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        self.seen += x.shape[0]
        return self.fc(x.flatten(1))


def _journal(model: nn.Module, path: Path) -> JournalOracle:
    j = JournalOracle(LocalOracle(model, (1, 2, 2), num_classes=3, budget=10))
    j.open(path, replay=True)
    return j


def test_a_rerun_replays_the_stopped_attempts_answers_and_queries_from_the_first_difference(tmp_path: Path) -> None:
    torch.manual_seed(0)
    model = Counting()
    x = torch.rand(6, 1, 2, 2)
    first = _journal(model, tmp_path / "j.answers")
    model.seen = 0  # (the oracle may look at the model once when it is built)
    answers = [first.query(x[i:i + 2]) for i in (0, 2)]  # then the attempt is stopped
    first.close()
    assert model.seen == 4 and first.ledger.total == 4 and first.replayed == 0

    again = _journal(model, tmp_path / "j.answers")
    model.seen = 4
    assert torch.equal(again.query(x[0:2]), answers[0])  # the same first query: answered from the journal
    assert model.seen == 4 and again.ledger.total == 2 and again.replayed == 2
    other = x[4:6]
    assert torch.equal(again.query(other), model.fc(other.flatten(1)).softmax(1))  # differs: the victim answers
    assert model.seen == 6 and again.ledger.total == 4 and again.replayed == 2
    again.close()
    third = _journal(model, tmp_path / "j.answers")  # the journal now holds the first query and the new one
    model.seen = 6
    third.query(x[0:2])
    third.query(other)
    assert model.seen == 6 and third.replayed == 4
    assert again.num_classes == 3 and again.mode.value == "probs" and again.top_k == 1  # the rest is the oracle's
