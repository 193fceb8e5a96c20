"""Any stealkit :class:`~stealkit.oracle.Oracle` as an ART ``BlackBoxClassifier`` (issue 17, item 4).

ART's extraction and evasion attacks call ``classifier.predict``; here every image they send goes through
``oracle.query``, so it is validated, answered in the oracle's output mode and charged to its ledger (a count
ART itself does not keep). The oracle's mode decides what ART sees:

=========================  ====================================================
oracle mode                what ``predict`` returns (float32 ``[B, K]``)
=========================  ====================================================
``label``                  one-hot rows of the top-1 class
``probs`` / ``topk``       the probabilities as the oracle returns them
``logits``                 ``softmax(logits)`` (ART's attacks expect probabilities)
=========================  ====================================================

Images go to the oracle as float32 NCHW in [0, 1]; with ``channels_first=False`` ART's arrays are NHWC and
are transposed first. A ``predict`` call the budget cannot answer in full raises
:class:`~stealkit.errors.BudgetExhausted` before anything is sent (ART would otherwise answer the batch in
chunks and stop half-way): never a silent truncation.

Needs the optional extra ``stealkit[art]`` (``adversarial-robustness-toolbox``).
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch

from stealkit.errors import BudgetExhausted, InputError, StealkitError
from stealkit.oracle.base import Oracle, OutputMode
from stealkit.oracle.ledger import QueryKind

__all__ = ["oracle_classifier"]


def _blackbox_class() -> type:
    try:
        from art.estimators.classification import BlackBoxClassifier
    except ImportError:
        raise StealkitError("the ART adapter needs adversarial-robustness-toolbox: "
                            "pip install 'stealkit[art]'") from None
    return BlackBoxClassifier


def oracle_classifier(oracle: Oracle, *, channels_first: bool = True) -> Any:
    """Wrap ``oracle`` as an ART ``BlackBoxClassifier`` (``clip_values=(0, 1)``, no preprocessing).

    ``channels_first=False`` gives ART the shape ``(H, W, C)`` and transposes its batches to NCHW.
    """
    if not isinstance(oracle, Oracle):
        raise InputError(f"oracle_classifier needs a stealkit Oracle, got {type(oracle).__name__}")
    base = _blackbox_class()

    class OracleClassifier(base):  # type: ignore[misc, valid-type]
        """ART's view of a metered stealkit oracle; :attr:`oracle` keeps the ledger."""

        def __init__(self) -> None:
            self.oracle = oracle
            self.channels_first = channels_first
            c, h, w = oracle.input_shape
            shape = (c, h, w) if channels_first else (h, w, c)
            super().__init__(self._answer, shape, int(oracle.num_classes), clip_values=(0.0, 1.0))

        def predict(self, x: np.ndarray, batch_size: int = 128, **kwargs: Any) -> np.ndarray:
            n = int(np.shape(x)[0]) if np.ndim(x) else 0
            left = oracle.ledger.remaining(QueryKind.PREDICT)
            if left is not None and n > left:
                raise BudgetExhausted(
                    f"query budget exhausted: ART asked for {n} predictions but only {left} remain "
                    f"(used {oracle.ledger.as_dict()}); nothing was sent. Raise the budget or ask for fewer.",
                    requested=n, remaining=left, kind=QueryKind.PREDICT.value)
            return super().predict(x, batch_size=batch_size, **kwargs)

        def _answer(self, x: np.ndarray) -> np.ndarray:
            arr = np.asarray(x)
            if arr.dtype.kind == "f" and arr.dtype != np.float32:
                arr = arr.astype(np.float32)
            if not self.channels_first and arr.ndim == 4:
                arr = arr.transpose(0, 3, 1, 2)
            answer = oracle.query(torch.from_numpy(np.ascontiguousarray(arr))).detach().cpu()
            if oracle.mode is OutputMode.LABEL:
                out = torch.nn.functional.one_hot(answer.long(), int(oracle.num_classes)).float()
            elif oracle.mode is OutputMode.LOGITS:
                out = torch.softmax(answer.float(), dim=1)
            else:
                out = answer.float()
            return out.numpy()

    return OracleClassifier()
