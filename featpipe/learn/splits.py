"""The stratified hold-out that learned encoders select on (deep Fisher kernel, DHRP).

Per class, in sorted label order, the class's items are permuted by ``random_state`` and
n_val = min(n − 1, max(1, round(fraction · n))) of them go to validation: every class keeps at
least one item to learn from, a class of one item is learned from and not validated on, and
``fraction = 0`` holds nothing out (and draws nothing from ``random_state``).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np


def stratified_split(labels: Sequence, fraction: float, random_state=None
                     ) -> tuple[np.ndarray, np.ndarray]:
    """Sorted indices (learn, validation) of ``labels``; ``random_state`` is a seed or a
    ``numpy.random.Generator`` (which is then advanced, once per class)."""
    labels = np.asarray(labels)
    if fraction == 0:  # nothing held out, nothing drawn
        return np.arange(len(labels)), np.arange(0)
    rng = np.random.default_rng(random_state)
    val = []
    for label in np.unique(labels):
        members = rng.permutation(np.flatnonzero(labels == label))
        val.extend(members[:min(len(members) - 1, max(1, round(fraction * len(members))))])
    val = np.sort(np.asarray(val, dtype=int))
    return np.setdiff1d(np.arange(len(labels)), val), val
