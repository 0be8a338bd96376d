"""The model contract (featpipe.models): every fitted model goes through to_arrays /
from_arrays, consumed by Stage.save_model / Stage.load_model, and comes back equal; no
pickle, no object arrays."""

from __future__ import annotations

import json

import numpy as np
import pytest

from featpipe.encode.fisher import GaussianMixtureModel
from featpipe.encode.standardize import Standardizer
from featpipe.errors import FeatpipeError
from featpipe.extract.pca import PCAProjection
from featpipe.manifest import Manifest
from featpipe.store import Store

RNG = np.random.default_rng(0)
X = RNG.normal(size=(80, 4))
SEQS = [RNG.normal(size=(6 + i % 3, 3)) + (i % 2) * np.linspace(0, 1, 6 + i % 3)[:, None]
        for i in range(8)]
LABELS = np.array(["a", "b"] * 4)


def _fitted():
    """(model, what to compare) for each kind of fitted model, small and quick."""
    torch = pytest.importorskip("torch")
    torch.set_num_threads(1)
    from featpipe.learn.deep_fisher import DeepFisherKernel
    from featpipe.learn.dhrp import DiscriminativeRankPooling
    from featpipe.learn.gmsop import GatedMixtureSOP

    gmm = GaussianMixtureModel(3, max_iter=10).fit(X)
    sets = [RNG.normal(size=(12, 4)) + (i % 2) for i in range(8)]
    deep = DeepFisherKernel(max_iter=1, C=10.0).fit(
        sets[:6], LABELS[:6], sets[6:], LABELS[6:], (gmm.weights_, gmm.means_, gmm.variances_))
    maps = [RNG.normal(size=(10, 4)) * (1 + i % 2) for i in range(8)]
    return [
        (PCAProjection(2, whiten=True).fit(X), lambda m: m.transform(X)),
        (gmm, lambda m: m.score(X)),
        (Standardizer().fit(SEQS), lambda m: np.concatenate(m.transform(SEQS))),
        (deep, lambda m: np.concatenate([m.means_.ravel(), m.svm_weights_.ravel()])),
        (DiscriminativeRankPooling(epochs=1, device="cpu").fit(SEQS, LABELS),
         lambda m: m.decision_function(SEQS)),
        (GatedMixtureSOP(n_components=2, top_k=1, dim=2, epochs=1).fit(maps, LABELS),
         lambda m: m.decision_function(maps)),
    ]


def test_every_fitted_model_round_trips_through_the_stage(tmp_path):
    stage = Store(tmp_path).stage("fit", {"all": 1}, items=Manifest([], root=tmp_path))
    for model, output in _fitted():
        name = type(model).__name__.lower()
        stage.save_model(name, model, {"note": "saved by a test"})
        arrays, meta = stage.load_model(name)
        assert all(a.dtype != object for a in arrays.values())
        assert meta["note"] == "saved by a test" and meta["model"]
        assert meta["params"] == json.loads(json.dumps(meta["params"]))
        back = stage.load_model(name, type(model))
        assert type(back) is type(model)
        assert back.get_params() == {**model.get_params(),
                                     **({"device": None} if name.startswith("discr") else {})}
        np.testing.assert_array_equal(output(back), output(model))


def test_a_model_of_another_kind_or_without_params_is_refused(tmp_path):
    stage = Store(tmp_path).stage("fit", {"x": 1}, items=Manifest([], root=tmp_path))
    stage.save_model("pca", PCAProjection(2).fit(X))
    with pytest.raises(FeatpipeError, match="is a 'pca' model, expected 'gmm'"):
        stage.load_model("pca", GaussianMixtureModel)
    stage.save_model("old", {"components": np.eye(2)}, {"n_components": 2})  # no params
    with pytest.raises(FeatpipeError, match="does not record the parameters"):
        stage.load_model("old", PCAProjection)
