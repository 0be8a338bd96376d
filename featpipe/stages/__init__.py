"""The Python API of featpipe's stages: each command line command parses, calls one and prints.

=====================  ==========================================================
``extract``            :func:`featpipe.stages.extraction.extract`
``import``             :func:`featpipe.stages.imports.import_features`
``encode``             :func:`featpipe.stages.encoding.encode`
``fit pca`` ...        :func:`featpipe.stages.fitting.fit_pca`, ``fit_gmm``, ``fit_deep_gmm``,
                       ``fit_dhrp``, ``fit_gmsop``, ``fit_standardize``
``classify``           :func:`featpipe.stages.classification.classify`
``cache verify|gc``    :func:`featpipe.stages.cache.verify`, :func:`~featpipe.stages.cache.gc`
=====================  ==========================================================

Each takes a :class:`~featpipe.store.Store` first, names stages of it by their friendly names,
and reports through an optional :class:`~featpipe.stages.base.Reporter` (silent by default)::

    from featpipe.store import Store
    from featpipe.stages import encode, classify

    store = Store("S")
    encode(store, "fc6", "hrp", {"window": 20}, name="fc6-hrp")
    classify(store, ["fc6-hrp"], ["chi2+ser"], normalize="l2")

Names resolve lazily, so ``import featpipe.stages`` loads no encoder, torch or OpenCV.
"""

from __future__ import annotations

import importlib

from featpipe.stages.base import Progress, Reporter, RunOptions, StageRun

_FUNCTIONS = {
    "extract": "featpipe.stages.extraction",
    "import_features": "featpipe.stages.imports",
    "encode": "featpipe.stages.encoding",
    "fit_pca": "featpipe.stages.fitting",
    "fit_gmm": "featpipe.stages.fitting",
    "fit_deep_gmm": "featpipe.stages.fitting",
    "fit_dhrp": "featpipe.stages.fitting",
    "fit_gmsop": "featpipe.stages.fitting",
    "fit_standardize": "featpipe.stages.fitting",
    "classify": "featpipe.stages.classification",
}

__all__ = ["Progress", "Reporter", "RunOptions", "StageRun", *_FUNCTIONS]


def __getattr__(name: str):
    if name in _FUNCTIONS:
        return getattr(importlib.import_module(_FUNCTIONS[name]), name)
    raise AttributeError(f"module 'featpipe.stages' has no attribute {name!r}")
