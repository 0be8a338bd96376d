"""A slow encode method, registered as a plugin (``FEATPIPE_ENCODERS=tests._slow_mean``): the
mean frame of each item, one item per batch, after a pause, so that a test can kill a real
``featpipe encode`` between two items; with ``$SLOW_MEAN_GATE`` set, no item is computed
before that file exists."""

from __future__ import annotations

import os
import time
from numbers import Real

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils._param_validation import Interval

from featpipe.encode.registry import EncodeMethod, estimator_builder
from featpipe.parameters import ValidatedEstimator, estimator_parameters


class SlowMean(ValidatedEstimator, TransformerMixin, BaseEstimator):
    """The mean frame of each (T, D) sequence, ``seconds`` after it was given.

    Parameters
    ----------
    seconds : float
        Pause before each sequence's mean.
    """

    _parameter_constraints = {"seconds": [Interval(Real, 0, None, closed="left")]}

    def __init__(self, seconds=0.3):
        self.seconds = seconds

    def fit(self, sequences, y=None):
        self._validate_params()
        self.n_features_in_ = np.asarray(sequences[0]).shape[1]
        return self

    def transform(self, sequences):
        gate = os.environ.get("SLOW_MEAN_GATE")
        while gate and not os.path.exists(gate):
            time.sleep(0.01)
        out = []
        for x in sequences:
            time.sleep(self.seconds)
            out.append(np.asarray(x, dtype=np.float64).mean(axis=0))
        return np.stack(out)


ENCODE_METHODS = [EncodeMethod("slow-mean", "mean frame after a pause (tests)",
                               estimator_builder(SlowMean), estimator_parameters(SlowMean),
                               batch_size=1)]
