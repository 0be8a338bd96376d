"""Stateful feature methods in the decoding workers (one tracker per video, as dense
trajectories need) and the human boxes of ``--human-boxes``, on the toy method of
tests/_cell_change.py: the tracker is made afresh for each video and after a restart, gets
each frame's boxes, and the boxes are part of the stage key by content."""

from __future__ import annotations

import numpy as np
import pytest

from featpipe import stages
from featpipe.errors import ParameterError
from featpipe.extract.settings import ExtractSettings
from featpipe.io.video import Sampling
from featpipe.manifest import Manifest
from featpipe.stages.base import RunOptions
from featpipe.store import Store
from tests.cli.test_extract_cli import write_manifest
from tests.unit.test_video import write_video


@pytest.fixture
def toy(tmp_path, monkeypatch):
    """Two 6-frame videos of 32x16 pixels (2 x 4 cells of 8) and the toy method."""
    monkeypatch.setenv("FEATPIPE_FEATURES", "tests._cell_change")
    for name in ("a", "b"):
        write_video(tmp_path / f"{name}.mp4", n_frames=6, size=(32, 16))
    manifest = write_manifest(tmp_path, [("a", "a.mp4", "x", "train"),
                                         ("b", "b.mp4", "y", "train")])
    return Store(tmp_path / "s"), Manifest.read(manifest)


def run(store, manifest, name, sampling=None, **settings):
    return stages.extract(store, manifest, "cell-change", params={"cell": 8},
                          sampling=sampling or Sampling(every=1),
                          settings=ExtractSettings(**settings), name=name,
                          options=RunOptions(on_error="skip"))


def test_one_tracker_per_video_from_its_first_frame(toy):
    """Rows of frames 1..5 (none end at frame 0), 8 cells each; the frame counter of the
    tracker restarts at each video, so each was made for its video."""
    store, manifest = toy
    run(store, manifest, "cells")
    stage = store.resolve("cells")
    for item in ("a", "b"):
        rows = stage.read_item(item)
        assert rows.shape == (5 * 8, 2)
        np.testing.assert_array_equal(stage.read_extra(item, "frame_index"),
                                      np.repeat(np.arange(1, 6), 8))
        np.testing.assert_array_equal(rows[:, 1], np.repeat(np.arange(2, 7), 8))
        assert np.all(rows[:, 0] > 5 / 255)  # about +10 grey a frame


def test_a_restart_makes_a_new_tracker(tmp_path, monkeypatch):
    """A container that states a wrong frame count gets a second pass (--frames): the frames
    of the first pass are forgotten, and so is the tracker that saw them."""
    monkeypatch.setenv("FEATPIPE_FEATURES", "tests._cell_change")
    write_video(tmp_path / "a.mp4", n_frames=20, size=(32, 16))
    manifest = Manifest.read(write_manifest(tmp_path, [("a", "a.mp4", "x", "train")]))
    store = Store(tmp_path / "s")
    stages.extract(store, manifest, "cell-change", params={"cell": 8},
                   sampling=Sampling(frames=4), name="cells",
                   settings=ExtractSettings(decoder="tests.unit.test_video:WrongCountDecoder"))
    rows = store.resolve("cells").read_item("a")
    np.testing.assert_array_equal(rows[:, 1], np.repeat([2, 3, 4], 8))


def write_boxes(folder, item_id, text):
    folder.mkdir(exist_ok=True)
    (folder / f"{item_id}.bb").write_text(text)


def test_each_frame_gets_its_boxes_and_the_key_follows_their_content(toy, tmp_path):
    """Video a's frame 2 has a box over the left half (x 0..15): its 4 cells there give no
    row; frame 4's line has a box over nothing.  The stage key holds the files' content: the
    same files elsewhere give the same stage, a changed file another."""
    store, manifest = toy
    boxes = tmp_path / "boxes"
    write_boxes(boxes, "a", "0\n2 0 0 15.5 15 0.9\nnot a frame line\n4 100 100 120 120 0.5\n")
    write_boxes(boxes, "b", "")
    first = run(store, manifest, "boxed", human_boxes=str(boxes))
    stage = store.resolve("boxed")
    index = stage.read_extra("a", "frame_index")
    assert np.bincount(index).tolist() == [0, 8, 4, 8, 8, 8]
    np.testing.assert_array_equal(stage.read_extra("a", "positions")[index == 2][:, 0],
                                  [20, 28, 20, 28])
    assert stage.read_item("b").shape == (40, 2)
    copy = tmp_path / "copy"
    copy.mkdir()
    for name in ("a", "b"):
        (copy / f"{name}.bb").write_bytes((boxes / f"{name}.bb").read_bytes())
    again = run(store, manifest, "boxed2", human_boxes=str(copy))
    assert again.stage.name == first.stage.name and again.summary.done == 0
    write_boxes(copy, "b", "1 0 0 31 15 1\n")
    changed = run(store, manifest, "boxed3", human_boxes=str(copy))
    assert changed.stage.name != first.stage.name
    assert changed.stage.read_item("b").shape == (32, 2)  # frame 1: every cell boxed


def test_bad_boxes_fail_their_item_with_one_line(toy, tmp_path):
    store, manifest = toy
    boxes = tmp_path / "boxes"
    write_boxes(boxes, "a", "1 0 0 15 15\n")  # four numbers: no score
    result = run(store, manifest, "bad", human_boxes=str(boxes))
    failed = result.stage.failed()
    assert set(failed) == {"a", "b"}
    assert f"{boxes / 'a.bb'} line 1: 4 numbers after the frame number; a box is 5" in \
        failed["a"]
    assert f"no human boxes file {boxes / 'b.bb'}" in failed["b"]
    write_boxes(boxes, "a", "9 0 0 15 15 1\n")
    write_boxes(boxes, "b", "2 0 0 1 1 1\n2 0 0 1 1 1\n")
    failed = run(store, manifest, "bad2", human_boxes=str(boxes)).stage.failed()
    assert "has boxes for frame 9 but the video has 6 frames" in failed["a"]
    assert "line 2: frame 2 is listed twice" in failed["b"]


def test_boxes_need_a_method_that_takes_them_and_every_frame(toy, tmp_path):
    store, manifest = toy
    (tmp_path / "boxes").mkdir()
    with pytest.raises(ParameterError, match="per video frame: sample every frame"):
        run(store, manifest, "x", sampling=Sampling(fps=2), human_boxes=str(tmp_path / "boxes"))
    with pytest.raises(ParameterError, match="is not a folder"):
        run(store, manifest, "x", human_boxes=str(tmp_path / "nothing"))
    with pytest.raises(ParameterError, match="estimate the camera motion .idt., not dsift"):
        stages.extract(store, manifest, "dsift",
                       settings=ExtractSettings(human_boxes=str(tmp_path / "boxes")))
    assert not store.all_stages()
