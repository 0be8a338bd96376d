"""Grouped Fisher vectors against the per-group encoder they concatenate, and one group's part
(``encode --method fisher-group``), on a hand-made grouped GMM stage (issue 39 §6: each
test kills mutants of ``featpipe/encode/fisher_groups.py`` that the other tests let live)."""

from __future__ import annotations

import numpy as np
import pytest

from featpipe.encode.fisher import FisherItemEncoder, GaussianMixtureModel
from featpipe.encode.fisher_groups import (
    FisherGroup,
    GroupedFisherEncoder,
    _GroupSlice,
    group_widths,
    is_grouped,
)
from featpipe.errors import InputError, ParameterError
from featpipe.manifest import Manifest
from featpipe.parallel import ItemOutput
from featpipe.store import Store

COLUMNS = {"a": slice(0, 3), "b": slice(3, 7)}
RNG = np.random.default_rng(0)


@pytest.fixture(scope="module")
def grouped(tmp_path_factory):
    """A GMM stage as ``fit gmm --groups a,b`` leaves it: group a (3 columns, K = 2) and b
    (4 columns, K = 3), the ``groups`` model written last; and the GMMs themselves."""
    store = Store(tmp_path_factory.mktemp("g") / "s")
    stage = store.stage("gmm", {"groups": "a,b"}, items=Manifest([]))
    gmms = {}
    for group, k in (("a", 2), ("b", 3)):
        width = COLUMNS[group].stop - COLUMNS[group].start
        gmms[group] = GaussianMixtureModel(n_components=k, random_state=0).fit(
            RNG.standard_normal((200, width)).astype(np.float32))
        stage.save_model(f"gmm-{group}", gmms[group])
    stage.save_model("groups", {"columns": np.array([[0, 3], [3, 7]], np.int64)},
                     {"model": "groups", "groups": ["a", "b"], "input_groups": ["a", "b"],
                      "input_dim": 7})
    return stage, gmms


def reference(gmms, x: np.ndarray) -> np.ndarray:
    """Each group's FV on its own columns (FisherItemEncoder), concatenated in group order."""
    parts = []
    for group, gmm in gmms.items():
        arrays, _ = gmm.to_arrays()
        parts.append(FisherItemEncoder(arrays).encode_batch([x[:, COLUMNS[group]]], [{}])[0])
    return np.concatenate(parts)


def encoder(stage, per_frame=False):
    return GroupedFisherEncoder(stage, lambda arrays: FisherItemEncoder(
        arrays, per_frame=per_frame), per_frame)


def test_an_items_grouped_fv_is_each_groups_fv_concatenated(grouped):
    stage, gmms = grouped
    assert is_grouped(stage)
    x = RNG.standard_normal((30, 7)).astype(np.float32)
    (out,) = encoder(stage).encode_batch([x], [{}])
    assert out.shape == (2 * 2 * 3 + 2 * 3 * 4,)
    np.testing.assert_allclose(out, reference(gmms, x), rtol=1e-5, atol=1e-7)
    assert group_widths(stage) == [("a", 12), ("b", 24)]


def test_per_frame_grouped_fvs_follow_the_frame_index_with_empty_frames_zero(grouped):
    stage, gmms = grouped
    x = RNG.standard_normal((12, 7)).astype(np.float32)
    frame_index = np.array([0] * 5 + [2] * 7, np.int32)  # frame 1 has no descriptor
    (out,) = encoder(stage, per_frame=True).encode_batch(
        [x], [{"frame_index": frame_index, "timestamps": np.array([0.0, 0.1, 0.2, 0.3])}])
    array = out.array if isinstance(out, ItemOutput) else out
    assert array.shape == (4, 36)  # as many frames as timestamps
    np.testing.assert_allclose(array[0], reference(gmms, x[:5]), rtol=1e-5, atol=1e-7)
    np.testing.assert_allclose(array[2], reference(gmms, x[5:]), rtol=1e-5, atol=1e-7)
    assert not array[1].any() and not array[3].any()
    with pytest.raises(InputError, match="--per-frame needs a 'frame_index' sidecar"):
        encoder(stage, per_frame=True).encode_batch([x], [{}])
    # frames stacked (F, n, D): frame f's rows are x3[f], no sidecar needed
    x3 = RNG.standard_normal((3, 4, 7)).astype(np.float32)
    (out,) = encoder(stage, per_frame=True).encode_batch([x3], [{}])
    array = out.array if isinstance(out, ItemOutput) else out
    assert array.shape == (3, 36)
    for f in range(3):
        np.testing.assert_allclose(array[f], reference(gmms, x3[f]), rtol=1e-5, atol=1e-7)
    # no descriptor in any frame: one zero row a frame, of the full width (no frame: none)
    for stamps, rows in ((np.array([0.0, 0.1]), 2), (None, 0)):
        extra = {"frame_index": np.zeros(0, np.int32)}
        extra.update({} if stamps is None else {"timestamps": stamps})
        (out,) = encoder(stage, per_frame=True).encode_batch([np.zeros((0, 7), np.float32)],
                                                             [extra])
        array = out.array if isinstance(out, ItemOutput) else out
        assert array.shape == (rows, 36) and not array.any()


@pytest.mark.parametrize(("per_frame", "shape"), [(False, (10, 6)), (False, (10, 8)),
                                                  (False, (7,)), (True, (10, 6)),
                                                  (True, (10, 8))])
def test_rows_of_another_width_are_refused_naming_the_groups(grouped, per_frame, shape):
    stage, _ = grouped
    x = np.zeros(shape, np.float32)
    extra = {"frame_index": np.zeros(shape[0], np.int32)} if per_frame else {}
    with pytest.raises(InputError, match=r"expected \(N, 7\) rows of the groups a, b"):
        encoder(stage, per_frame).encode_batch([x], [extra])


def test_a_groups_model_whose_groups_and_columns_differ_is_refused(grouped, tmp_path):
    stage, gmms = grouped
    broken = Store(tmp_path / "s").stage("gmm", {"groups": "x"}, items=Manifest([]))
    for group, gmm in gmms.items():
        broken.save_model(f"gmm-{group}", gmm)
    broken.save_model("groups", {"columns": np.array([[0, 3]], np.int64)},
                      {"groups": ["a", "b"], "input_groups": ["a", "b"], "input_dim": 7})
    with pytest.raises(ValueError, match="zip"):
        encoder(broken)


def test_one_groups_part_keeps_the_per_frame_sidecars_only(grouped):
    stage, _ = grouped
    part = _GroupSlice(stage, "b")
    assert (part.columns, part.total) == (slice(12, 36), 36)
    frames = RNG.standard_normal((3, 36)).astype(np.float32)
    sidecars = {"frame_index": np.arange(3), "timestamps": np.array([0.0, 0.5, 1.0]),
                "positions": np.zeros((3, 3))}
    per_frame, per_item = part.encode_batch([frames, frames[0].astype(np.float64)],
                                            [sidecars, {"timestamps": np.zeros(1)}])
    assert isinstance(per_frame, ItemOutput)
    np.testing.assert_array_equal(per_frame.array, frames[:, 12:36])
    assert sorted(per_frame.extras) == ["frame_index", "timestamps"]
    np.testing.assert_array_equal(per_frame.extras["timestamps"], sidecars["timestamps"])
    assert isinstance(per_item, np.ndarray) and per_item.dtype == np.float32
    np.testing.assert_array_equal(per_item, frames[0, 12:36])
    for bad in (np.zeros((3, 35)), np.zeros((2, 3, 36))):
        with pytest.raises(InputError, match="expected grouped Fisher vectors of 36 values"):
            part.encode_batch([bad], [{}])
    with pytest.raises(ParameterError, match=r"'c' is not a group of .* \(its groups: a, b\)"):
        _GroupSlice(stage, "c")


def test_fisher_group_requires_a_group():
    with pytest.raises(ParameterError, match="group is required"):
        FisherGroup.check_param_values({"group": None})
    FisherGroup.check_param_values({"group": "hog"})


def test_a_grouped_fv_with_a_pyramid_places_the_descriptors_in_the_image(grouped):
    """The groups share the fisher method's parameters, a spatial pyramid among them: each
    group's cells come from the descriptors' positions in the item's image (its
    ``image_size`` sidecar), not from their bounding box."""
    stage, gmms = grouped
    x = RNG.standard_normal((40, 7)).astype(np.float32)
    positions = np.column_stack([np.linspace(0, 30, 40), np.linspace(0, 20, 40)])
    extra = {"positions": positions, "image_size": np.array([100, 100])}
    grouped_encoder = GroupedFisherEncoder(
        stage, lambda arrays: FisherItemEncoder(arrays, pyramid="1x1+2x2+3x1"), False)
    (out,) = grouped_encoder.encode_batch([x], [extra])
    parts = []
    for group, gmm in gmms.items():
        arrays, _ = gmm.to_arrays()
        parts.append(FisherItemEncoder(arrays, pyramid="1x1+2x2+3x1").encode_batch(
            [x[:, COLUMNS[group]]], [extra])[0])
    np.testing.assert_allclose(out, np.concatenate(parts), rtol=1e-5, atol=1e-7)
    boxed = FisherItemEncoder(gmms["a"].to_arrays()[0], pyramid="1x1+2x2+3x1").encode_batch(
        [x[:, COLUMNS["a"]]], [{"positions": positions}])[0]
    assert not np.allclose(parts[0], boxed)  # the image size changes the cells
