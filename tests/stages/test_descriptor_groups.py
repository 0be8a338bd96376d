"""Descriptor groups modelled and encoded one group at a time (issue 32 §2): ``fit gmm --groups``
fits one PCA and one GMM per group on sampled raw rows, a streamed ``extract --encode fisher
--per-frame`` gives per frame each group's FV normalised on its own, concatenated in group
order, and ``encode --method fisher-group`` takes one group's part back; checked against the
library's Fisher vector of each group's columns, on the toy grouped method of
tests/_cell_groups.py (the trajectories' values play no part)."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from featpipe import stages
from featpipe.encode.fisher import fisher_vector
from featpipe.errors import FeatpipeError, ParameterError
from featpipe.extract.groups import parse_groups, stage_columns
from featpipe.extract.pca import PCAProjection
from featpipe.extract.settings import ExtractSettings
from featpipe.extract.trajectories import DenseTrajectories
from featpipe.io.video import Sampling
from featpipe.manifest import Manifest
from featpipe.store import Store
from tests._avi import write_avi
from tests.cli.test_extract_cli import write_manifest

PARAMS = {"cell": 4, "descriptors": "colour,grey"}


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """Two 6-frame clips of a textured photograph panning; a sample, a grouped GMM (K = 2,
    each group halved by PCA), the raw rows and the streamed per-frame grouped FVs."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("FEATPIPE_FEATURES", "tests._cell_groups")
        yield _grouped(tmp_path_factory.mktemp("groups"))


def _grouped(tmp_path):
    from sklearn.datasets import load_sample_image

    photo = load_sample_image("flower.jpg")
    for k, name in enumerate(("a", "b")):
        frames = [cv2.resize(photo[40 * k + 3 * t:, 60 * k + 5 * t:][:160, :240], (48, 32))
                  for t in range(6)]
        write_avi(tmp_path / f"{name}.avi", frames, 10)
    manifest = Manifest.read(write_manifest(tmp_path, [("a", "a.avi", "x", "train"),
                                                       ("b", "b.avi", "y", "train")]))
    store = Store(tmp_path / "s")

    def extract(name, **settings):
        return stages.extract(store, manifest, "cell-groups", params=PARAMS,
                              sampling=Sampling(every=1), settings=ExtractSettings(**settings),
                              name=name)

    extract("sample", sample_descriptors=400)
    stages.fit_gmm(store, "sample", name="g", groups="colour, GREY", pca_fraction=0.5,
                   n_components=2)
    extract("raw")
    extract("fv", encode="fisher", encode_params={"gmm": "g", "per_frame": True})
    return store, manifest, extract


def test_each_group_gets_its_own_projection_gmm_and_normalised_fv(grouped):
    store, _, _ = grouped
    gmm = store.resolve("g")
    assert gmm.params["groups"] == "colour,grey"  # one spelling, one key
    raw, fv = store.resolve("raw"), store.resolve("fv")
    for item in ("a", "b"):
        rows, index = raw.read_item(item), raw.read_extra(item, "frame_index")
        got = fv.read_item(item)
        assert got.shape == (6, 2 * 2 * 2 + 2 * 2 * 8)  # colour 3 -> 2, grey 16 -> 8; K = 2
        start = 0
        for group, columns in (("colour", slice(0, 3)), ("grey", slice(3, 19))):
            pca = gmm.load_model(f"pca-{group}", PCAProjection)
            arrays, _ = gmm.load_model(f"gmm-{group}")
            width = 2 * arrays["means"].size
            part = got[:, start:start + width]
            for frame in range(6):
                x = pca.transform(rows[index == frame][:, columns])
                expected = fisher_vector(x, arrays["weights"], arrays["means"],
                                         arrays["variances"])
                np.testing.assert_allclose(part[frame], expected, atol=2e-6)
            np.testing.assert_allclose(np.linalg.norm(part, axis=1), 1, atol=1e-5)
            start += width


def test_a_groups_part_and_the_two_stage_path(grouped):
    store, _, _ = grouped
    fv = store.resolve("fv")
    grey = stages.encode(store, "fv", "fisher-group", {"gmm": "g", "group": "grey"},
                         name="grey").stage
    for item in ("a", "b"):
        np.testing.assert_array_equal(grey.read_item(item), fv.read_item(item)[:, 8:])
        np.testing.assert_array_equal(grey.read_extra(item, "frame_index"), np.arange(6))
    two_stage = stages.encode(store, "raw", "fisher", {"gmm": "g", "per_frame": True},
                              name="fv2").stage
    for item in ("a", "b"):
        np.testing.assert_allclose(two_stage.read_item(item), fv.read_item(item), atol=1e-6)
    whole = stages.encode(store, "raw", "fisher", {"gmm": "g"}, name="whole").stage
    assert whole.read_item("a").shape == (40,)
    np.testing.assert_allclose(np.linalg.norm(whole.read_item("a")[8:]), 1, atol=1e-5)
    with pytest.raises(FeatpipeError, match="'hog' is not a group of gmm-.* .its groups: colour, "
                       "grey."):
        stages.encode(store, "fv", "fisher-group", {"gmm": "g", "group": "hog"})


def test_mismatched_groups_are_refused_before_any_work(grouped):
    store, _, extract = grouped
    before = set(store.all_stages())
    with pytest.raises(FeatpipeError, match="was fitted on the groups colour,grey of raw rows; "
                       "this extraction gives the groups grey: use --descriptors colour,grey"):
        PARAMS["descriptors"] = "grey"
        try:
            extract("fv-grey", encode="fisher", encode_params={"gmm": "g", "per_frame": True})
        finally:
            PARAMS["descriptors"] = "colour,grey"
    with pytest.raises(ParameterError, match="has 'hof', which the input does not hold"):
        stages.fit_gmm(store, "sample", name="g2", groups="hof", n_components=2)
    with pytest.raises(FeatpipeError, match="holds encoded rows; descriptor groups need"):
        stages.fit_gmm(store, "fv", name="g3", groups="grey", n_components=2)
    with pytest.raises(ParameterError, match="cannot be combined with --pca-dim"):
        stages.fit_gmm(store, "sample", name="g4", pca_dim=2, pca_fraction=0.5, n_components=2)
    assert set(store.all_stages()) == before


def test_mbh_is_one_group_of_mbhx_and_mbhy_columns():
    columns = dict(DenseTrajectories(descriptors="hog,hof,mbh").groups())
    assert parse_groups("hog,hof,mbh", columns) == [
        ("hog", slice(0, 96)), ("hof", slice(96, 204)), ("mbh", slice(204, 396))]
    assert parse_groups("mbhy", columns) == [("mbhy", slice(300, 396))]
    with pytest.raises(ParameterError, match="names 'hog' twice"):
        parse_groups("hog,hog", columns)


def test_groups_come_from_the_stages_feature_method(grouped):
    store, _, _ = grouped
    assert stage_columns(store.resolve("raw")) == {"colour": slice(0, 3), "grey": slice(3, 19)}


def test_fit_pca_per_group_then_fit_gmm_on_its_projections(grouped, tmp_path):
    """``fit pca --groups G --fraction 0.5`` fits one PCA per group (the recipe's halving),
    ``fit gmm --groups G --pca NAME`` models each group in those projections: the same models,
    hence the same FVs, as the one-step ``fit gmm --groups G --pca-fraction 0.5`` (both see
    every sampled row)."""
    from tests.conftest import run_cli

    store, _, _ = grouped
    done = run_cli("fit", "pca", "--store", store.root, "--input", "sample", "--name", "pg",
                   "--groups", "colour,grey", "--fraction", "0.5",
                   env={"FEATPIPE_FEATURES": "tests._cell_groups"})
    assert "grey: columns 3..18, PCA 16 -> 8" in done.stdout
    pcas = store.resolve("pg")
    assert pcas.params["groups"] == "colour,grey" and "n_components" not in pcas.params
    stages.fit_gmm(store, "sample", name="g-two", groups="colour,grey", pca="pg",
                   n_components=2)
    one, two = store.resolve("g"), store.resolve("g-two")
    for group in ("colour", "grey"):
        for model in (f"pca-{group}", f"gmm-{group}"):
            (a, _), (b, _) = one.load_model(model), two.load_model(model)
            for name in a:
                np.testing.assert_allclose(b[name], a[name], rtol=1e-6, atol=1e-7)
    again = stages.encode(store, "raw", "fisher", {"gmm": "g-two", "per_frame": True},
                          name="fv-two").stage
    np.testing.assert_allclose(again.read_item("a"), store.resolve("fv").read_item("a"),
                               atol=1e-6)


def test_grouped_and_whole_projections_are_not_mixed_up(grouped):
    store, _, _ = grouped
    stages.fit_pca(store, "sample", name="p-grey", groups="grey", n_components=4)
    stages.fit_pca(store, "sample", name="p-whole", n_components=4)
    before = set(store.all_stages())
    with pytest.raises(ParameterError, match="stage p-grey has no PCA of group 'colour'"):
        stages.fit_gmm(store, "sample", name="x1", groups="colour,grey", pca="p-grey",
                       n_components=2)
    with pytest.raises(ParameterError, match="p-whole holds one PCA of whole rows"):
        stages.fit_gmm(store, "sample", name="x2", groups="grey", pca="p-whole",
                       n_components=2)
    with pytest.raises(FeatpipeError, match="holds one PCA per descriptor group .fit pca "
                       "--groups.: use it with fit gmm --groups"):
        stages.fit_gmm(store, "sample", name="x3", pca="p-grey", n_components=2)
    with pytest.raises(ParameterError, match="n_components 20 is more than group grey's 16 values"):
        stages.fit_pca(store, "sample", name="x4", groups="grey", n_components=20)
    with pytest.raises(ParameterError, match="fraction cannot be combined with n_components"):
        stages.fit_pca(store, "sample", name="x5", fraction=0.5, n_components=4)
    assert set(store.all_stages()) == before
    grey = stages.fit_gmm(store, "sample", name="x6", groups="grey", pca="p-grey",
                          n_components=2)
    assert grey.load_model("gmm-grey")[0]["means"].shape == (2, 4)
