"""The model contract: a fitted model as named arrays plus JSON metadata, never a pickle.

Every fitted model (PCA, GMM, deep Fisher GMMs, DHRP, GM-SOP, the standardizer) implements

- ``to_arrays() -> (arrays, meta)``: its fitted state as a dict of numeric (or unicode) numpy
  arrays, and a JSON-able dict holding ``model`` (its kind), ``params`` (``get_params()``) and
  any fitted scalars or lists;
- ``from_arrays(arrays, meta)`` (classmethod): the same model back.

:meth:`featpipe.store.Stage.save_model` and :meth:`~featpipe.store.Stage.load_model` consume
exactly this: ``stage.save_model("gmm", gmm)``, ``stage.load_model("gmm",
GaussianMixtureModel)``.  :class:`ArrayModel` implements the contract for the usual case from
two declarations: ``_fitted_arrays`` (attributes saved as arrays) and ``_fitted_meta``
(attributes saved as JSON).
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import ClassVar

import numpy as np

from featpipe.errors import FeatpipeError

_JSON_SCALARS = (str, int, float, bool, type(None))


def json_params(params: Mapping[str, object]) -> dict:
    """The parameters that JSON can hold: scalars and lists of scalars (a namespace or a fitted
    object passed as a parameter is left out: it cannot be stored, and loading does not need
    it)."""
    def storable(value) -> bool:
        if isinstance(value, list | tuple):
            return all(isinstance(v, _JSON_SCALARS) for v in value)
        return isinstance(value, _JSON_SCALARS)

    return {k: v for k, v in params.items() if storable(v)}


class ArrayModel:
    """``to_arrays``/``from_arrays`` from ``_fitted_arrays`` and ``_fitted_meta``.

    Attribute ``weights_`` is stored as array ``weights`` (meta key likewise); ``_model_name``
    is the kind written as ``meta["model"]`` and checked when loading.
    """

    _model_name: ClassVar[str] = ""
    _fitted_arrays: ClassVar[tuple[str, ...]] = ()
    _fitted_meta: ClassVar[tuple[str, ...]] = ()

    def to_arrays(self) -> tuple[dict[str, np.ndarray], dict]:
        missing = [a for a in self._fitted_arrays if not hasattr(self, a)]
        if missing:
            raise FeatpipeError(f"{type(self).__name__} is not fitted yet (no {missing[0]}); "
                                "call fit first")
        arrays = {a.rstrip("_"): np.asarray(getattr(self, a)) for a in self._fitted_arrays}
        meta = {"model": self._model_name, "params": json_params(self.get_params(deep=False))}
        meta.update({a.rstrip("_"): getattr(self, a) for a in self._fitted_meta
                     if hasattr(self, a)})
        return arrays, meta

    @classmethod
    def from_arrays(cls, arrays: Mapping[str, np.ndarray], meta: Mapping):
        check_model_kind(cls._model_name, meta)
        try:
            model = cls(**meta["params"])
        except (KeyError, TypeError):
            raise FeatpipeError(f"stored {cls._model_name} model does not record the parameters "
                                f"of {cls.__name__} (written by another featpipe version?); "
                                "fit it again with --force") from None
        for attribute in cls._fitted_arrays:
            key = attribute.rstrip("_")
            if key not in arrays:
                raise FeatpipeError(f"stored {cls._model_name} model lacks array {key!r}")
            setattr(model, attribute, np.asarray(arrays[key]))
        for attribute in cls._fitted_meta:
            if attribute.rstrip("_") in meta:
                setattr(model, attribute, meta[attribute.rstrip("_")])
        return model


def check_model_kind(expected: str, meta: Mapping) -> None:
    """Refuse metadata of another kind of model (metadata without a kind is accepted)."""
    kind = meta.get("model")
    if kind is not None and kind != expected:
        raise FeatpipeError(f"stored model is a {kind!r} model, expected {expected!r}")
