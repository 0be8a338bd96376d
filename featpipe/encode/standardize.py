"""Per-channel standardisation of per-frame features with train statistics.

z_t = (x_t − m) / s, where m and s are the mean and standard deviation of every frame of the
train items (channels with s < 1e-12 keep s = 1, so a constant channel becomes 0, never NaN).
The usual preprocessing of UCR/UEA sequences before temporal encoding.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np
from sklearn.base import BaseEstimator, TransformerMixin

from featpipe.encode.registry import EncodeMethod
from featpipe.errors import InputError
from featpipe.item_kinds import ANY_ROWS
from featpipe.models import ArrayModel
from featpipe.parameters import ValidatedEstimator, model_parameter

MODEL_NAME = "standardize"


class Standardizer(ArrayModel, ValidatedEstimator, TransformerMixin, BaseEstimator):
    """Fit per-channel mean and standard deviation on (T_i, D) sequences; transform them.

    Attributes
    ----------
    mean_ : ndarray (D,)
    scale_ : ndarray (D,)
        Standard deviation per channel (1 where it is below 1e-12).
    """

    _model_name = MODEL_NAME
    _fitted_arrays = ("mean_", "scale_")

    def fit(self, sequences: Sequence[np.ndarray], y=None) -> Standardizer:
        if not len(sequences):
            raise InputError("standardize: no train sequences to fit on")
        frames = np.concatenate([_frames(x, i) for i, x in enumerate(sequences)], axis=0)
        self.mean_ = frames.mean(axis=0)
        std = frames.std(axis=0)
        self.scale_ = np.where(std < 1e-12, 1.0, std)
        self.n_features_in_ = self.mean_.shape[0]
        return self

    def transform(self, sequences: Sequence[np.ndarray]) -> list[np.ndarray]:
        out = []
        for i, x in enumerate(sequences):
            frames = _frames(x, i)
            if frames.shape[1] != self.mean_.shape[0]:
                raise InputError(f"sequence {i}: {frames.shape[1]} channels, the standardizer "
                                 f"was fitted on {self.mean_.shape[0]}")
            out.append((frames - self.mean_) / self.scale_)
        return out


def _frames(x, index) -> np.ndarray:
    x = np.asarray(x, dtype=np.float64)
    if x.ndim != 2 or x.shape[0] == 0:
        raise InputError(f"sequence {index}: expected a non-empty (frames, channels) array, "
                         f"got shape {x.shape}")
    return x


class _StandardizeEncoder:
    def __init__(self, model: Standardizer):
        self.model = model

    def encode_batch(self, arrays, extras):
        return self.model.transform(arrays)


def _build(params: Mapping, models: Mapping):
    return _StandardizeEncoder(models["model"].load_model(MODEL_NAME, Standardizer))


ENCODE_METHODS = [
    EncodeMethod("standardize", "per-channel z-score with train statistics (fit standardize "
                 "first; --model NAME)", _build,
                 (model_parameter("model", "Name of a fitted model stage.",
                                  ("fit standardize",)),), batch_size=64, kinds=ANY_ROWS),
]
