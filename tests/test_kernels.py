"""Kernels of IKD Table 1: round trips, known values, domain checks, pickling, workers."""

from __future__ import annotations

import pickle

import numpy as np
import pytest
from scipy import special

from dr_dask.linalg.kernels import KERNELS, get_kernel

# every code path: closed forms, half-integer Newton, general-nu safeguarded Newton
CASES = [
    ("se", {}),
    ("rational_quadratic", {"alpha": 1.0}),
    ("rq", {"alpha": 0.35}),
    ("gamma_exponential", {"gamma": 1.0}),
    ("gamma_exponential", {"gamma": 0.4}),
    ("matern", {"nu": 0.5}),
    ("matern", {"nu": 1.5}),
    ("matern", {"nu": 2.5}),
    ("matern", {"nu": 0.1}),
    ("matern", {"nu": 1.0}),
    ("matern", {"nu": 3.7}),
]
K_GRID = np.concatenate([np.linspace(1e-3, 1.0, 4001), 1.0 - np.logspace(-12, -3, 200)])


@pytest.mark.parametrize(("name", "kw"), CASES)
def test_round_trip_and_monotone(name, kw):
    kernel = get_kernel(name, **kw)
    d = kernel.inverse(K_GRID)
    assert d.dtype == np.float64 and d.shape == K_GRID.shape
    assert np.all(d >= 0)
    np.testing.assert_allclose(kernel.f(d), K_GRID, rtol=0, atol=1e-10)
    order = np.argsort(K_GRID)
    assert np.all(np.diff(d[order]) <= 0), "inverse must decrease with k"
    assert kernel.inverse(np.array([1.0]))[0] == 0.0
    assert kernel.f(np.array([0.0]))[0] == 1.0


@pytest.mark.parametrize(("name", "kw"), CASES)
def test_float32_kept_and_shapes(name, kw):
    kernel = get_kernel(name, **kw)
    k = np.linspace(0.01, 1.0, 12, dtype=np.float32).reshape(3, 4)
    d = kernel.inverse(k)
    assert d.dtype == np.float32 and d.shape == (3, 4)
    np.testing.assert_allclose(kernel.f(d.astype(np.float64)), k, rtol=1e-5)


@pytest.mark.parametrize(("name", "kw"), [*CASES[:3], ("matern", {"nu": 1.5})])
@pytest.mark.parametrize("dtype", [np.float64, np.float32])
def test_inverse_inplace_matches_inverse(name, kw, dtype):
    kernel = get_kernel(name, **kw)
    k = K_GRID[:4200].astype(dtype).reshape(420, 10)
    ref = kernel.inverse(k)
    out = kernel.inverse_inplace(k)
    assert out is k and out.dtype == dtype
    if dtype == np.float64:  # bit for bit: the same ufuncs, in place
        np.testing.assert_array_equal(out, ref)
    else:  # computed in float32 (SE): float32 precision of the float64-computed value
        np.testing.assert_allclose(out, ref, rtol=4e-7, atol=4e-7)
    with pytest.raises(ValueError, match=r"\(0, 1\]"):
        kernel.inverse_inplace(np.array([[0.5, np.nan]], dtype))


def test_known_values():
    assert get_kernel("se").inverse(np.array([np.exp(-0.5)]))[0] == pytest.approx(1.0, abs=1e-15)
    assert get_kernel("squared_exponential").f(np.array([2.0]))[0] == pytest.approx(np.exp(-1.0))
    # RQ with alpha = 1: f(d) = 1 / (1 + d/2)
    assert get_kernel("rq", alpha=1.0).inverse(np.array([0.5]))[0] == pytest.approx(2.0)
    # Matérn 1/2 is exp(-sqrt(d)); 3/2 is (1 + x) e^-x with x = sqrt(3 d)
    assert get_kernel("matern", nu=0.5).inverse(np.array([np.exp(-2.0)]))[0] == pytest.approx(4.0)
    x = 1.7
    k = np.array([(1 + x) * np.exp(-x)])
    assert get_kernel("matern", nu=1.5).inverse(k)[0] == pytest.approx(x * x / 3)


def test_general_matern_matches_bessel_formula():
    nu, d = 3.7, np.array([0.01, 0.5, 2.0, 9.0])
    x = np.sqrt(2 * nu * d)
    expected = 2 ** (1 - nu) / special.gamma(nu) * x**nu * special.kv(nu, x)
    np.testing.assert_allclose(get_kernel("matern", nu=nu).f(d), expected, rtol=1e-12)
    # the half-integer closed forms are the same function
    for nu in (0.5, 1.5, 2.5):
        x = np.sqrt(2 * nu * d)
        expected = 2 ** (1 - nu) / special.gamma(nu) * x**nu * special.kv(nu, x)
        np.testing.assert_allclose(get_kernel("matern", nu=nu).f(d), expected, rtol=1e-12)


def test_general_matern_table_matches_exact_root():
    kernel = get_kernel("matern", nu=3.7)
    k = np.array([1e-200, 1e-5, 0.2, 0.9, 1 - 1e-7])
    exact = kernel._safeguarded_newton(-np.log(k)) ** 2 / (2 * 3.7)
    # near k = 1 the reference itself is only accurate to ~1e-14 absolute (ln f via kve)
    np.testing.assert_allclose(kernel.inverse(k), exact, rtol=1e-9, atol=1e-14)


def test_gamma_exponential_is_seed_000_form():
    d = np.array([0.25, 1.0, 4.0])
    kernel = get_kernel("gamma_exponential", gamma=1.0)
    # 000: exp(-(r/l)^gamma) = exp(-sqrt(d)); the 001/002 misprint would give exp(-d^2)
    np.testing.assert_allclose(kernel.f(d), np.exp(-np.sqrt(d)))
    assert not np.allclose(kernel.f(d), np.exp(-(d**2)))
    np.testing.assert_allclose(kernel.inverse(np.exp(-np.sqrt(d))), d)
    np.testing.assert_allclose(get_kernel("gamma_exponential", gamma=2.0).f(d), np.exp(-d))


@pytest.mark.parametrize("bad", [0.0, -0.1, 1.01, np.nan])
def test_inverse_rejects_outside_domain(bad):
    k = np.array([[0.5, 0.7], [0.9, bad]])
    with pytest.raises(ValueError, match=r"\(0, 1\].*index \(1, 1\)"):
        get_kernel("se").inverse(k)


def test_inverse_accepts_rounding_above_one():
    k = np.array([1.0 + 2e-16, np.float64(np.nextafter(1.0, 2.0))])
    assert np.all(get_kernel("matern", nu=2.5).inverse(k) == 0.0)


def test_f_rejects_negative_distance():
    with pytest.raises(ValueError, match="d >= 0"):
        get_kernel("rq").f(np.array([0.1, -1e-3]))


def test_names_and_parameters_validated():
    with pytest.raises(ValueError, match="valid names: se, rational_quadratic"):
        get_kernel("laplace")
    with pytest.raises(ValueError, match="alpha"):
        get_kernel("rq", alpha=0.0)
    with pytest.raises(ValueError, match="gamma"):
        get_kernel("gamma_exponential", gamma=2.5)
    with pytest.raises(ValueError, match="nu"):
        get_kernel("matern", nu=-1.0)
    assert tuple(get_kernel(n).name for n in KERNELS) == KERNELS
    assert get_kernel("SE").name == "se"


def test_repr_pickle_equality():
    kernel = get_kernel("matern", nu=2.5)
    assert repr(kernel) == "Matern(nu=2.5)"
    clone = pickle.loads(pickle.dumps(kernel))
    assert clone == kernel and hash(clone) == hash(kernel)
    assert clone != get_kernel("matern", nu=1.5)
    assert get_kernel(kernel) is kernel


@pytest.mark.cluster
def test_inverse_on_worker_processes(cluster_client):
    import dask.array as da

    kernel = get_kernel("matern", nu=1.5)
    k = np.random.default_rng(0).uniform(1e-3, 1.0, (400, 300))
    tiles = da.from_array(k, chunks=(100, 100))
    d = cluster_client.compute(tiles.map_blocks(kernel.inverse, dtype=k.dtype)).result()
    np.testing.assert_array_equal(d, kernel.inverse(k))
