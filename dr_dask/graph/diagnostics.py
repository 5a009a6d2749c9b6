"""The warnings a neighbour graph raises about its data (public as ``dr_dask.graph.*``).

:class:`DuplicatePointsWarning` is every estimator's (the duplicate-point policy lives with the
input checks, :mod:`dr_dask.io.validation`); a graph raises it too.
"""

from dr_dask.io.validation import DuplicatePointsWarning

__all__ = ["DisconnectedGraphWarning", "DuplicatePointsWarning", "LowRecallWarning"]


class DisconnectedGraphWarning(UserWarning):
    """A neighbour graph had several connected components and was bridged."""


class LowRecallWarning(UserWarning):
    """An approximate neighbour search found too few of the true neighbours."""
