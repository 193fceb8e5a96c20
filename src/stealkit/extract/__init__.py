"""Extraction attacks: one module per method, sharing the victim handle, losses and result type.

| method | module | paper |
| --- | --- | --- |
| plain baseline | ``baseline`` | - |
| surrogate data, Knockoff Nets | ``surrogate``, ``knockoff`` | DFME appendix A; Orekondy et al. 2019 |
| DFME, MAZE, DaST, CoDFe | ``dfme``, ``maze``, ``dast``, ``codfe`` | Truong et al. 2021; Kariyappa et al. 2021; Zhou et al. 2020; CoDFe |
| exact recovery, membership variant, logistic | ``exact``, ``exact_mq``, ``logistic_exact`` | Milli et al. 2019, Alg. 1, App. C, fn. 2 |
| exact recovery beyond the paper (secant search, biased multi-output nets) | ``exact_secant`` | - |
| gradient matching | ``gradient_matching`` | Milli et al. 2019, Sec. 4 |

The methods by public name (run function, config dataclass): :data:`stealkit.extract.registry.METHODS`.
Names are imported lazily, so ``import stealkit.extract`` stays cheap.
"""

from __future__ import annotations

import importlib
from typing import Any

_EXPORTS = {
    "BaselineConfig": "surrogate_data.baseline", "extract_baseline": "surrogate_data.baseline",
    "ExtractionResult": "common", "Victim": "common", "open_victim": "common",
    "SurrogateConfig": "surrogate_data.surrogate", "KnockoffConfig": "surrogate_data.knockoff", "extract_surrogate": "surrogate_data.surrogate",
    "DFMEConfig": "datafree.dfme", "extract_dfme": "datafree.dfme", "MAZEConfig": "datafree.maze", "extract_maze": "datafree.maze",
    "DaSTConfig": "datafree.dast", "extract_dast": "datafree.dast", "CoDFeConfig": "datafree.codfe", "extract_codfe": "datafree.codfe",
    "ExactConfig": "explanations.exact", "RecoveryFailure": "explanations.exact", "recover_two_layer": "explanations.exact",
    "recover_two_layer_mq": "explanations.exact_mq", "identify_logistic": "explanations.logistic_exact",
    "GradMatchConfig": "explanations.gradient_matching", "extract_gradient_matching": "explanations.gradient_matching",
    "recover_logits": "logit_recovery", "METHODS": "registry",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str) -> Any:
    if name not in _EXPORTS:
        raise AttributeError(f"module 'stealkit.extract' has no attribute {name!r}")
    return getattr(importlib.import_module(f"stealkit.extract.{_EXPORTS[name]}"), name)
