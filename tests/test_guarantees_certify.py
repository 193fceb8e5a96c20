"""Guarantees of the certification maths (issue 38, mutation report: docs/mutation.md).

Closed forms and independent re-implementations of the papers' formulas: Clopper-Pearson bounds against
``scipy.stats.beta.ppf`` and their exact edge values (k = 0, k = n), Sison & Glaz against statsmodels, the
Bonferroni split of :func:`pair_bounds`; Cohen et al.'s ``sigma Phi^-1(p)``, Li et al.'s Theorem 2 against a dense
brute-force supremum written here from the formula (and its closed form ``sigma sqrt(-2 log(1 - p1))`` at
``p2 = 0``), PixelDP against a brute-force (eps, best delta) search. Fast on purpose: the mutation runner runs
this file first with ``-x``.
"""

from __future__ import annotations

import numpy as np
import pytest
from scipy import stats
from scipy.special import ndtri

from stealkit.certify import bounds as B
from stealkit.certify import confidence as C
from stealkit.errors import InputError

# --- confidence: Clopper-Pearson ----------------------------------------------------------------------------

KS = np.array([0, 1, 2, 5, 37, 99, 100])
N = 100


@pytest.mark.parametrize("alpha", [1e-6, 0.001, 0.05, 0.3, 0.9])
def test_clopper_pearson_against_beta_quantiles(alpha: float) -> None:
    lo = C.clopper_pearson_lower(KS, N, alpha)
    hi = C.clopper_pearson_upper(KS, N, alpha)
    assert isinstance(lo, np.ndarray) and isinstance(hi, np.ndarray) and lo.shape == hi.shape == KS.shape
    for k, lk, hk in zip(KS, lo, hi, strict=True):
        want_lo = 0.0 if k == 0 else stats.beta.ppf(alpha, k, N - k + 1)
        want_hi = 1.0 if k == N else stats.beta.ppf(1 - alpha, k + 1, N - k)
        assert lk == pytest.approx(want_lo, rel=1e-12, abs=1e-300)
        assert hk == pytest.approx(want_hi, rel=1e-12)


def test_clopper_pearson_edge_values() -> None:
    """k = 0: lower 0, upper 1 - alpha^(1/n); k = n: upper 1, lower alpha^(1/n) (the binomial tails in closed form)."""
    for n in (1, 7, 1000):
        for alpha in (0.001, 0.05, 0.5):
            assert C.clopper_pearson_lower(0, n, alpha) == 0.0
            assert C.clopper_pearson_upper(n, n, alpha) == 1.0
            assert C.clopper_pearson_upper(0, n, alpha) == pytest.approx(1 - alpha ** (1 / n), rel=1e-10)
            assert C.clopper_pearson_lower(n, n, alpha) == pytest.approx(alpha ** (1 / n), rel=1e-10)
    # scalars come back as Python floats
    assert type(C.clopper_pearson_lower(3, 10, 0.05)) is float
    assert type(C.clopper_pearson_upper(3, 10, 0.05)) is float
    # a fractional count (a weighted vote) is still the beta quantile, not clamped to 1
    assert C.clopper_pearson_lower(0.5, 10, 0.05) == pytest.approx(stats.beta.ppf(0.05, 0.5, 10.5), rel=1e-12)
    assert C.clopper_pearson_upper(9.5, 10, 0.05) == pytest.approx(stats.beta.ppf(0.95, 10.5, 0.5), rel=1e-12)


def test_clopper_pearson_monotone_and_nested() -> None:
    ks = np.arange(0, 51)
    for alpha in (0.001, 0.05):
        lo, hi = C.clopper_pearson_lower(ks, 50, alpha), C.clopper_pearson_upper(ks, 50, alpha)
        assert np.all(np.diff(lo) > 0) and np.all(np.diff(hi) > 0)
        assert np.all(lo <= ks / 50) and np.all(hi >= ks / 50) and np.all(lo < hi)
    # a smaller alpha (more confidence) widens both ends
    assert np.all(C.clopper_pearson_lower(ks[1:], 50, 0.001) < C.clopper_pearson_lower(ks[1:], 50, 0.05))
    assert np.all(C.clopper_pearson_upper(ks[:-1], 50, 0.001) > C.clopper_pearson_upper(ks[:-1], 50, 0.05))


def test_clopper_pearson_exact_coverage() -> None:
    """P(lower <= p) >= 1 - alpha exactly (summing the binomial pmf), for p on a grid: the guarantee itself."""
    n, alpha = 40, 0.1
    ks = np.arange(n + 1)
    lo, hi = C.clopper_pearson_lower(ks, n, alpha), C.clopper_pearson_upper(ks, n, alpha)
    for p in np.linspace(0.01, 0.99, 50):
        pmf = stats.binom.pmf(ks, n, p)
        assert pmf[lo <= p].sum() >= 1 - alpha - 1e-12
        assert pmf[hi >= p].sum() >= 1 - alpha - 1e-12


@pytest.mark.parametrize("alpha", [0.0, 1.0, -0.1, 1.5, float("nan")])
def test_alpha_outside_the_open_unit_interval_raises(alpha: float) -> None:
    with pytest.raises(InputError):
        C.clopper_pearson_lower(3, 10, alpha)
    with pytest.raises(InputError):
        C.clopper_pearson_upper(3, 10, alpha)
    with pytest.raises(InputError):
        C.sison_glaz([5, 3, 2], alpha)


def test_alpha_limits_accepted() -> None:
    for alpha in (1e-12, 1 - 1e-12):
        assert 0.0 <= C.clopper_pearson_lower(3, 10, alpha) <= 1.0
        assert 0.0 <= C.clopper_pearson_upper(3, 10, alpha) <= 1.0


# --- confidence: Sison-Glaz and pair bounds -------------------------------------------------------------------

SG_CASES = [([900, 50, 30, 20], 0.05), ([60, 20, 10, 5, 5], 0.05), ([30, 20, 10], 0.1), ([500, 300, 150, 50], 0.01),
            ([12, 8, 5], 0.2), ([200, 190, 10, 0], 0.05), ([40, 35, 25], 0.001),
            ([6, 3, 1], 0.3), ([4, 3, 3], 0.05), ([20, 15, 10], 0.5),  # these three: widths c = 1, 2, 2
            ([60, 40], 0.05), ([30, 70], 0.1)]  # two classes are enough


@pytest.mark.parametrize(("counts", "alpha"), SG_CASES)
def test_sison_glaz_equals_statsmodels(counts: list[int], alpha: float) -> None:
    sm = pytest.importorskip("statsmodels.stats.proportion")
    lo, hi = C.sison_glaz(counts, alpha)
    ref = sm.multinomial_proportions_confint(counts, alpha, method="sison-glaz")
    np.testing.assert_allclose(lo, ref[:, 0], rtol=0, atol=1e-10)
    np.testing.assert_allclose(hi, ref[:, 1], rtol=0, atol=1e-10)


def test_sison_glaz_coverage_function() -> None:
    """nu(c) rises with the width towards 1 and, at the chosen width, brackets 1 - alpha (formula (7))."""
    x = np.array([60.0, 20, 10, 5, 5])
    widths = np.arange(1.0, 30.0)
    nu = C._sg_coverage(x, 100.0, widths)
    assert np.all(np.diff(nu[:15]) > 0) and 0.99 < nu[-1] <= 1.0 + 1e-6 and nu[0] < 0.5
    # tiny counts (total variance of the truncated Poissons about 1) still go through formula (1): pinned values
    # of this port (which equals statsmodels on the cases above), not the s2 <= 0 guard's 1
    np.testing.assert_allclose(C._sg_coverage(np.array([1.0, 1.0]), 2.0, np.array([1.0, 2.0])), [0.983863] * 2,
                               rtol=1e-5)


@pytest.mark.parametrize(("counts", "alpha"), [([1000, 0, 0], 0.001), ([3, 2, 1], 0.5), ([2, 1, 1], 0.9)])
def test_sison_glaz_fallback_is_bonferroni_clopper_pearson(counts: list[int], alpha: float,
                                                           caplog: pytest.LogCaptureFixture) -> None:
    """No width brackets 1 - alpha (all-in-one-class counts, or nu(1) already above 1 - alpha): Clopper-Pearson at
    alpha / (2K), and a debug line says so."""
    x = np.array(counts)
    with caplog.at_level("DEBUG", logger="stealkit.certify.confidence"):
        lo, hi = C.sison_glaz(x, alpha)
    assert "Sison-Glaz approximation failed" in caplog.text
    a = alpha / (2 * len(x))
    np.testing.assert_allclose(lo, C.clopper_pearson_lower(x, x.sum(), a), rtol=1e-12)
    np.testing.assert_allclose(hi, C.clopper_pearson_upper(x, x.sum(), a), rtol=1e-12)
    assert lo.dtype == np.float64 and hi.dtype == np.float64


def test_sison_glaz_one_sample() -> None:
    """n = 1 is a valid (if useless) sample: intervals come back, and they contain the observed proportions."""
    lo, hi = C.sison_glaz([1, 0], 0.05)
    assert lo.shape == hi.shape == (2,) and np.all(lo <= [1.0, 0.0]) and np.all(hi >= [1.0, 0.0])


@pytest.mark.parametrize("counts", [[5], [[1, 2], [3, 4]], [3, -1, 2], [0, 0, 0], []])
def test_sison_glaz_rejects_bad_counts(counts: list) -> None:
    with pytest.raises(InputError):
        C.sison_glaz(counts, 0.05)


def test_pair_bounds_clopper_pearson_is_bonferroni_over_k_classes() -> None:
    counts = np.array([120, 50, 20, 10])
    n, k, alpha = 200, 4, 0.01
    for top in (0, 1):
        p1, p2 = C.pair_bounds(counts, top, alpha)
        others = [i for i in range(k) if i != top]
        assert p1 == pytest.approx(stats.beta.ppf(alpha / k, counts[top], n - counts[top] + 1), rel=1e-12)
        want2 = max(stats.beta.ppf(1 - alpha / k, counts[i] + 1, n - counts[i]) for i in others)
        assert p2 == pytest.approx(min(want2, 1 - p1), rel=1e-12)
    # the upper end is capped at 1 - p1_lower (here the cap binds)
    p1, p2 = C.pair_bounds([90, 10], 0, 0.001)
    assert p2 == pytest.approx(1 - p1, rel=1e-12)
    assert p2 < C.clopper_pearson_upper(10, 100, 0.0005)
    assert type(p1) is float and type(p2) is float


def test_pair_bounds_sison_glaz_uses_the_simultaneous_intervals() -> None:
    counts = [60, 20, 10, 5, 5]
    lo, hi = C.sison_glaz(counts, 0.05)
    p1, p2 = C.pair_bounds(counts, 1, 0.05, "sison-glaz")
    assert p1 == lo[1] and p2 == min(max(hi[0], hi[2], hi[3], hi[4]), 1 - lo[1])
    with pytest.raises(InputError, match="unknown interval"):
        C.pair_bounds(counts, 0, 0.05, "exact")  # type: ignore[arg-type]


# --- bounds: input checks and shapes --------------------------------------------------------------------------


@pytest.mark.parametrize("sigma", [0.0, -1.0, float("inf"), float("nan")])
def test_bad_sigma_raises(sigma: float) -> None:
    for fn in (lambda: B.renyi_radius(0.8, 0.1, sigma), lambda: B.cohen_radius(0.8, sigma),
               lambda: B.pixeldp_radius(0.8, 0.1, sigma), lambda: B.renyi_radius_reference(0.8, 0.1, sigma)):
        with pytest.raises(InputError, match="sigma"):
            fn()


@pytest.mark.parametrize(("p1", "p2"), [(-0.1, 0.1), (1.1, 0.0), (float("nan"), 0.1), (0.5, -0.1), (0.5, 1.2),
                                        (0.5, float("nan")), (0.8, 0.3), (0.6, 0.6)])
def test_bad_probabilities_raise(p1: float, p2: float) -> None:
    with pytest.raises(InputError):
        B.renyi_radius(p1, p2, 1.0)
    with pytest.raises(InputError):
        B.cohen_radius(p1, 1.0, p2)


def test_probabilities_at_the_edges_accepted() -> None:
    assert B.cohen_radius(0.0, 1.0) == 0.0 and B.cohen_radius(1.0, 1.0) == np.inf
    assert B.renyi_radius(0.6, 0.4 + 1e-10, 1.0) > 0  # p1 + p2 within rounding of 1
    assert B.cohen_radius(0.0, 1.0, 0.0) == 0.0  # p1 = p2 = 0: abstain, not nan
    assert B.renyi_radius(0.0, 0.0, 1.0) == 0.0 and B.pixeldp_radius(0.0, 0.0, 1.0) == 0.0
    assert B.renyi_radius(0.0, 1.0, 1.0) == 0.0 and B.cohen_radius(0.0, 1.0, 1.0) == 0.0  # p2 = 1 is a probability
    # the tolerance on p1 + p2 is inclusive: exactly 1 + 1e-9 is accepted
    a = 0.5
    b = (1 + 1e-9) - a
    assert a + b == 1 + 1e-9 and B.renyi_radius(a, b, 1.0) == 0.0
    with pytest.raises(InputError, match="p2 must lie"):  # not only the sum check
        B.renyi_radius(0.0, 1.5, 1.0)
    with pytest.raises(InputError, match="p1 must lie"):
        B.renyi_radius(1.5, 0.0, 1.0)
    with pytest.raises(InputError, match="p1 \\+ p2"):
        B.renyi_radius(0.6, 0.45, 1.0)


def test_scalar_in_float_out_array_in_array_out() -> None:
    for fn in (B.renyi_radius, B.pixeldp_radius, B.renyi_radius_reference, lambda a, b, s: B.cohen_radius(a, s, b)):
        assert type(fn(0.8, 0.1, 1.0)) is float
        out = fn(np.array([[0.8, 0.7], [0.6, 0.9]]), np.array([[0.1, 0.2], [0.3, 0.0]]), 1.0)
        assert isinstance(out, np.ndarray) and out.shape == (2, 2)
        # broadcasting a scalar p2 against a vector p1
        vec = fn(np.array([0.6, 0.7, 0.8]), 0.1, 1.0)
        assert vec.shape == (3,) and np.all(np.diff(vec) > 0)
    assert type(B.cohen_radius(0.8, 1.0)) is float and B.cohen_radius(np.array([0.8, 0.9]), 1.0).shape == (2,)


# --- bounds: closed forms ---------------------------------------------------------------------------------------


def test_cohen_closed_forms() -> None:
    p = np.array([0.0, 0.3, 0.5, 0.500001, 0.6, 0.9, 0.999])
    r = B.cohen_radius(p, 0.7)
    np.testing.assert_allclose(r, np.where(p > 0.5, 0.7 * ndtri(p), 0.0), rtol=1e-14, atol=0)
    assert np.all(r >= 0)
    a, b = np.array([0.6, 0.5, 0.9, 0.3, 0.2]), np.array([0.3, 0.5, 0.01, 0.2, 0.3])
    r2 = B.cohen_radius(a, 1.3, b)
    np.testing.assert_allclose(r2, np.where(a > b, 0.65 * (ndtri(a) - ndtri(b)), 0.0), rtol=1e-14, atol=0)
    assert r2[3] > 0 and r2[4] == 0.0 and r2[1] == 0.0  # two-class: p1 < 1/2 still certifies if p1 > p2


def _renyi_brute(p1: float, p2: float, sigma: float) -> float:
    """sup over alpha > 1 of sqrt(-(2 sigma^2 / alpha) log(1 - p1 - p2 + 2 M_{1-alpha}(p1, p2))), Theorem 2,
    on a dense grid, with the generalised mean written out."""
    alphas = 1 + np.logspace(-7, 3, 60001)
    t = 1 - alphas
    with np.errstate(divide="ignore", over="ignore"):
        m = ((p1**t + p2**t) / 2) ** (1 / t)
    g = 1 - p1 - p2 + 2 * m
    with np.errstate(invalid="ignore", divide="ignore"):
        vals = -2 * sigma**2 / alphas * np.log(g)
    return float(np.sqrt(max(np.nanmax(vals), 0.0)))


@pytest.mark.parametrize(("p1", "p2"), [(0.9, 0.1), (0.6, 0.3), (0.99, 0.005), (0.5, 0.1), (0.3, 0.2),
                                        (0.7, 0.001), (0.45, 0.3)])
def test_renyi_against_brute_force_theorem_2(p1: float, p2: float) -> None:
    brute = _renyi_brute(p1, p2, 0.8)
    got = B.renyi_radius(p1, p2, 0.8)
    assert got >= brute - 1e-9 and got == pytest.approx(brute, rel=2e-6)


def test_renyi_closed_form_at_p2_zero() -> None:
    """p2 = 0: M_{1-alpha}(p1, 0) = 0 for alpha > 1, so the sup is at alpha -> 1: sigma sqrt(-2 log(1 - p1))."""
    p1 = np.array([0.1, 0.5, 0.9, 0.999])
    np.testing.assert_allclose(B.renyi_radius(p1, 0.0, 1.5), 1.5 * np.sqrt(-2 * np.log(1 - p1)), rtol=1e-9)


def test_renyi_divergence_bound_formula() -> None:
    p1, p2 = np.array([0.7, 0.6, 0.8]), np.array([0.2, 0.3, 0.0])
    for alpha in (1.5, 2.0, 7.0):
        t = 1 - alpha
        with np.errstate(divide="ignore"):
            m = ((p1**t + p2**t) / 2) ** (1 / t)
        want = -np.log(1 - p1 - p2 + 2 * m) / alpha
        np.testing.assert_allclose(B.renyi_divergence_bound(p1, p2, np.full(3, alpha)), want, rtol=1e-12)
    # alpha -> 1: the geometric mean; alpha within 1e-12 of 1 takes that branch
    geo = -np.log(1 - p1 - p2 + 2 * np.sqrt(p1 * p2))
    np.testing.assert_allclose(B.renyi_divergence_bound(p1, p2, np.ones(3)), geo, rtol=1e-12)
    np.testing.assert_allclose(B.renyi_divergence_bound(p1, p2, np.full(3, 1 + 1e-13)), geo, rtol=1e-9)
    # never negative, never nan (p1 = p2 gives 0; p1 < p2 gives the symmetric value, gated by the radius)
    v = B.renyi_divergence_bound(np.array([0.4, 0.0]), np.array([0.4, 0.0]), np.array([2.0, 2.0]))
    assert np.all(v == 0.0)


def test_renyi_zero_without_a_gap_and_monotone() -> None:
    assert B.renyi_radius(0.4, 0.4, 1.0) == 0.0 and B.renyi_radius(0.3, 0.4, 1.0) == 0.0
    assert B.renyi_radius_reference(0.4, 0.4, 1.0) == 0.0 and B.renyi_radius_reference(0.3, 0.4, 1.0) == 0.0
    p1 = np.linspace(0.35, 0.99, 30)
    r = B.renyi_radius(p1, 0.01, 1.0)
    assert np.all(np.diff(r) > 0)
    assert B.renyi_radius(0.7, 0.2, 2.0) == pytest.approx(2 * B.renyi_radius(0.7, 0.2, 1.0), rel=1e-12)
    assert B.renyi_radius(0.7, 0.1, 1.0) > B.renyi_radius(0.7, 0.2, 1.0)


def test_renyi_reference_grid() -> None:
    for p1, p2 in [(0.9, 0.05), (0.6, 0.3), (0.999, 0.0)]:
        vals = [B.renyi_divergence_bound(np.array(p1), np.array(p2), np.array(a)) for a in B.REFERENCE_ALPHAS]
        assert B.renyi_radius_reference(p1, p2, 0.5) == pytest.approx(0.5 * np.sqrt(2 * max(vals)), rel=1e-12)
        one = float(B.renyi_divergence_bound(np.array(p1), np.array(p2), np.array(3.0)))
        assert B.renyi_radius_reference(p1, p2, 0.5, alphas=[3.0]) == pytest.approx(0.5 * np.sqrt(2 * one), rel=1e-12)
    np.testing.assert_allclose(B.REFERENCE_ALPHAS, np.linspace(1.01, 2.0, 100))


def test_golden_max_finds_the_maximum() -> None:
    lo, hi = np.array([0.0, -3.0]), np.array([1.0, 5.0])
    centre = np.array([0.3, 4.2])
    best = B._golden_max(lambda x: -((x - centre) ** 2), lo, hi)
    assert np.all(best <= 0) and np.all(best > -1e-20)
    # fewer iterations: coarser, but never better than the true maximum
    coarse = B._golden_max(lambda x: -((x - centre) ** 2), lo, hi, iters=3)
    assert np.all(coarse < best) and np.all(coarse > -1.0)


def _pixeldp_brute(p1: float, p2: float, sigma: float, max_eps: float = 1.0) -> float:
    eps = np.linspace(1e-6, max_eps, 200001)
    delta = (p1 - np.exp(2 * eps) * p2) / (1 + np.exp(eps))
    ok = delta > 0
    if not ok.any():
        return 0.0
    return float((sigma * eps[ok] / np.sqrt(2 * np.log(1.25 / delta[ok]))).max())


@pytest.mark.parametrize(("p1", "p2"), [(0.9, 0.05), (0.6, 0.3), (0.99, 0.0), (0.45, 0.4), (0.8, 0.2), (0.3, 0.01)])
def test_pixeldp_against_brute_force(p1: float, p2: float) -> None:
    got, brute = B.pixeldp_radius(p1, p2, 0.7), _pixeldp_brute(p1, p2, 0.7)
    assert got >= brute - 1e-12 and got == pytest.approx(brute, rel=1e-6)
    small = B.pixeldp_radius(p1, p2, 0.7, max_epsilon=0.2)
    assert small == pytest.approx(_pixeldp_brute(p1, p2, 0.7, 0.2), rel=1e-6) and small <= got + 1e-15


def test_pixeldp_value_and_grid() -> None:
    # eps / sqrt(2 log(1.25 / delta)), delta = (p1 - e^{2 eps} p2) / (1 + e^eps)
    eps = np.array([0.1, 0.5, 1.0])
    d = (0.9 - np.exp(2 * eps) * 0.05) / (1 + np.exp(eps))
    np.testing.assert_allclose(B._pixeldp_value(np.full(3, 0.9), np.full(3, 0.05), eps),
                               eps / np.sqrt(2 * np.log(1.25 / d)), rtol=1e-13)
    assert np.all(B._pixeldp_value(np.full(3, 0.3), np.full(3, 0.3), eps) == 0.0)
    # the grid search: a 1 x 1 grid is the closed form when feasible, 0 when not
    e, dd = 0.5, 0.01
    assert np.exp(1.0) * 0.05 + (1 + np.exp(0.5)) * dd <= 0.9
    assert B.pixeldp_radius_grid(0.9, 0.05, 2.0, [e], [dd]) == pytest.approx(2.0 * e / np.sqrt(2 * np.log(125.0)))
    assert B.pixeldp_radius_grid(0.3, 0.25, 2.0, [e], [dd]) == 0.0
    assert B.pixeldp_radius_grid(0.9, 0.05, 2.0, [], [dd]) == 0.0
    # the largest feasible point of a grid wins
    got = B.pixeldp_radius_grid(0.9, 0.05, 1.0, [0.1, 0.5], [1e-3, 0.01])
    assert got == pytest.approx(0.5 / np.sqrt(2 * np.log(125.0)))
    assert type(got) is float


def test_radius_dispatch() -> None:
    assert B.radius("renyi", 0.8, 0.1, 0.5) == B.renyi_radius(0.8, 0.1, 0.5)
    assert B.radius("pixeldp", 0.8, 0.1, 0.5) == B.pixeldp_radius(0.8, 0.1, 0.5)
    assert B.radius("cohen", 0.8, 0.1, 0.5) == B.cohen_radius(0.8, 0.5) == 0.5 * ndtri(0.8)
    with pytest.raises(InputError, match="unknown bound"):
        B.radius("lipschitz", 0.8, 0.1, 0.5)  # type: ignore[arg-type]
    assert set(B.BOUNDS) == {"cohen", "renyi", "pixeldp"}
