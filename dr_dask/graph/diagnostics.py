"""The warnings a neighbour graph raises about its data (public as ``dr_dask.graph.*``)."""


class DisconnectedGraphWarning(UserWarning):
    """A neighbour graph had several connected components and was bridged."""


class DuplicatePointsWarning(UserWarning):
    """Some points coincide exactly; their graph edges have zero length."""


class LowRecallWarning(UserWarning):
    """An approximate neighbour search found too few of the true neighbours."""
