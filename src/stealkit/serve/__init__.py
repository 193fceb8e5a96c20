"""Serving a victim as a pay-per-query prediction and explanation API (FastAPI + SQLite), with defences.

``create_app(model_dir, keys, db)`` builds the app; ``stealkit serve`` runs it under uvicorn. Defences in
:mod:`stealkit.serve.defences` also work as ``LocalOracle(defences=...)``; PRADA detection lives in
:mod:`stealkit.serve.detection`.
"""

from stealkit.serve.defences import (
    gaussian_noise,
    label_only,
    parse_defence,
    reverse_sigmoid,
    rounding,
    top_k,
)
from stealkit.serve.detection import Prada, PradaConfig
from stealkit.serve.keys import KeyConfig, ServerConfig, load_keys, parse_keys
from stealkit.serve.store import Store

__all__ = [
    "KeyConfig",
    "Prada",
    "PradaConfig",
    "ServerConfig",
    "Store",
    "create_app",
    "gaussian_noise",
    "label_only",
    "load_keys",
    "parse_defence",
    "parse_keys",
    "reverse_sigmoid",
    "rounding",
    "top_k",
]


def create_app(*args, **kwargs):  # noqa: ANN002, ANN003, ANN201 - lazy import of FastAPI
    """See :func:`stealkit.serve.app.create_app`."""
    from stealkit.serve.app import create_app as _create_app

    return _create_app(*args, **kwargs)
