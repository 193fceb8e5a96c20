"""Certified robustness with additive Gaussian noise (Li et al., NeurIPS 2019; Cohen et al., ICML 2019).

- :mod:`~stealkit.certify.bounds`: Renyi (STN), Cohen and PixelDP radii from (p1, p2).
- :mod:`~stealkit.certify.confidence`: Clopper-Pearson with Bonferroni, Sison-Glaz.
- :mod:`~stealkit.certify.smoothing`: the smoothed classifier, ``certify`` and ``predict`` (Algorithm 1).
- :mod:`~stealkit.certify.training`: Gaussian augmentation, stability training, TRADES, PGD training.
- :mod:`~stealkit.certify.evaluate`: certified accuracy, EOT attacks, the soundness check.
- the paper's figures and tables at CPU scale are the study :mod:`stealkit.studies.stn_certify`.
"""

from stealkit.certify.bounds import (
    BOUNDS,
    cohen_radius,
    pixeldp_radius,
    radius,
    renyi_radius,
    renyi_radius_reference,
)
from stealkit.certify.confidence import clopper_pearson_lower, clopper_pearson_upper, pair_bounds, sison_glaz
from stealkit.certify.smoothing import (
    ABSTAIN,
    Certificate,
    SmoothingConfig,
    certify,
    certify_iter,
    noisy_counts,
    predict,
)
from stealkit.certify.training import RobustTrainConfig, train_robust

__all__ = [
    "ABSTAIN",
    "BOUNDS",
    "Certificate",
    "RobustTrainConfig",
    "SmoothingConfig",
    "certify",
    "certify_iter",
    "clopper_pearson_lower",
    "clopper_pearson_upper",
    "cohen_radius",
    "noisy_counts",
    "pair_bounds",
    "pixeldp_radius",
    "predict",
    "radius",
    "renyi_radius",
    "renyi_radius_reference",
    "sison_glaz",
    "train_robust",
]
