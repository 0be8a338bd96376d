"""Temporal encoders as scikit-learn transformers: one vector per sequence of per-frame
features (docs/methods.md).

Each class is a thin transformer (``BaseEstimator``, ``_parameter_constraints``, numpydoc) over
a list of (T_i, D) sequences; the math, its formulas and sources are the functions of
:mod:`featpipe.encode.functional.temporal` (``avg``, ``max``, ``tpyramid``, ``arp``, ``rankpool``,
``hrp``, ``recursive``), which ``featpipe encode --method`` calls without these classes.  The
classes declare each parameter once (signature, constraints, docstring): the command line's
options and its precomputed parameter table (:mod:`featpipe.encode.registry`) come from them.
"""

from __future__ import annotations

from numbers import Integral, Real

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin
from sklearn.utils._param_validation import Interval, StrOptions

from featpipe.backend import to_numpy
from featpipe.encode.functional import temporal as F
from featpipe.encode.functional.temporal import DIRECTIONS, SOLVERS
from featpipe.encode.maps import PSI_MAPS
from featpipe.encode.registry import EncodeMethod, function_builder
from featpipe.errors import InputError
from featpipe.parameters import ValidatedEstimator, estimator_parameters, hidden_defaults

_DEVICE = [StrOptions({"cpu", "cuda"})]
_POSITIVE_INT = [Interval(Integral, 1, None, closed="left")]


class TemporalEncoder(ValidatedEstimator, TransformerMixin, BaseEstimator):
    """Base of the temporal encoders: a scikit-learn transformer over a list of (T_i, D)
    sequences (numpy, torch or CuPy arrays).  ``fit`` only records the dimension;
    ``transform`` calls the class's function of :mod:`featpipe.encode.functional.temporal`
    (:attr:`_function`) with the estimator's parameters.

    Parameters
    ----------
    device : {"cpu", "cuda"}
        Where to encode: cpu (numpy), or cuda (CuPy or torch; fails clearly without a GPU).
    """

    _parameter_constraints = {"device": _DEVICE}

    def fit(self, sequences, y=None):
        seqs = self._validated(sequences)
        self.n_features_in_ = seqs[0].shape[1]
        return self

    def transform(self, sequences):
        """Encode each sequence; returns an (n, dim) numpy array in the inputs' float dtype."""
        encoded = self._encode(self._validated(sequences))
        return np.stack([np.asarray(to_numpy(e)) for e in encoded])

    def _validated(self, sequences):
        self._validate_params()
        return F.validated_sequences(sequences, self.device,
                                     getattr(self, "n_features_in_", None))

    def _encode(self, seqs):
        return self._function(seqs, **self.get_params(deep=False))


class _DeviceOnly(TemporalEncoder):
    """An encoder whose only parameter is the device."""

    def __init__(self, device="cpu"):
        self.device = device


class AveragePooling(_DeviceOnly):
    """Mean over time."""

    _function = staticmethod(F.average_pool_sequences)


class MaxPooling(_DeviceOnly):
    """Maximum over time."""

    _function = staticmethod(F.max_pool_sequences)


class TemporalPyramid(TemporalEncoder):
    """Two-level temporal pyramid: [pool(X); pool(first half); pool(second half)], 3·D.

    Parameters
    ----------
    pool : {"avg", "max"}
        Pooling in each cell of the pyramid.
    """

    _parameter_constraints = {**TemporalEncoder._parameter_constraints,
                              "pool": [StrOptions({"avg", "max"})]}
    _function = staticmethod(F.temporal_pyramid_sequences)

    def __init__(self, pool="avg", device="cpu"):
        self.pool = pool
        self.device = device


class ApproximateRankPooling(_DeviceOnly):
    """Dynamic-image coefficients on the raw frames: d = Σ_t α_t x_t (Bilen et al. CVPR'16)."""

    _function = staticmethod(F.approximate_rank_pool_sequences)


class _RankPoolingParams(TemporalEncoder):
    """The SVR parameters every rank-pooling encoder shares.

    Parameters
    ----------
    psi : {"none", "ssr", "ser"}
        Map ψ applied to the time-varying mean before the SVR.
    C : float
        SVR cost (liblinear ``-c``; the HRP paper writes C/2).
    epsilon : float
        SVR insensitivity ε (liblinear ``-p``).
    directions : {"fwd", "rev", "both"}
        Rank-pool the sequence forward, reversed, or both concatenated (the final layer of
        hrp and recursive).
    solver : {"newton", "liblinear"}
        SVR solver: featpipe's exact batched Newton, or per-window liblinear (the reference).
    """

    _parameter_constraints = {
        **TemporalEncoder._parameter_constraints,
        "psi": [StrOptions(set(PSI_MAPS))],
        "C": [Interval(Real, 0, None, closed="neither")],
        "epsilon": [Interval(Real, 0, None, closed="left")],
        "directions": [StrOptions(set(DIRECTIONS))],
        "solver": [StrOptions(set(SOLVERS))],
    }

    @classmethod
    def _check_param_rules(cls, params):
        F.check_rank_pooling_rules(params)


class RankPooling(_RankPoolingParams):
    """Rank pooling of the whole sequence: u* of the SVR on L2(ψ(TVM(X))) (VideoDarwin).

    Sequences are solved ``batch_size`` at a time (sorted by length; shorter ones zero-padded
    and masked); small batches keep the working set in cache.

    Parameters
    ----------
    batch_size : int
        Sequences solved together.
    """

    _parameter_constraints = {**_RankPoolingParams._parameter_constraints,
                              "batch_size": _POSITIVE_INT}
    _function = staticmethod(F.rank_pool_sequences)

    def __init__(self, directions="both", psi="ssr", C=1.0, epsilon=0.1, solver="newton",
                 device="cpu", batch_size=8):
        self.directions = directions
        self.psi = psi
        self.C = C
        self.epsilon = epsilon
        self.solver = solver
        self.device = device
        self.batch_size = batch_size


class HierarchicalRankPooling(_RankPoolingParams):
    """Hierarchical rank pooling (Fernando et al. CVPR'16): depth−1 sliding-window layers,
    then rank pooling of the whole last sequence.

    Parameters
    ----------
    window : int
        Window length M of each sliding-window layer (a shorter sequence is one window).
    stride : int
        Stride S between windows.
    depth : int
        Number of layers L (depth − 1 sliding-window layers, then the final one).
    emit_layer : int or None
        Return the sequence X^(ℓ) of layer ℓ (1 = the input, depth = the sequence the final
        layer pools) instead of the final vector.
    chunk_bytes : int or None
        Working memory of the process for its chunks of windows, in bytes (None:
        ``FEATPIPE_MEMORY``, default 256 MiB; :func:`featpipe.backend.memory_budget`): split
        among the worker threads of the numpy path (``FEATPIPE_THREADS``, default: the cores
        this process may use), one chunk at a time on the device path; peak memory is about
        this plus the layer outputs, whatever the core count.
    """

    _parameter_constraints = {**_RankPoolingParams._parameter_constraints,
                              "window": _POSITIVE_INT, "stride": _POSITIVE_INT,
                              "depth": _POSITIVE_INT, "emit_layer": [*_POSITIVE_INT, None],
                              "chunk_bytes": [*_POSITIVE_INT, None]}
    _function = staticmethod(F.hierarchical_rank_pool_sequences)

    def __init__(self, window=20, stride=1, depth=2, psi="ser", C=1.0, epsilon=0.1,
                 directions="fwd", solver="newton", device="cpu", emit_layer=None,
                 chunk_bytes=None):
        self.window = window
        self.stride = stride
        self.depth = depth
        self.psi = psi
        self.C = C
        self.epsilon = epsilon
        self.directions = directions
        self.solver = solver
        self.device = device
        self.emit_layer = emit_layer
        self.chunk_bytes = chunk_bytes

    def transform(self, sequences):
        if self.emit_layer is None:
            return super().transform(sequences)
        raise InputError("emit_layer is set: use transform_sequences(), which returns one "
                         "(T_i, D) array per input")

    def transform_sequences(self, sequences):
        """The layer-``emit_layer`` sequence of each input (a list of numpy arrays)."""
        return self._encode(self._validated(sequences))


class RecursiveRankPooling(HierarchicalRankPooling):
    """Recursive rank pooling: each layer rank-pools every prefix of its input; the final
    layer rank-pools the whole last sequence."""

    _parameter_constraints = {k: v for k, v in
                              HierarchicalRankPooling._parameter_constraints.items()
                              if k not in ("window", "stride")}
    _function = staticmethod(F.recursive_rank_pool_sequences)

    def __init__(self, depth=2, psi="ser", C=1.0, epsilon=0.1, directions="fwd",
                 solver="newton", device="cpu", emit_layer=None,
                 chunk_bytes=None):
        self.depth = depth
        self.psi = psi
        self.C = C
        self.epsilon = epsilon
        self.directions = directions
        self.solver = solver
        self.device = device
        self.emit_layer = emit_layer
        self.chunk_bytes = chunk_bytes


# ---------------------------------------------------------------------------------------------
# featpipe encode --method ...


def _method(name: str, summary: str, cls) -> EncodeMethod:
    core = F.ENCODE_FUNCTIONS[name]
    hidden = ("chunk_bytes", "batch_size")
    return EncodeMethod(name, summary, function_builder(core),
                        estimator_parameters(cls, exclude=hidden), core.batch_size,
                        hidden_defaults(cls, hidden), kinds=core.kinds)


ENCODE_METHODS = [
    _method("avg", "average over time", AveragePooling),
    _method("max", "maximum over time", MaxPooling),
    _method("tpyramid", "temporal pyramid: whole + halves (--pool avg|max)", TemporalPyramid),
    _method("arp", "approximate rank pooling (dynamic image coefficients)",
            ApproximateRankPooling),
    _method("rankpool", "rank pooling, VideoDarwin (--directions both)", RankPooling),
    _method("hrp", "hierarchical rank pooling (--window --stride --depth --psi)",
            HierarchicalRankPooling),
    _method("recursive", "recursive rank pooling (--depth --psi)", RecursiveRankPooling),
]
