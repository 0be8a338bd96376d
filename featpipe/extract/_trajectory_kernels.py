"""The compiled kernels of dense trajectories, as the tracker calls them.

The kernels are numba functions (:mod:`featpipe.extract._trajectory_numba`, and the flow's
median filter in :mod:`featpipe.extract._flow_median`); a name looked up here is theirs.
"""

from __future__ import annotations


def __getattr__(name: str):
    from featpipe.extract import _trajectory_numba

    return getattr(_trajectory_numba, name)
