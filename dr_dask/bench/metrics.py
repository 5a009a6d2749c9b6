"""``dr-dask bench metrics``: blockwise neighbourhood metrics at large T, and LSDR at n=20,000.

1. Trustworthiness/continuity at T=50,000 in row blocks on the cluster. A dense pairwise matrix
   would take 8 T^2 bytes (20 GB); the target is a process-tree peak RSS <= 4 GB. Baseline in the
   same run: ``sklearn.manifold.trustworthiness`` (dense) at a T it can afford, against our
   blockwise version at that same T (time and memory ratio, and the values must agree).
2. LSDR on a noisy 2-D spiral and a noisy 3-D swiss roll at n=20,000: wall time and peak RSS,
   with the same fit at n/4 in the same run as the baseline (scaling ratio).
"""

from __future__ import annotations

import logging
from typing import Any

import numpy as np

from dr_dask.datasets.toy import noisy_spiral, noisy_swiss_roll
from dr_dask.runtime.resources import measure

logger = logging.getLogger(__name__)

#: Sizes of ``--quick`` (a smoke run; the tests shrink them further).
QUICK = {"T": 5000, "T_base": 1000, "lsdr_n": 2000}


def _manifold_data(T: int, N: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    """A noisy swiss roll in the first 3 of N dims and its 2-D PCA embedding."""
    from sklearn.decomposition import PCA

    X = noisy_swiss_roll(T, seed, n_features=N)[0]
    return X, PCA(2, random_state=seed).fit_transform(X)


def _measure(fn: Any, repeats: int) -> dict:
    m = measure(fn, repeats)
    return {"median_seconds": m.seconds, "repeats": repeats, "peak_rss_gb": m.peak_rss_gb,
            "result": m.result}


def bench_trustworthiness(client: Any, T: int, T_base: int, N: int = 10, k: int = 10) -> dict:
    from sklearn.manifold import trustworthiness as sk_trust

    from dr_dask.metrics import neighbourhood_scores

    Xb, Yb = _manifold_data(T_base, N, 0)
    dense = _measure(lambda: sk_trust(Xb, Yb, n_neighbors=k), 3)
    ours_small = _measure(lambda: neighbourhood_scores(Xb, Yb, k, client=client), 3)
    X, Y = _manifold_data(T, N, 1)
    big = _measure(lambda: neighbourhood_scores(X, Y, k, client=client), 1)
    out = {
        "baseline": {"T": T_base, "sklearn_dense_seconds": dense["median_seconds"],
                     "sklearn_dense_peak_rss_gb": dense["peak_rss_gb"],
                     "blockwise_seconds": ours_small["median_seconds"],
                     "blockwise_peak_rss_gb": ours_small["peak_rss_gb"],
                     "time_ratio_blockwise_over_dense":
                         ours_small["median_seconds"] / dense["median_seconds"],
                     "values_agree": bool(abs(dense["result"]
                                              - ours_small["result"]["trustworthiness"]) < 1e-9)},
        "large": {"T": T, "N": N, "k": k, "seconds": big["median_seconds"],
                  "repeats": big["repeats"], "peak_rss_gb": big["peak_rss_gb"],
                  "dense_pairwise_gb": 8 * T * T / 1e9,
                  "meets_4gb_target": big["peak_rss_gb"] <= 4.0,
                  **{key: big["result"][key] for key in ("trustworthiness", "continuity",
                                                         "knn_preservation")}},
    }
    logger.info("trustworthiness at T=%d: %.1f s, %.2f GB", T, big["median_seconds"],
                big["peak_rss_gb"])
    return out


def _roll(n: int, seed: int) -> tuple[np.ndarray, np.ndarray]:
    X, t, _ = noisy_swiss_roll(n, seed)
    return X, t


def bench_lsdr(client: Any, n: int) -> dict:
    from scipy.stats import spearmanr

    from dr_dask.methods.lsdr import LSDR

    out = {}
    for name, make, d in (("spiral_2d", noisy_spiral, 1), ("swiss_roll_3d", _roll, 2)):
        runs = {}
        for size in (max(n // 4, 200), n):
            X, z = make(size, 0)
            model = LSDR(n_components=d, random_state=0, client=client)
            r = _measure(lambda model=model, X=X: model.fit(X), 1)
            E = model.embedding_
            runs[size] = {
                "seconds": r["median_seconds"], "peak_rss_gb": r["peak_rss_gb"],
                "skeleton_size": len(model.skeleton_indices_),
                "n_passes": int(model.n_passes_),
                "abs_spearman_latent": max(abs(float(spearmanr(E[:, j], z)[0]))
                                           for j in range(d)),
            }
            logger.info("LSDR %s n=%d: %s", name, size, runs[size])
        small, big = (runs[s] for s in sorted(runs))
        out[name] = {"baseline_n": min(runs), "baseline": small, "n": n, "result": big,
                     "time_ratio_vs_baseline": big["seconds"] / small["seconds"]}
    return out


def run_bench(client: Any, quick: bool = False) -> dict:
    """All metric benchmarks; ``quick`` shrinks sizes for a smoke run."""
    T, T_base, n = ((QUICK["T"], QUICK["T_base"], QUICK["lsdr_n"]) if quick
                    else (50_000, 5_000, 20_000))
    return {
        "quick": quick,
        "trustworthiness": bench_trustworthiness(client, T, T_base),
        "lsdr": bench_lsdr(client, n),
    }
