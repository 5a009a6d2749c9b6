"""The README's picture: Isomap unrolls a swiss roll, drawn with ``dr_dask.plot``.

Runs in a notebook as it does here (no client: dask's threads). The README shows these lines
and the PNG they write:

    python examples/swiss_roll_picture.py [OUT.png]    # default docs/images/swiss_roll.png
"""

import sys

from sklearn.datasets import make_swiss_roll

import dr_dask
from dr_dask import plot

if __name__ == "__main__":
    out = sys.argv[1] if len(sys.argv) > 1 else "docs/images/swiss_roll.png"
    X, t = make_swiss_roll(3000, noise=0.05, random_state=0)
    Y = dr_dask.Isomap(n_neighbors=10, n_components=2).fit_transform(X)
    ax = plot.embedding(Y, color=t, label="position along the roll", title="Isomap of a swiss roll")
    ax.figure.savefig(out)
    print(out)
