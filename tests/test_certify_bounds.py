"""Property tests of the certified radii (Renyi / Cohen / PixelDP) and their confidence bounds."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import assume, given, settings
from hypothesis import strategies as st
from scipy import stats
from scipy.special import ndtri

from stealkit.certify.bounds import (
    cohen_radius,
    pixeldp_radius,
    pixeldp_radius_grid,
    renyi_divergence_bound,
    renyi_radius,
    renyi_radius_reference,
)
from stealkit.certify.confidence import clopper_pearson_lower, clopper_pearson_upper, pair_bounds, sison_glaz
from stealkit.errors import InputError

prob = st.floats(min_value=0.0, max_value=1.0, allow_nan=False)
sigma_st = st.floats(min_value=0.05, max_value=3.0)


@st.composite
def pair(draw: st.DrawFn) -> tuple[float, float]:
    """A valid (p1, p2): p1 > p2 >= 0, p1 + p2 <= 1, p1 < 1."""
    p1 = draw(st.floats(min_value=0.01, max_value=0.999))
    p2 = draw(st.floats(min_value=0.0, max_value=min(p1, 1 - p1)))
    assume(p1 - p2 > 1e-4)
    return p1, p2


def lattice(step: float = 0.01) -> tuple[np.ndarray, np.ndarray]:
    g = np.round(np.arange(step, 1.0, step), 10)
    p1, p2 = np.meshgrid(g, np.concatenate([[0.0], g]), indexing="ij")
    keep = (p1 > p2) & (p1 + p2 <= 1 + 1e-12)
    return p1[keep], np.minimum(p2[keep], 1 - p1[keep])


BOUND_FNS = {
    "renyi": lambda p1, p2, s: renyi_radius(p1, p2, s),
    "pixeldp": lambda p1, p2, s: pixeldp_radius(p1, p2, s),
    "cohen2": lambda p1, p2, s: cohen_radius(p1, s, p2),
}


@pytest.mark.parametrize("name", sorted(BOUND_FNS))
@settings(max_examples=30, deadline=None)
@given(pq=pair(), frac=st.floats(0.0, 1.0), sigma=sigma_st)
def test_monotone_in_p1(name: str, pq: tuple[float, float], frac: float, sigma: float) -> None:
    p1, p2 = pq
    p1_hi = p1 + frac * (1 - p2 - p1)
    fn = BOUND_FNS[name]
    assert fn(p1_hi, p2, sigma) >= fn(p1, p2, sigma) - 1e-9


@pytest.mark.parametrize("name", sorted(BOUND_FNS))
@settings(max_examples=30, deadline=None)
@given(pq=pair(), frac=st.floats(0.0, 1.0), sigma=sigma_st)
def test_decreasing_in_p2(name: str, pq: tuple[float, float], frac: float, sigma: float) -> None:
    p1, p2 = pq
    p2_lo = p2 * frac
    fn = BOUND_FNS[name]
    assert fn(p1, p2_lo, sigma) >= fn(p1, p2, sigma) - 1e-9


@pytest.mark.parametrize("name", sorted(BOUND_FNS))
@settings(max_examples=30, deadline=None)
@given(pq=pair(), sigma=sigma_st, scale=st.floats(0.1, 10.0))
def test_linear_in_sigma(name: str, pq: tuple[float, float], sigma: float, scale: float) -> None:
    p1, p2 = pq
    fn = BOUND_FNS[name]
    a, b = fn(p1, p2, sigma * scale), scale * fn(p1, p2, sigma)
    assert a == pytest.approx(b, rel=1e-7, abs=1e-9)


@settings(max_examples=30, deadline=None)
@given(p=st.floats(0.0, 0.9999), sigma=sigma_st)
def test_cohen_one_class_monotone_and_linear(p: float, sigma: float) -> None:
    r = cohen_radius(p, sigma)
    assert (r > 0) == (p > 0.5)
    assert cohen_radius(min(p + 0.01, 0.9999), sigma) >= r
    assert cohen_radius(p, 2 * sigma) == pytest.approx(2 * r)


def test_known_values() -> None:
    assert cohen_radius(0.9, 1.0) == pytest.approx(ndtri(0.9))
    assert cohen_radius(0.9, 0.5, 0.05) == pytest.approx(0.25 * (ndtri(0.9) - ndtri(0.05)))
    # with p2 = 1 - p1 the two-class form is the one-class form
    assert cohen_radius(0.8, 1.0, 0.2) == pytest.approx(cohen_radius(0.8, 1.0))
    # alpha -> 1 limit of Lemma 1 is the geometric mean form
    v = renyi_divergence_bound(np.array(0.7), np.array(0.2), np.array(1.0))
    assert v == pytest.approx(-np.log(1 - (np.sqrt(0.7) - np.sqrt(0.2)) ** 2))
    assert renyi_radius(0.5, 0.5, 1.0) == 0.0 and pixeldp_radius(0.3, 0.3, 1.0) == 0.0


def test_renyi_is_the_supremum() -> None:
    """Our supremum matches a brute-force dense alpha search and is never below it by more than rounding."""
    alphas = 1 + np.concatenate([np.logspace(-9, 4, 20000)])
    for p1, p2 in [(0.9, 0.1), (0.6, 0.3), (0.99, 0.005), (0.5, 0.1), (0.999, 0.0), (0.3, 0.2), (0.7, 0.001)]:
        brute = renyi_divergence_bound(np.full(len(alphas), p1), np.full(len(alphas), p2), alphas).max()
        assert renyi_radius(p1, p2, 1.0) >= np.sqrt(2 * brute) - 1e-7


def test_renyi_never_below_reference_grid_on_fine_lattice() -> None:
    p1, p2 = lattice(0.005)
    ours = renyi_radius(p1, p2, 1.0)
    ref = renyi_radius_reference(p1, p2, 1.0)
    assert np.all(ours >= ref - 1e-12)
    # the fixed grid does miss the supremum somewhere (near alpha -> 1, large gaps p1 >> p2)
    assert (ours - ref).max() > 1e-3


def test_pixeldp_never_below_grid_search() -> None:
    eps = np.linspace(0.01, 1.0, 100)
    deltas = np.concatenate([np.logspace(-8, -1, 60), np.linspace(0.1, 0.5, 41)])
    for p1, p2 in [(0.9, 0.05), (0.6, 0.3), (0.99, 0.0), (0.45, 0.4), (0.8, 0.2)]:
        assert pixeldp_radius(p1, p2, 0.7) >= pixeldp_radius_grid(p1, p2, 0.7, eps, deltas) - 1e-12


def test_ordering_over_the_lattice() -> None:
    """Appendix A's comparison, and where the orderings flip (see docs/results.md, certify section).

    - Cohen's two-class radius >= Renyi everywhere on the lattice;
    - Renyi > PixelDP wherever p1 + p2 >= 0.2 (Appendix A's region), by a factor >= 1.2; below it PixelDP can
      win (tiny p1 with p2 ~ 0);
    - Cohen's one-class radius sigma Phi^-1(p1) (what CERTIFY uses) is below Renyi where p2 << 1 - p1.
    """
    p1, p2 = lattice(0.01)
    r = renyi_radius(p1, p2, 1.0)
    d = pixeldp_radius(p1, p2, 1.0)
    c2 = cohen_radius(p1, 1.0, p2)
    c1 = cohen_radius(p1, 1.0)
    assert np.all(c2 >= r - 1e-9)
    region = p1 + p2 >= 0.2 - 1e-9
    assert np.all(r[region] > d[region])
    assert np.min(r[region & (d > 0)] / d[region & (d > 0)]) > 1.2
    assert np.any(d[~region] > r[~region])
    two_class = np.isclose(p1 + p2, 1.0)
    assert np.all(c1[two_class] >= r[two_class] - 1e-9)
    assert np.any((r > c1) & (p1 > 0.5))


def test_invalid_inputs_raise() -> None:
    with pytest.raises(InputError):
        renyi_radius(0.8, 0.3, 1.0)
    with pytest.raises(InputError):
        renyi_radius(0.8, 0.1, 0.0)
    with pytest.raises(InputError):
        cohen_radius(1.2, 1.0)
    with pytest.raises(InputError):
        pixeldp_radius(float("nan"), 0.1, 1.0)


# --- confidence bounds ------------------------------------------------------------------------------


@settings(max_examples=80, deadline=None)
@given(n=st.integers(1, 5000), frac=st.floats(0, 1), alpha=st.floats(1e-4, 0.2))
def test_clopper_pearson_matches_exact_two_sided(n: int, frac: float, alpha: float) -> None:
    k = int(round(frac * n))
    lo, hi = clopper_pearson_lower(k, n, alpha), clopper_pearson_upper(k, n, alpha)
    ci = stats.binomtest(k, n).proportion_ci(confidence_level=1 - 2 * alpha, method="exact")
    assert lo == pytest.approx(ci.low, abs=1e-9) and hi == pytest.approx(ci.high, abs=1e-9)
    assert lo <= k / n <= hi


def test_pair_bounds_cover_at_the_stated_level() -> None:
    """Monte-Carlo coverage of the simultaneous (p1_lower, p2_upper) at alpha = 0.1 (it must be >= 0.9)."""
    rng = np.random.default_rng(0)
    p = np.array([0.55, 0.3, 0.1, 0.05])
    hits = 0
    trials = 1500
    for counts in rng.multinomial(200, p, size=trials):
        p1, p2 = pair_bounds(counts, 0, 0.1)
        hits += (p1 <= p[0]) and (p2 >= p[1:].max())
    assert hits / trials >= 0.9 - 3 * np.sqrt(0.09 / trials)


def test_pair_bounds_shape() -> None:
    counts = np.array([700, 200, 60, 40])
    for interval in ("clopper-pearson", "sison-glaz"):
        p1, p2 = pair_bounds(counts, 0, 0.001, interval)  # type: ignore[arg-type]
        assert p1 < 0.7 and p2 > 0.2 and p1 + p2 <= 1
    with pytest.raises(InputError):
        pair_bounds(counts, 0, 0.001, "wald")  # type: ignore[arg-type]


def test_sison_glaz_matches_statsmodels() -> None:
    sm = pytest.importorskip("statsmodels.stats.proportion")
    for counts in ([900, 50, 30, 20], [60, 20, 10, 5, 5]):
        lo, hi = sison_glaz(counts, 0.05)
        ref = sm.multinomial_proportions_confint(counts, 0.05, method="sison-glaz")
        assert np.allclose(lo, ref[:, 0], atol=1e-9) and np.allclose(hi, ref[:, 1], atol=1e-9)


def test_sison_glaz_falls_back_when_the_approximation_fails() -> None:
    lo, hi = sison_glaz([1000, 0, 0], 0.001)  # statsmodels says lower = 1 here
    assert lo[0] < 1.0 and hi[1] > 0.0
