"""GP-Isomap on the Euler swiss roll: a fourth, unseen patch arrives in the stream.

Fits on three patches, calibrates the novelty threshold, then streams known points followed by
the unseen patch through the durable runner (threaded here; pass a client for a cluster) and
prints how many of each were flagged and whether a refit absorbed the new patch.

    python examples/gp_isomap_drift.py [WORKDIR]
"""

import os
import sys
import tempfile

import numpy as np

import dr_dask
from dr_dask.datasets.swiss_roll import shift_scenario
from dr_dask.stream import STATUS, StreamRunner, read_output

if __name__ == "__main__":
    workdir = sys.argv[1] if len(sys.argv) > 1 else tempfile.mkdtemp(prefix="dr_dask_stream_")
    sc = shift_scenario(300, random_state=0)
    model = dr_dask.GPIsomap(n_neighbors=10, random_state=0).fit(sc.batch)
    var = model.predict_variance(sc.stream)
    unseen = np.arange(len(sc.stream)) >= sc.first_unseen
    print(f"sigma_t = {model.sigma_t_:.4f}; flagged: "
          f"{np.mean(var[~unseen] > model.sigma_t_):.1%} of known-patch points, "
          f"{np.mean(var[unseen] > model.sigma_t_):.1%} of unseen-patch points")
    out = os.path.join(workdir, "out.zarr")
    summary = StreamRunner(out, iter(np.array_split(sc.stream, 8)), model, sc.batch,
                           n_s=200, handle_signals=False).run()
    print("runner:", summary)
    result = read_output(out)
    statuses, counts = np.unique(result["status"], return_counts=True)
    names = {code: name for name, code in STATUS.items()}
    print("rows by status:", {names[c]: int(n) for c, n in zip(statuses, counts)})
    print("rows by model version:", np.bincount(result["version"]).tolist())
