"""A dry run's calibration (:mod:`featpipe.stages.calibration`): the CPU time of the sampled
frames after the first five of the first item to compute, over the frames timed, times every
item's sampled frames; an item too short to time says so and gives no estimate.  The clock is
the test's (``time.process_time`` replaced), so the line's figures are exact; the frames are
real (MJPG AVI), decoded and run through dense SIFT."""

from __future__ import annotations

import time

import numpy as np
import pytest

from featpipe import stages
from featpipe.io.video import Sampling
from featpipe.manifest import Manifest
from featpipe.stages.base import RunOptions
from featpipe.store import Store
from tests._avi import write_avi
from tests._reporter import KeptLines
from tests.cli.test_extract_cli import write_manifest

DSIFT = {"sizes": [8], "step": 8}



@pytest.fixture(scope="module")
def videos(tmp_path_factory):
    """Clips of 40, 6, 5 and 3 random 64x48 frames, one of 8 frames of 24x20 pixels and one
    of 8 of 96x72 (MJPG AVI at 10 fps); junk.avi is no video."""
    folder = tmp_path_factory.mktemp("calibration")
    rng = np.random.default_rng(0)
    frames = [rng.integers(0, 256, (48, 64, 3), np.uint8) for _ in range(40)]
    for name, count in (("long", 40), ("six", 6), ("five", 5), ("short", 3)):
        write_avi(folder / f"{name}.avi", frames[:count], 10)
    write_avi(folder / "tiny.avi", [frame[:20, :24] for frame in frames[:8]], 10)
    write_avi(folder / "wide.avi", [rng.integers(0, 256, (72, 96, 3), np.uint8)
                                    for _ in range(8)], 10)
    (folder / "junk.avi").write_bytes(b"not a video at all" * 10)
    return folder


def dry_run(folder, ids, monkeypatch, clock=(10.0, 40.0), every=1):
    """The dry run of dense SIFT on every ``every``-th frame of ``ids`` (in that order), with
    ``time.process_time`` reading ``clock`` call by call: (its lines, its run)."""
    manifest = Manifest.read(write_manifest(folder, [(i, f"{i}.avi", "a", "train")
                                                     for i in ids]))
    readings = iter(clock)
    monkeypatch.setattr(time, "process_time", lambda: next(readings))
    reporter = KeptLines()
    run = stages.extract(Store(folder / "s"), manifest, "dsift", params=DSIFT,
                         sampling=Sampling(every=every), reporter=reporter,
                         options=RunOptions(dry_run=True))
    monkeypatch.undo()
    return reporter.lines, run


def test_the_estimate_is_the_time_after_five_frames_over_the_frames_timed_times_every_frame(
        videos, monkeypatch):
    """long first: frames 5 to 29 are timed (25 of its 40; 30 s on the test's clock): 1.2 s
    a frame, times the 40 + 3 sampled frames of both items."""
    lines, run = dry_run(videos, ["long", "short"], monkeypatch)
    assert lines[0] == ("info", "dry run: about 52 s of CPU (1200.0 ms a frame, the CPU time "
                                "of this process decoding, extracting and encoding 25 frames "
                                "of long after the first 5, times 43 frames)")
    assert run.cpu_seconds == pytest.approx(30 / 25 * 43)
    assert "would compute long: 40 frames -> 40 sampled, 600 rows, 317.8 kB" in \
        [text for _, text in lines]  # dense SIFT's rows are exact: found / planned = 1
    for clock, said in (((0.0, 60.0), "1.7 minutes of CPU (2400.0 ms a frame"),
                        ((0.0, 3600.0), "1.7 hours of CPU (144000.0 ms a frame")):
        lines, _ = dry_run(videos, ["long", "short"], monkeypatch, clock)
        assert lines[0][1].startswith(f"dry run: about {said}, the CPU time")
    # every other frame: 20 of long's sampled, 15 timed, times its 20 and short's 2
    lines, _ = dry_run(videos, ["long", "short"], monkeypatch, every=2)
    assert lines[0][1].endswith("15 frames of long after the first 5, times 22 frames)")
    # items whose frames cannot be told (no video, no file) add none to the time
    lines, _ = dry_run(videos, ["long", "junk", "gone"], monkeypatch)
    assert lines[0][1].endswith("25 frames of long after the first 5, times 40 frames)")
    assert lines[0][1].startswith("dry run: about 48 s of CPU (1200.0 ms a frame")


def test_an_item_of_six_frames_is_timed_on_its_last_and_one_of_fewer_gives_no_estimate(
        videos, monkeypatch):
    """The first item to compute calibrates: six sampled frames time one; five or three time
    none, which is said (and the run's CPU is unknown), the sizes planned all the same."""
    lines, run = dry_run(videos, ["six", "long"], monkeypatch, (1.0, 1.5))
    assert lines[0] == ("info", "dry run: about 23 s of CPU (500.0 ms a frame, the CPU time "
                                "of this process decoding, extracting and encoding 1 frames of "
                                "six after the first 5, times 46 frames)")
    assert run.cpu_seconds == pytest.approx(0.5 * 46)
    for first in ("five", "short"):
        lines, run = dry_run(videos, [first, "long"], monkeypatch, ())
        assert lines[0] == ("info", f"dry run: no CPU estimate ({first} has fewer than 6 "
                                    "sampled frames)")
        assert run.cpu_seconds is None
        assert any(text.startswith("would compute long: 40 frames -> 40 sampled")
                   for _, text in lines)


def test_a_calibration_that_fails_is_a_warning_and_the_plan_goes_on(videos, monkeypatch):
    """The first item's frames are smaller than one descriptor: the calibration's error is
    said as a warning, the run has no CPU estimate, and every item is planned all the same."""
    lines, run = dry_run(videos, ["tiny", "long"], monkeypatch, ())
    assert lines[0] == ("warn", "dry run: no CPU estimate (frame 0 is 24x20 pixels, smaller "
                                "than one dense SIFT descriptor (at least 25x25 with sizes 8): "
                                "no descriptors)")
    assert run.cpu_seconds is None
    assert [text.split(",")[0] for _, text in lines if text.startswith("would compute")] == [
        "would compute tiny: 8 frames -> 8 sampled", "would compute long: 40 frames -> 40 "
        "sampled"]
    lines, run = dry_run(videos, ["junk", "long"], monkeypatch, ())  # no frames known
    assert lines[0][0] == "warn" and lines[0][1].startswith("dry run: no CPU estimate (")
    assert run.cpu_seconds is None


def test_the_rows_found_on_the_first_item_are_the_rows_its_run_stores(videos, tmp_path):
    """Dense trajectories keep a fraction of their sampling cells: the plan's rows of the
    item that calibrates are those found on it, exactly the rows the run then stores where
    the calibration decodes it whole (at most 30 frames), whether it is long enough to be
    timed (6 frames) or not (5); the rows planned that they are measured against are its
    own, not those of the next item, whose frames are of another size."""
    small = {"track_length": 4, "n_t_cells": 2, "n_scales": 2, "step": 4}
    for first in ("six", "five"):
        manifest = Manifest.read(write_manifest(videos, [(i, f"{i}.avi", "a", "train")
                                                         for i in (first, "wide", "long")]))
        store, reporter = Store(tmp_path / first), KeptLines()
        stages.extract(store, manifest, "dt", params=small, sampling=Sampling(every=1),
                       reporter=reporter, options=RunOptions(dry_run=True))
        line = next(t for _, t in reporter.lines if t.startswith(f"would compute {first}:"))
        rows = int(line.split(" sampled, ")[1].split(" rows")[0].replace(",", ""))
        stages.extract(store, manifest, "dt", params=small, sampling=Sampling(every=1),
                       name="t")
        stored = len(store.resolve("t").read_item(first))
        assert rows == stored, (first, line)


@pytest.fixture
def forwards(monkeypatch):
    """Every forward pass of a torchvision network, in order with the clock's readings:
    ("forward", shape of the batch, distinct crops in it) or "clock"."""
    from featpipe.extract.torchvision_features import FrameNetwork

    events = []
    forward = FrameNetwork.forward_crops

    def recorded(self, crops):
        flat = crops.reshape(-1, *crops.shape[-3:]).numpy()
        events.append(("forward", tuple(crops.shape[:-3]), len({c.tobytes() for c in flat})))
        return forward(self, crops)

    monkeypatch.setattr(FrameNetwork, "forward_crops", recorded)
    return events


def network_dry_run(folder, ids, params, events, clock=(2.0, 2.5), every=1):
    """A torchvision network's dry run on every frame of ``ids``, the clock's readings
    recorded among the forward passes: (its lines, its run)."""
    manifest = Manifest.read(write_manifest(folder, [(i, f"{i}.avi", "a", "train")
                                                     for i in ids]))
    readings = iter(clock)

    def process_time():
        events.append("clock")
        return next(readings)

    reporter = KeptLines()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "process_time", process_time)
        run = stages.extract(Store(folder / "s"), manifest, "torchvision", params=params,
                             sampling=Sampling(every=every), reporter=reporter,
                             options=RunOptions(dry_run=True))
    return reporter.lines, run


def test_a_network_is_timed_on_one_batch_of_four_after_a_start_up_pass(videos, forwards):
    """Without weights: seeded random ones (an estimate, not a warning).  A start-up pass of
    one crop, then the timed batch of the first four sampled frames (a short item's last
    repeated); a clip model: one clip of T frames before and one timed, its stride the
    frames it stands for."""
    resnet = {"arch": "resnet18", "layer": "avgpool"}
    lines, run = network_dry_run(videos, ["long", "short"], resnet, forwards)
    assert lines[0] == ("info", "dry run: about 5 s of CPU (125.0 ms a frame, the CPU time "
                                "of this process decoding, cropping and a forward pass of 4 "
                                "frames of long, times 43 frames)")
    assert run.cpu_seconds == pytest.approx(0.5 / 4 * 43)
    assert forwards == [("forward", (1,), 1), "clock", ("forward", (4,), 4), "clock"]
    forwards.clear()
    lines, _ = network_dry_run(videos, ["short", "long"], resnet, forwards)
    assert lines[0][1].endswith("a forward pass of 4 frames of short, times 43 frames)")
    assert forwards == [("forward", (1,), 1), "clock", ("forward", (4,), 3), "clock"]
    forwards.clear()  # every other frame: short's 0 and 2, the last repeated
    lines, _ = network_dry_run(videos, ["short", "long"], resnet, forwards, every=2)
    assert lines[0][1].endswith("a forward pass of 4 frames of short, times 22 frames)")
    assert forwards == [("forward", (1,), 1), "clock", ("forward", (4,), 2), "clock"]
    for stride, said in ((None, 8), (4, 4)):
        forwards.clear()
        clips = {"arch": "r3d_18", "layer": "avgpool", "clip": 8, "clip_stride": stride}
        lines, _ = network_dry_run(videos, ["long"], clips, forwards, (1.0, 3.0))
        assert lines[0] == ("info", f"dry run: about {2 / said * 40:.0f} s of CPU "
                                    f"({2000 / said:.1f} ms a frame, the CPU time of this "
                                    "process decoding, cropping and a forward pass of "
                                    f"{said} frames of long, times 40 frames)")
        assert forwards == [("forward", (1, 8), 8), "clock", ("forward", (1, 8), 8), "clock"]
    vgg = {"weights": "random:0", "resize": 72, "crop": 64}  # a network without clips
    manifest = Manifest.read(write_manifest(videos, [("short", "short.avi", "a", "train")]))
    readings = iter((1.0, 1.2))
    reporter = KeptLines()
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr(time, "process_time", lambda: next(readings))
        stages.extract(Store(videos / "s"), manifest, "vgg16-fc6", params=vgg,
                       sampling=Sampling(every=1), reporter=reporter,
                       options=RunOptions(dry_run=True))
    assert reporter.lines[0] == ("info", "dry run: about 0 s of CPU (50.0 ms a frame, the CPU "
                                         "time of this process decoding, cropping and a "
                                         "forward pass of 4 frames of short, times 3 frames)")


def test_a_calibration_is_a_frozen_value():
    """What a calibration measured is handed to the plan and the sample rule as it is: it
    cannot be changed in place, and two equal measurements are one value."""
    import dataclasses

    from featpipe.stages.calibration import Calibration

    measured = Calibration(12.5, 0.25)
    with pytest.raises(dataclasses.FrozenInstanceError):
        measured.rows_found = 1.0
    assert {measured, Calibration(12.5, 0.25), Calibration(12.5)} == {
        measured, Calibration(12.5, None)}


def test_a_calibration_leaves_no_thread_of_its_item_behind(videos, monkeypatch):
    """The calibrated item's writer (its sinks' output thread) is finished and discarded, not
    left running after the dry run."""
    import threading

    before = {thread.ident for thread in threading.enumerate()}
    lines, _ = dry_run(videos, ["long"], monkeypatch)
    assert any("dry run: about" in text for _, text in lines), lines
    left = [t.name for t in threading.enumerate() if t.ident not in before and t.is_alive()]
    assert left == []
