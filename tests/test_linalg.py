"""The shared linear algebra: the algebraic eigensolver, tiled operators, Procrustes."""

from __future__ import annotations

import os

import numpy as np
import pytest
import scipy.linalg

from dr_dask.linalg.align import procrustes_disparity, procrustes_fit
from dr_dask.linalg.eigen import fix_signs, top_eigh
from dr_dask.linalg.mds import classical_mds
from dr_dask.linalg.tiles import TileGrid, build_tiles


def _indefinite(T=600, seed=0):
    """A symmetric matrix whose largest-|lambda| eigenvalues are negative."""
    rng = np.random.default_rng(seed)
    Q, _ = np.linalg.qr(rng.normal(size=(T, T)))
    w = np.concatenate([[9.0, 7.0, 5.0], [-40.0, -30.0, -20.0, -15.0], rng.normal(0, 0.5, T - 7)])
    return (Q * w) @ Q.T


@pytest.mark.parametrize("max_basis", [None, 40])
def test_lanczos_selects_algebraic_not_magnitude(max_basis):
    A = _indefinite()
    res = top_eigh(A, 3, method="lanczos", tol=1e-10, random_state=0, max_basis=max_basis)
    ref = scipy.linalg.eigh(A, subset_by_index=[len(A) - 3, len(A) - 1])[0][::-1]
    np.testing.assert_allclose(res.values, ref, rtol=1e-9)
    assert res.converged and res.residuals.max() < 1e-8 * 40
    np.testing.assert_allclose(np.abs(res.vectors.T @ res.vectors), np.eye(3), atol=1e-10)
    # svd-style magnitude selection would have returned -40, -30, -20
    assert np.all(res.values > 0)


def test_one_sign_convention_for_every_eigensolver_path():
    """Dense LAPACK, Lanczos with any seed and the MDS on top of them return the same vectors,
    not merely the same up to sign: each column's largest-magnitude entry is positive."""
    A = _indefinite(T=300)
    runs = [top_eigh(A, 3, method="dense")] + [
        top_eigh(A, 3, method="lanczos", tol=1e-12, random_state=seed) for seed in (0, 1, 2)]
    for res in runs:
        V = res.vectors
        assert np.all(V[np.abs(V).argmax(axis=0), range(3)] > 0)
        np.testing.assert_allclose(V, runs[0].vectors, atol=1e-8)
    np.testing.assert_array_equal(fix_signs(-runs[0].vectors), runs[0].vectors)
    X = np.random.default_rng(0).normal(size=(40, 3))
    D2 = ((X[:, None] - X[None]) ** 2).sum(-1)
    dense = classical_mds(D2, 2, method="dense")
    lanczos = classical_mds(D2, 2, method="lanczos", tol=1e-12, random_state=3)
    np.testing.assert_allclose(lanczos.embedding, dense.embedding, atol=1e-8)


def test_lanczos_is_seeded_and_handles_exact_low_rank():
    rng = np.random.default_rng(1)
    U = rng.normal(size=(300, 2))
    A = U @ U.T  # rank 2: the Krylov space is exhausted after one block
    a = top_eigh(A, 2, method="lanczos", random_state=5)
    b = top_eigh(A, 2, method="lanczos", random_state=5)
    np.testing.assert_array_equal(a.vectors, b.vectors)
    np.testing.assert_allclose(a.values, np.linalg.eigvalsh(A)[::-1][:2], rtol=1e-10)


@pytest.mark.parametrize("T", range(3, 41))
def test_lanczos_on_small_operators(T):
    """Every T, including a block wider than half the operator (it used to fail for b < T < 2b)."""
    rng = np.random.default_rng(T)
    A = rng.normal(size=(T, T))
    A = A + A.T
    exact = np.linalg.eigvalsh(A)[::-1]
    for k in sorted({1, 2, min(5, T - 1), T - 1}):
        res = top_eigh(A, k, method="lanczos", random_state=0)
        assert res.converged
        np.testing.assert_allclose(res.values, exact[:k], atol=1e-8 * np.abs(exact).max())


def test_ikd_fits_small_samples_with_default_block():
    from dr_dask import IKD

    rng = np.random.default_rng(0)
    for T in range(11, 20):  # the default Lanczos block for 2 components is 10 wide
        Z = IKD(n_components=2, eigen_solver="lanczos", random_state=0).fit_transform(
            rng.normal(size=(T, 30)))
        assert Z.shape == (T, 2) and np.isfinite(Z).all()


def test_eigensolver_rejects_bad_k():
    with pytest.raises(ValueError, match="n_components"):
        top_eigh(np.eye(5), 5)


def _gram_tile(Xi, Xj, diagonal):
    S = Xi @ Xj.T
    return S, (S.sum(axis=1), S.sum(axis=0))


@pytest.mark.parametrize("where", ["memory", "disk"])
def test_tiled_operator_products_and_reductions(tmp_path, where):
    import dask.array as da

    rng = np.random.default_rng(2)
    X = rng.normal(size=(250, 7))
    Xd = da.from_array(X, chunks=(64, 7))
    grid = TileGrid.from_chunks(Xd.chunks[0])
    store = str(tmp_path / "S") if where == "disk" else None
    op, stats = build_tiles(grid, list(Xd.to_delayed().ravel()), _gram_tile, store=store)
    V = rng.normal(size=(250, 3))
    np.testing.assert_allclose(op.matmat(V), X @ (X.T @ V), rtol=1e-10)
    frob = sum(op.reduce(lambda t, r, c, d: float((t**2).sum()) * (1 if d else 2)))
    assert frob == pytest.approx(np.sum((X @ X.T) ** 2), rel=1e-10)
    assert len(stats) == len(grid.upper())


def test_stored_tiles_stream_by_chunk_rows(tmp_path, dr_config):
    """Tiles of 96 rows stored as 32-row chunks: products and a row-additive reduction read
    them chunk row by chunk row and equal the dense results."""
    import dask.array as da
    import zarr

    import dr_dask.linalg.tiles as tiles

    dr_config({"tiles.chunk-rows": 32})
    assert tiles.tile_chunk_rows(96) == 32 and tiles.tile_chunk_rows(97) == 97
    rng = np.random.default_rng(5)
    X = rng.normal(size=(250, 6))
    Xd = da.from_array(X, chunks=(96, 6))
    grid = TileGrid.from_chunks(Xd.chunks[0])
    store = str(tmp_path / "S")
    op, _ = build_tiles(grid, list(Xd.to_delayed().ravel()), _gram_tile, store=store)
    assert zarr.open_array(store, mode="r").chunks == (32, 96)
    seen = []

    def frob(t, rows, cols, diag):
        seen.append(t.shape[0])
        np.testing.assert_allclose(t, (X @ X.T)[rows, cols], rtol=1e-12)
        return float((t**2).sum()) * (1 if diag else 2)

    V = rng.normal(size=(250, 3))
    Y, parts = op.matmat_reduce(V, frob)
    np.testing.assert_allclose(Y, X @ (X.T @ V), rtol=1e-10)
    assert sum(parts) == pytest.approx(np.sum((X @ X.T) ** 2), rel=1e-10)
    assert max(seen) == 32


def test_disk_tiles_resume_only_missing_tiles(tmp_path):
    import dask.array as da

    rng = np.random.default_rng(3)
    X = rng.normal(size=(200, 5))
    Xd = da.from_array(X, chunks=(50, 5))
    grid = TileGrid.from_chunks(Xd.chunks[0])
    store = str(tmp_path / "S")
    blocks = list(Xd.to_delayed().ravel())
    build_tiles(grid, blocks, _gram_tile, store=store)
    # simulate a crash: one tile lost its record (and its data was never written)
    import zarr

    os.remove(os.path.join(store, "done", "1_2.npz"))  # marks live inside the tile array
    zarr.open_array(store, mode="r+")[50:100, 100:150] = 0.0
    calls = []

    def counting_tile(Xi, Xj, diagonal):
        calls.append(1)
        return _gram_tile(Xi, Xj, diagonal)

    op, _ = build_tiles(grid, blocks, counting_tile, store=store)
    assert len(calls) == 1
    V = np.eye(200)[:, :4]
    np.testing.assert_allclose(op.matmat(V), X @ (X.T @ V), rtol=1e-10)


def test_procrustes_matches_scipy_and_recovers_a_similarity():
    from scipy.spatial import procrustes

    rng = np.random.default_rng(4)
    A = rng.normal(size=(60, 3))
    R, _ = np.linalg.qr(rng.normal(size=(3, 3)))
    B = 2.5 * A @ R + np.array([1.0, -2.0, 0.5])
    fit = procrustes_fit(A, B)
    np.testing.assert_allclose(fit.apply(A), B, atol=1e-10)
    assert fit.scale == pytest.approx(2.5)
    noisy = B + 0.1 * rng.normal(size=B.shape)
    assert procrustes_disparity(A, noisy) == pytest.approx(procrustes(A, noisy)[2], rel=1e-10)
    rigid = procrustes_fit(A, B, scaling=False)
    assert rigid.scale == 1.0
    with pytest.raises(ValueError, match="identical points"):
        procrustes_disparity(A, np.ones_like(A))


def test_double_centring_dense_tiles_new_rows_and_operator_agree():
    """One centring serves the whole matrix, a tile of it (given the whole's means), new rows
    against training means, and the matrix-free operator."""
    from dr_dask.linalg.mds import CentredOperator, double_centre

    rng = np.random.default_rng(0)
    P = rng.normal(size=(30, 3))
    D2 = ((P[:, None] - P[None]) ** 2).sum(-1)
    J = np.eye(30) - 1.0 / 30
    B = -0.5 * J @ D2 @ J
    np.testing.assert_allclose(double_centre(D2), B, atol=1e-12)
    r = D2.mean(axis=1)
    np.testing.assert_allclose(double_centre(D2[5:12, 20:], r[5:12], r[20:], r.mean()),
                               B[5:12, 20:], atol=1e-12)
    # training rows centred as "new" rows reproduce B's rows
    np.testing.assert_allclose(double_centre(D2[:4], col_mean=r, total=r.mean()), B[:4],
                               atol=1e-12)
    V = rng.normal(size=(30, 4))
    np.testing.assert_allclose(CentredOperator(D2).matmat(V), B @ V, atol=1e-10)
    np.testing.assert_allclose(CentredOperator(D2).to_dense(), B, atol=1e-12)
    # into a buffer (float32 tiles widened on the way): the very same values
    for tile in (D2[5:12, 20:], D2[5:12, 20:].astype(np.float32)):
        out = np.full(tile.shape, np.nan)
        assert double_centre(tile, r[5:12], r[20:], r.mean(), out=out) is out
        np.testing.assert_array_equal(out, double_centre(tile, r[5:12], r[20:], r.mean()))


def test_thread_buffers_are_kept_per_thread_and_capped():
    """A hot loop's temporaries come from one kept buffer per thread and name (fresh pages for
    each were most of a worker's time in the eigensolver's passes); a buffer larger than
    KEEP_BYTES is not kept, so it never holds memory into later stages."""
    import threading

    from dr_dask.runtime.buffers import KEEP_BYTES, thread_buffer

    a = thread_buffer("test", (100, 3), np.float64)
    b = thread_buffer("test", (50, 2), np.float64)
    assert a.shape == (100, 3) and b.shape == (50, 2) and np.shares_memory(a, b)
    assert not np.shares_memory(a, thread_buffer("other", (100, 3), np.float64))
    assert thread_buffer("test", (10,), np.float32).dtype == np.float32
    elsewhere = []
    other = threading.Thread(target=lambda: elsewhere.append(
        thread_buffer("test", (10,), np.float32)))
    other.start()
    other.join()
    assert not np.shares_memory(elsewhere[0], thread_buffer("test", (10,), np.float32))
    big = (KEEP_BYTES // 8 + 1,)
    assert not np.shares_memory(thread_buffer("test", big, np.float64),
                                thread_buffer("test", big, np.float64))


def test_a_populated_array_is_mapped_at_once_and_freed_with_it():
    """The T x T results come mapped in one call (their scattered first writes faulted page
    by page for up to 1.5 s at 800 MB): the pages are resident before any write, the array is
    an ordinary writable one that pickles (as a fitted dist_matrix_ does), and its memory
    goes with it."""
    import gc
    import mmap
    import pickle

    from dr_dask.runtime.buffers import populated

    if not hasattr(mmap, "MAP_POPULATE"):
        pytest.skip("MAP_POPULATE is Linux's")

    def resident_mb() -> float:
        with open("/proc/self/statm") as f:
            return int(f.read().split()[1]) * mmap.PAGESIZE / 2**20

    before = resident_mb()  # other threads of this process may allocate too: 128 MB
    a = populated((2048, 8192), np.float64)
    assert resident_mb() - before > 120
    assert a.shape == (2048, 8192) and a.dtype == np.float64 and a.flags.writeable
    a[:, ::7] = 1.5
    b = pickle.loads(pickle.dumps(a[:64]))
    np.testing.assert_array_equal(a[:64], b)
    assert not np.shares_memory(a, b) and not np.shares_memory(a, populated((2, 2), "f4"))
    held = resident_mb()
    del a
    gc.collect()
    assert held - resident_mb() > 120
    assert populated((0, 5), np.float32).shape == (0, 5)


class _ProductsOnly:
    """An operator known only through products (no to_dense), counting them."""

    def __init__(self, A):
        self.A, self.shape, self.calls = A, A.shape, 0

    def matmat(self, V):
        self.calls += 1
        return self.A @ V


@pytest.mark.parametrize("T", [3, 4, 7, 40])
def test_classical_mds_recovers_points_dense_and_matrix_free(T):
    """Pairwise distances of a rank-2 configuration are reproduced, from an array (dense) and
    from an operator (materialised below the size threshold, Lanczos when asked)."""
    from dr_dask.linalg.mds import classical_mds

    rng = np.random.default_rng(T)
    P = rng.normal(size=(T, 2))
    D2 = ((P[:, None] - P[None]) ** 2).sum(-1)
    for source, method in [(D2, "auto"), (_ProductsOnly(D2), "auto"),
                           (_ProductsOnly(D2), "lanczos")]:
        res = classical_mds(source, 2, method=method, tol=1e-12, random_state=0)
        Y = res.embedding
        np.testing.assert_allclose(((Y[:, None] - Y[None]) ** 2).sum(-1), D2, atol=1e-8)
        if method == "auto":  # T <= DENSE_MAX: one dense solve (one product if an operator)
            assert res.n_passes == 1
            if isinstance(source, _ProductsOnly):
                assert source.calls == 1


def test_auto_eigensolver_dense_for_arrays_lanczos_for_large_product_operators():
    """At T=200 an array is one dense solve; an operator known only by products is not
    materialised (200 products) but solved by Lanczos, to the same eigenvalues."""
    A = _indefinite(T=200)
    ref = scipy.linalg.eigh(A, subset_by_index=[197, 199])[0][::-1]
    dense = top_eigh(A, 3, random_state=0)
    op = _ProductsOnly(A)
    lanczos = top_eigh(op, 3, tol=1e-10, random_state=0)
    assert dense.n_passes == 1 and lanczos.n_passes > 1 and op.calls == lanczos.n_passes
    for res in (dense, lanczos):
        np.testing.assert_allclose(res.values, ref, rtol=1e-9)
