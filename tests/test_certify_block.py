"""The certificates of a block of images, computed together (issue 53), are those of the per-image path."""

from __future__ import annotations

import numpy as np
import pytest

from stealkit.certify.smoothing import Certificate, SmoothingConfig, certify_block, certify_counts


def _random_counts(rng: np.random.Generator, b: int, k: int, n0: int, n: int) -> tuple[np.ndarray, np.ndarray]:
    """Counts from every regime: a clear winner, near ties, all in one class, spread out, a disagreeing selection."""
    probs = rng.dirichlet(rng.choice([0.05, 0.5, 5.0]) * np.ones(k), size=b)
    probs[: b // 5] = np.eye(k)[rng.integers(0, k, b // 5)]  # everything in one class
    tie = rng.integers(0, k, b // 6)
    probs[b // 5 : b // 5 + len(tie)] = 0.0
    probs[np.arange(b // 5, b // 5 + len(tie)), tie] = 0.5
    probs[np.arange(b // 5, b // 5 + len(tie)), (tie + 1) % k] = 0.5
    counts0 = np.stack([rng.multinomial(n0, p) for p in probs])
    counts = np.stack([rng.multinomial(n, p) for p in probs])
    counts0[-3:] = np.roll(counts0[-3:], 1, axis=1)  # the selection picks another class than the estimate's top
    return counts0, counts


def _same(a: Certificate, b: Certificate) -> None:
    assert (a.label, a.counts_selection, a.counts) == (b.label, b.counts_selection, b.counts)
    for got, want in ((a.pa_lower, b.pa_lower), (a.p1_lower, b.p1_lower), (a.p2_upper, b.p2_upper)):
        assert got == pytest.approx(want, rel=1e-12, abs=0)
    assert a.radius.keys() == b.radius.keys()
    for bound, want in b.radius.items():
        got = a.radius[bound]
        assert (got is None) == (want is None), (bound, got, want)  # the same images abstain
        if want is not None:
            assert got == pytest.approx(want, rel=1e-12, abs=1e-300), bound
    assert a.to_record().keys() == b.to_record().keys()


@pytest.mark.parametrize("seed", [0, 1, 2])
@pytest.mark.parametrize("k,n0,n,sigma,alpha", [(10, 100, 1000, 0.5, 0.001), (3, 20, 200, 0.25, 0.05),
                                                (2, 10, 100000, 1.0, 0.001)])
def test_block_gives_the_per_image_certificates(seed: int, k: int, n0: int, n: int, sigma: float, alpha: float) -> None:
    rng = np.random.default_rng(seed)
    counts0, counts = _random_counts(rng, 60, k, n0, n)
    cfg = SmoothingConfig(sigma=sigma, n0=n0, n=n, alpha=alpha)
    block = certify_block(counts0, counts, cfg)
    assert len(block) == len(counts)
    for i, cert in enumerate(block):
        _same(cert, certify_counts(counts0[i], counts[i], cfg))
    # every regime occurs: certified and abstaining images under each bound
    for bound in cfg.bounds:
        got = [c.radius[bound] is None for c in block]
        assert any(got) and not all(got), bound


def test_block_with_sison_glaz_and_a_subset_of_bounds() -> None:
    rng = np.random.default_rng(7)
    counts0, counts = _random_counts(rng, 12, 4, 30, 300)
    cfg = SmoothingConfig(sigma=0.5, n0=30, n=300, alpha=0.01, interval="sison-glaz", bounds=("renyi",))
    for i, cert in enumerate(certify_block(counts0, counts, cfg)):
        _same(cert, certify_counts(counts0[i], counts[i], cfg))
    assert certify_block(counts0[:0], counts[:0], cfg) == []


def test_certify_iter_does_not_depend_on_the_block_sizes_and_matches_the_per_image_path() -> None:
    """The noise and the counts are those of :func:`noisy_counts` whatever the block sizes; each certificate is the
    per-image path's on those counts."""
    import torch
    from torch import nn

    from stealkit.certify.smoothing import certify_iter, fast_forward, noisy_counts

    torch.manual_seed(0)
    model = nn.Sequential(nn.Flatten(), nn.Linear(16, 3)).eval()
    x = torch.rand(11, 1, 4, 4, generator=torch.Generator().manual_seed(1))
    cfg = SmoothingConfig(sigma=0.3, n0=8, n=60, alpha=0.05, batch_size=50)
    runs = [list(certify_iter(model, x, cfg, images_per_block=ipb, radius_block=rb))
            for ipb, rb in ((None, 256), (1, 1), (3, 4), (4, 3), (11, 1))]
    c = noisy_counts(fast_forward(model), x, cfg.sigma, (cfg.n0, cfg.n), num_classes=3, batch_size=cfg.batch_size,
                     generator=torch.Generator().manual_seed(cfg.seed)).numpy()
    want = [certify_counts(c[0, i], c[1, i], cfg) for i in range(len(x))]
    for run in runs:
        assert [r.to_record() for r in run] == [w.to_record() for w in want]
    with pytest.raises(Exception, match="radius_block"):
        list(certify_iter(model, x, cfg, radius_block=0))
