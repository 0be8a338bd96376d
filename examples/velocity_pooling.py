"""``featpipe encode --method velocity``: the mean change between frames (an example plugin).

v = (1 / (T − lag)) Σ_t |x_{t+lag} − x_t|  (the signed change with ``absolute=False``); a
sequence of at most ``lag`` frames encodes to zeros.  Load it with
``FEATPIPE_ENCODERS=examples.velocity_pooling`` or a ``featpipe.encoders`` entry point.
"""

from numbers import Integral

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils._param_validation import Interval

from featpipe.encode.registry import EncodeMethod, estimator_builder
from featpipe.errors import InputError
from featpipe.parameters import ValidatedEstimator, estimator_parameters


class VelocityPooling(ValidatedEstimator, TransformerMixin, BaseEstimator):
    """Mean change between frames ``lag`` apart, over a list of (T_i, D) sequences.

    Parameters
    ----------
    lag : int
        Frames between the two frames of each difference.
    absolute : bool
        Average |x_{t+lag} − x_t| (motion energy) instead of the signed change.
    """

    _parameter_constraints = {"lag": [Interval(Integral, 1, None, closed="left")],
                              "absolute": ["boolean"]}

    def __init__(self, lag=1, absolute=True):
        self.lag = lag
        self.absolute = absolute

    def fit(self, sequences, y=None):
        self._validate_params()
        self.n_features_in_ = np.asarray(sequences[0]).shape[1]
        return self

    def transform(self, sequences):
        out = []
        for i, x in enumerate(sequences):
            x = np.asarray(x, dtype=np.float64)
            if x.ndim != 2 or x.shape[1] != self.n_features_in_:
                raise InputError(f"sequence {i}: expected (T, {self.n_features_in_}), got "
                                 f"shape {x.shape}")
            change = x[self.lag:] - x[:-self.lag]
            change = np.abs(change) if self.absolute else change
            out.append(change.mean(axis=0) if len(change) else np.zeros(x.shape[1]))
        return np.stack(out)


ENCODE_METHODS = [EncodeMethod("velocity", "mean change between frames (example plugin)",
                               estimator_builder(VelocityPooling),
                               estimator_parameters(VelocityPooling))]
