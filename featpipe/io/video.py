"""Video decoding: frame sampling, decoder timestamps, and a worker process with a time limit.

Decoders sit behind one small interface (:class:`Decoder`) and are chosen by name from
:data:`DECODERS` (``"module:attribute"``, imported lazily, as PyTorchVideo's
``encoded_video.py``).  ``opencv`` (``cv2.VideoCapture``) is the default.

Sampling (:class:`Sampling`, one of):

* ``every=N``: frames 0, N, 2N, ... in decoding order;
* ``fps=F``: the first frame at or after each time k/F seconds (k = 0, 1, ...), times taken
  from the decoder's positions (``CAP_PROP_POS_MSEC``), so a wrong container frame count or
  frame rate does not shift them;
* ``frames=N``: N frames evenly spaced over the T frames that actually decode,
  ``round(linspace(0, T − 1, N))`` (all T frames when N ≥ T).  The container's frame count is
  only a guess: one pass keeps the frames chosen for it and counts the frames that decode; when
  the count differs, a second pass takes the right ones.  The N kept frames are held in memory
  until the pass ends;
* ``window=W`` (``extract --sample-window``, set by the extraction, not an option here): W
  consecutive frames of each video, from a first frame drawn from ``window_seed`` and the item
  id over the container's frame count (:func:`window_start`); decoding stops after the
  window (the frames before it are decoded, not kept), so the container's count is checked
  only where the video ends before the window does (a second pass takes the window of the
  true count where that count moves it);
* nothing: every frame.

Timestamps (seconds) are the frame's own time: the decoder's position of each frame
(``CAP_PROP_POS_MSEC``) measured from the first decoded frame, which is therefore at 0 (some
files report the first frame one frame period late, 0.0417 s at 24 fps, or after a front
cut); a position that does not increase (OpenCV reports 0 for frames without a time stamp)
is replaced by the previous one plus one frame period.  Still images (jpg, png, ...) are
one-frame items with timestamp 0.

AVI files count frames as the container defines them: a zero-length "drop" chunk in the index
is a frame that repeats the previous one (variable-rate capture); OpenCV skips it, and the
frames after it come with later positions, so each missing frame period is filled with a copy
of the previous frame (:func:`is_avi`, :class:`OpenCVDecoder`).

Truncated and corrupt videos: the decoder counts the frames that decode against the number
the container declares, and the worker process collects FFmpeg's messages (which never reach
the terminal); decode errors, or fewer frames than declared, fail the item with one line
naming them, unless the caller accepts partial items (``allow_partial``), which then carry
a warning saying how many frames were lost.

:class:`DecodePool` runs N decoding processes (:func:`_worker_main`) and multiplexes their
messages: every worker decodes one item at a time and runs a :class:`WorkerProgram` on each
frame (crop and resize for a network, dense SIFT and its encoding...) so that only small
results travel back; a decoder that hangs past the time limit is killed and one that crashes
costs only its item, both reported as an :class:`~featpipe.errors.ItemError` naming the file.
Workers ignore SIGINT and SIGTERM: the parent decides what an interrupt means and kills them;
they exit by themselves when the parent goes away.
"""

from __future__ import annotations

import atexit
import importlib
import math
import os
import queue
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass
from multiprocessing.connection import Connection, wait
from numbers import Real
from pathlib import Path
from typing import Protocol

import numpy as np

from featpipe.errors import (
    InputError,
    ItemError,
    ParameterError,
    WriteError,
    describe_error,
)
from featpipe.io.images import is_image, read_image
from featpipe.parameters import declared

#: decoder name -> "module:attribute" of a class implementing :class:`Decoder`.
DECODERS = {"opencv": "featpipe.io.video:OpenCVDecoder"}

#: frames per message from the worker process
CHUNK_FRAMES = 4
#: seconds between a worker's progress reports (a program that keeps its frames: one report
#: a frame woke the parent 30 times a second, on the worker's core with ``--jobs 1``)
PROGRESS_PERIOD = 0.2
#: frame period assumed when the container states no frame rate (25 fps)
DEFAULT_PERIOD = 0.04
#: a declared frame count above this is garbage (seen in front-cut MPEG program streams)
MAX_DECLARED_FRAMES = 10**8


def _is_number(value) -> bool:
    """A real number, not a bool (``True`` is no frame count)."""
    return isinstance(value, Real) and not isinstance(value, bool)


@dataclass(frozen=True)
class Sampling:
    """Which frames to keep: at most one of ``fps``, ``every``, ``frames`` (none: all)."""

    fps: float | None = declared(
        None, "Sample F frames per second. Without --fps, --every or --frames every frame is "
        "kept (dense SIFT on video: 1 a second, neighbours give nearly the same).")
    every: int | None = declared(None, "Keep every N-th frame (1: all).")
    frames: int | None = declared(None, "Keep N frames evenly spaced over the video.")
    #: W consecutive frames of each video at a seeded first frame (:func:`window_start`),
    #: alone; not an option of its own (``extract --sample-window`` sets it)
    window: int | None = None
    window_seed: int = 0

    def validate(self) -> Sampling:
        """This sampling, or an error naming the value: at most one of the four, ``fps`` a
        finite number > 0, ``every``, ``frames`` and ``window`` whole numbers >= 1 (``2.0`` is
        2; a bool or a string is no number)."""
        given = [name for name in ("fps", "every", "frames", "window")
                 if getattr(self, name) is not None]
        if len(given) > 1:
            raise InputError("--fps, --every and --frames are mutually exclusive, got "
                             + " and ".join("--" + g for g in given))
        if self.fps is not None and not (_is_number(self.fps) and 0 < self.fps < math.inf):
            raise ParameterError("fps", f"must be a finite number > 0, got {self.fps!r}")
        for name in ("every", "frames", "window"):
            value = getattr(self, name)
            if value is not None and not (_is_number(value) and value >= 1
                                          and float(value).is_integer()):
                raise ParameterError(name, f"must be a whole number >= 1, got {value!r}")
        return self

    def params(self) -> dict:
        """The sampling as stage parameters (part of the stage key): ``fps`` a float,
        ``every`` and ``frames`` ints, however they were written."""
        from featpipe.parameters import typed_value

        return {"fps": typed_value(self.fps, (float,)), "every": typed_value(self.every, (int,)),
                "frames": typed_value(self.frames, (int,))}

    def expected(self, total: int, fps: float) -> int:
        """Frames kept from a video of ``total`` frames at ``fps`` (0: unknown rate)."""
        if self.window is not None:
            return min(total, int(self.window))
        if self.frames is not None:
            return len(evenly_spaced(total, self.frames))
        if self.every is not None:
            return -(-total // self.every)
        if self.fps is not None and fps > 0:
            return min(total, math.ceil(total / fps * self.fps - 1e-9))
        return total


def window_start(item_id: str, total: int, window: int, seed: int) -> int:
    """The first of the ``window`` consecutive frames kept of an item of ``total`` frames:
    uniform over 0 .. total − window (0 when the item is shorter), drawn from a generator
    seeded by (``seed``, the item id's digest, 1), the sampled rows' generator's seeds and 1."""
    from featpipe.fileio import id_digest

    rng = np.random.default_rng([int(seed), int(id_digest(item_id)[:15], 16), 1])
    return int(rng.integers(0, max(int(total) - int(window), 0) + 1))


def evenly_spaced(n_total: int, n_wanted: int) -> np.ndarray:
    """Indices of ``n_wanted`` frames evenly spaced over ``n_total``: round(linspace(0, T−1))."""
    if n_wanted >= n_total:
        return np.arange(n_total)
    return np.unique(np.rint(np.linspace(0, n_total - 1, n_wanted)).astype(np.int64))


class Decoder(Protocol):
    """A video decoder: yields (frame index, timestamp in seconds, RGB uint8 frame or None).

    ``want(index, seconds)`` says whether the frame is kept; frames not wanted may be yielded
    as ``None`` (not converted).  Errors are raised as exceptions with a readable message.
    """

    def frames(self, path: str, want: Callable[[int, float], bool]
               ) -> Iterator[tuple[int, float, np.ndarray | None]]: ...

    # optional: ``frame_count(path) -> int``, the container's frame count (a guess);
    # ``counts``: (frames decoded, frames the container declares or None, timestamp of the
    # last frame decoded or None) after ``frames````


@dataclass(frozen=True)
class VideoInfo:
    """What the container says about a video (or an image): frame count (None when it does
    not say), frame rate (0 when unknown) and frame size."""

    frames: int | None
    fps: float
    height: int
    width: int


def _declared(count: float) -> int | None:
    return int(count) if 0 < count <= MAX_DECLARED_FRAMES else None


class OpenCVDecoder:
    """``cv2.VideoCapture``: ``grab`` every frame, ``retrieve`` only the wanted ones."""

    counts: tuple[int, int | None, float | None] | None = None

    def frame_count(self, path) -> int:
        """The container's frame count (a guess: it can be wrong or 0)."""
        import cv2

        capture = cv2.VideoCapture(str(path))
        try:
            return max(int(capture.get(cv2.CAP_PROP_FRAME_COUNT)), 0)
        finally:
            capture.release()

    def info(self, path) -> VideoInfo:
        """The container's frame count, rate and size, without decoding."""
        import cv2

        capture = cv2.VideoCapture(str(path))
        try:
            if not capture.isOpened():
                raise RuntimeError("OpenCV cannot open it as a video (not a video, unsupported "
                                   "codec or corrupt header)")
            return VideoInfo(_declared(capture.get(cv2.CAP_PROP_FRAME_COUNT)),
                             max(float(capture.get(cv2.CAP_PROP_FPS)), 0.0),
                             int(capture.get(cv2.CAP_PROP_FRAME_HEIGHT)),
                             int(capture.get(cv2.CAP_PROP_FRAME_WIDTH)))
        finally:
            capture.release()

    def frames(self, path, want):
        import cv2

        capture = cv2.VideoCapture(str(path))
        if not capture.isOpened():
            raise RuntimeError("OpenCV cannot open it as a video (not a video, unsupported "
                               "codec or corrupt header)")
        declared = _declared(capture.get(cv2.CAP_PROP_FRAME_COUNT))
        fps = capture.get(cv2.CAP_PROP_FPS)
        period = 1.0 / fps if fps > 0 else DEFAULT_PERIOD
        drops = fps > 0 and is_avi(path)
        self.counts = (0, declared, None)
        try:
            index, first, previous, last = 0, None, None, None
            while capture.grab():
                reported = capture.get(cv2.CAP_PROP_POS_MSEC) / 1000.0
                first = reported if first is None else first
                seconds = reported - first
                if drops and previous is not None:
                    # drop chunks between the previous frame and this one: each repeats it
                    for _ in range(round((seconds - previous) / period) - 1):
                        previous += period
                        frame = cv2.cvtColor(last, cv2.COLOR_BGR2RGB) \
                            if want(index, previous) else None
                        yield index, previous, frame
                        index += 1
                        self.counts = (index, declared, previous)
                if previous is not None and not seconds > previous:
                    seconds = previous + period
                previous = seconds
                frame, wanted = None, want(index, seconds)
                if wanted or drops:  # AVI: kept in case a drop chunk repeats it
                    ok, bgr = capture.retrieve()
                    if not ok or bgr is None:
                        raise RuntimeError(f"frame {index} could not be decoded")
                    last = bgr
                    if wanted:
                        frame = cv2.cvtColor(bgr, cv2.COLOR_BGR2RGB)
                yield index, seconds, frame
                index += 1
                self.counts = (index, declared, seconds)
        finally:
            capture.release()


def is_avi(path) -> bool:
    """Whether ``path`` is a RIFF AVI file, whose index may hold zero-length "drop" chunks:
    frames that repeat the previous one (variable-rate capture), which OpenCV skips."""
    with open(path, "rb") as file:
        head = file.read(12)
    return head[:4] == b"RIFF" and head[8:12] == b"AVI "


def get_decoder(name: str) -> Decoder:
    """The decoder registered as ``name``, or given as ``"module:attribute"`` (a plugin)."""
    spec = DECODERS.get(name, name if ":" in name else None)
    if spec is None:
        raise InputError(f"unknown decoder {name!r}; known decoders: {', '.join(DECODERS)} "
                         "(or give a class as 'module:attribute')")
    module_name, attr = spec.split(":")
    try:
        return getattr(importlib.import_module(module_name), attr)()
    except (ImportError, AttributeError) as err:
        raise InputError(f"decoder {name!r} cannot be loaded: {err}") from None


#: yielded by ``iter_frames(..., early=True)``: forget this item's frames so far, a second
#: pass follows (the container's frame count was wrong)
RESTART = "restart"


def _counted_frames(dec, path, choose, early: bool):
    """The frames ``choose(count)`` picks in a video of ``count`` frames, (the indices, the
    index decoding stops at or None), chosen from the container's count and checked against
    the frames that decode: where the true count picks others, a second pass takes those
    (:data:`RESTART` first where frames were yielded).  With ``early`` frames are yielded as
    they decode, else held back until the count is confirmed.  A pass that stops early leaves
    ``dec.counts`` None (the frames after it are not counted) or, after a first pass that
    found fewer frames than declared, that pass's counts."""
    guess = getattr(dec, "frame_count", lambda p: 0)(path)
    short = None
    for _ in range(2):
        chosen, stop = choose(guess)
        kept, total, streamed = [], 0, False
        frames = dec.frames(path, lambda i, t, c=chosen: i in c)
        try:
            for index, seconds, frame in frames:
                total = index + 1
                if frame is not None:
                    if early:
                        streamed = True
                        yield seconds, frame
                    else:
                        kept.append((seconds, frame))
                if stop is not None and total >= stop:
                    break
        finally:
            getattr(frames, "close", lambda: None)()
        if total == 0:
            raise RuntimeError("no decodable frames")
        stopped = stop is not None and total >= stop
        if stopped or choose(total)[0] == chosen:
            yield from kept
            if stopped and hasattr(dec, "counts"):
                dec.counts = short
            return
        counts = getattr(dec, "counts", None)
        if counts and counts[1] is not None and counts[0] < counts[1]:
            short = counts
        if streamed:
            yield RESTART
        guess = total  # the container's count was wrong: choose again from the true count
    raise RuntimeError(f"the number of decodable frames changed between two passes "
                       f"({guess} then {total})")


def iter_frames(path: str | os.PathLike, sampling: Sampling = Sampling(),
                decoder: str | Decoder = "opencv", early: bool = False, item_id: str = ""
                ) -> Iterator[tuple[float, np.ndarray]]:
    """(timestamp in seconds, RGB uint8 frame) of the sampled frames of a video or image.

    Raises ``FileNotFoundError``/``RuntimeError`` with a one-line cause; a video with no
    decodable frame is an error.  With ``early`` and ``frames=N`` or ``window=W`` sampling,
    frames chosen from the container's frame count are yielded as they decode, and
    :data:`RESTART` is yielded if that count proves wrong (the right frames follow); without
    it they are held back until the count is confirmed.  ``decoder`` is a name or a
    :class:`Decoder` (whose ``counts`` the caller can read afterwards); ``item_id`` seeds a
    window's first frame (:func:`window_start`).
    """
    sampling = sampling.validate()
    path = Path(path)
    if not path.exists():
        from featpipe.manifest import normalisation_note

        raise FileNotFoundError("file does not exist" + normalisation_note(path))
    if path.stat().st_size == 0:
        raise RuntimeError("empty file (0 bytes)")
    if is_image(path):
        yield 0.0, read_image(path)
        return
    dec = get_decoder(decoder) if isinstance(decoder, str) else decoder
    if sampling.frames is not None:
        wanted = int(sampling.frames)
        yield from _counted_frames(dec, path, lambda count: (
            set(evenly_spaced(count, wanted).tolist()), None), early)
        return
    if sampling.window is not None:
        window = int(sampling.window)

        def choose(count):
            start = window_start(item_id, count, window, sampling.window_seed)
            return range(start, start + window), start + window

        yield from _counted_frames(dec, path, choose, early)
        return
    if sampling.every is not None:
        def want(index, seconds):
            return index % sampling.every == 0
    elif sampling.fps is not None:
        period = 1.0 / sampling.fps
        state = {"next": 0.0}

        def want(index, seconds):
            # a tolerance of 1 µs absorbs the decoder's millisecond rounding
            if seconds + 1e-6 >= state["next"]:
                while state["next"] <= seconds + 1e-6:
                    state["next"] += period
                return True
            return False
    else:
        def want(index, seconds):
            return True
    kept = 0
    for _, seconds, frame in dec.frames(path, want):
        if frame is not None:
            kept += 1
            yield seconds, frame
    if kept == 0:
        raise RuntimeError("no decodable frames")


# -- the worker process ----------------------------------------------------------------------

class ItemJob(Protocol):
    """One item inside a worker: ``add`` each decoded frame (the return value, unless None,
    is sent to the parent; frames that return None are counted in a progress report every
    :data:`PROGRESS_PERIOD` seconds), ``restart`` forgets the frames so far (a second
    decoding pass follows), ``finish`` returns what is sent with the item's end, ``abort``
    cleans up; ``warning`` (optional) is said of the item when it is stored."""

    def add(self, frame: np.ndarray, seconds: float): ...

    def restart(self) -> None: ...

    def finish(self): ...

    def abort(self) -> None: ...


class WorkerProgram(Protocol):
    """What a decoding worker does with each item's frames; picklable, sent once to every
    worker process, where ``start(item_id)`` opens an :class:`ItemJob` per item."""

    def start(self, item_id: str) -> ItemJob: ...


class SendFrames:
    """The default program: every decoded RGB frame goes to the parent as it is."""

    def start(self, item_id: str) -> SendFrames:
        return self

    def add(self, frame, seconds):
        return frame

    def restart(self) -> None:
        pass

    def finish(self):
        return None

    def abort(self) -> None:
        pass


def read_ahead(iterable: Iterable, depth: int = 2) -> Iterator:
    """Iterate ``iterable`` in a background thread, ``depth`` values ahead of the consumer;
    its exceptions are raised here, and stopping early stops (and closes) it."""
    buffer: queue.Queue = queue.Queue(maxsize=max(1, depth))
    stop = threading.Event()
    done = object()

    def put(value) -> bool:
        while not stop.is_set():
            try:
                buffer.put(value, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def produce() -> None:
        iterator = iter(iterable)
        try:
            for value in iterator:
                if not put((True, value)):
                    return
            put((True, done))
        except BaseException as err:  # noqa: BLE001 - handed to the consumer
            put((False, err))
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()

    thread = threading.Thread(target=produce, name="featpipe-decode", daemon=True)
    thread.start()
    try:
        while True:
            ok, value = buffer.get()
            if not ok:
                raise value
            if value is done:
                return
            yield value
    finally:
        stop.set()
        thread.join()


_FFMPEG_LINE = re.compile(r"^\[[^\]]* @ (?:0x)?[0-9a-fA-F]+\] *(.+?)\s*$")


class _StderrLog:
    """The worker's fd 2 redirected to a temporary file: FFmpeg writes its decode errors
    there (never to the terminal), and they are read back per item."""

    def __init__(self):
        self.file = tempfile.TemporaryFile()
        os.dup2(self.file.fileno(), 2)

    def reset(self) -> None:
        os.ftruncate(2, 0)
        os.lseek(2, 0, os.SEEK_SET)

    def ffmpeg_messages(self) -> list[str]:
        text = os.pread(2, os.fstat(2).st_size, 0).decode("utf-8", "replace")
        found = (_FFMPEG_LINE.match(line) for line in text.splitlines())
        return [m.group(1) for m in found if m]


def lost_frames(counts: tuple | None, messages: list[str]) -> str | None:
    """Why frames are missing or damaged (decode errors, fewer frames than the container
    declares; one frame short is tolerated: containers round), or None.  ``counts`` is the
    decoder's (decoded, declared, last timestamp) (the timestamp may be missing)."""
    decoded, declared, stopped = (*counts, None)[:3] if counts else (None, None, None)
    of = (f"decoded {decoded} of the {declared} frames the container declares"
          if declared is not None and decoded is not None else "")
    if of and stopped is not None and decoded:
        of += f", stopping after frame {decoded - 1} at {stopped:.3f} s"
    if messages:
        return f"decode errors (FFmpeg: {messages[0]})" + (f"; {of}" if of else "")
    if of and declared - decoded > 1:
        return f"short read: {of} (truncated file?)"
    return None


def _first_line(err: BaseException) -> str:
    """:func:`featpipe.errors.describe_error`, but a missing file and the decoders' own
    one-line causes (bare RuntimeErrors) read without a type name."""
    if isinstance(err, FileNotFoundError):
        own = err.filename is None and err.args  # iter_frames's own, with its note
        return str(err.args[0]) if own else "file does not exist"
    text = str(err).strip()
    if type(err) is RuntimeError and text:
        return text.splitlines()[0]
    return describe_error(err)


def _decode_item(conn, request, decoder: str, program: WorkerProgram, log: _StderrLog) -> None:
    """Decode one item in the worker, run the program on its frames, report to the parent."""
    _, item_id, path, sampling, allow_partial = request
    log.reset()
    job = None
    try:
        dec = get_decoder(decoder)
        job = program.start(item_id)
        payloads, stamps = [], []
        reported = time.monotonic()
        for got in read_ahead(iter_frames(path, sampling, dec, early=True, item_id=item_id)):
            if got is RESTART:
                payloads, stamps = [], []
                job.restart()
                conn.send(("restart", item_id))
                continue
            seconds, frame = got
            payload = job.add(frame, seconds)
            stamps.append(seconds)
            if payload is not None:
                payloads.append(payload)
            if (len(stamps) == CHUNK_FRAMES if payload is not None  # None: progress only
                    else time.monotonic() - reported >= PROGRESS_PERIOD):
                conn.send(("frames", item_id, payloads, stamps))
                payloads, stamps = [], []
                reported = time.monotonic()
        if stamps:
            conn.send(("frames", item_id, payloads, stamps))
        problem = lost_frames(getattr(dec, "counts", None), log.ffmpeg_messages())
        if problem and not allow_partial:
            raise RuntimeError(f"{problem}; --allow-partial keeps the frames that decode")
        result = job.finish()
        warnings = [problem and f"frames lost: {problem}", getattr(job, "warning", None)]
        conn.send(("end", item_id, result, "; ".join(w for w in warnings if w) or None))
    except (BrokenPipeError, ConnectionError):
        raise
    except WriteError as err:  # the store cannot be written: no item's fault, the run stops
        if job is not None:
            job.abort()
        conn.send(("store-error", item_id, str(err)))
    except Exception as err:  # the parent turns it into an ItemError naming the file
        if job is not None:
            job.abort()
        text = _first_line(err)
        messages = log.ffmpeg_messages()
        if messages and "FFmpeg" not in text:
            text += f" (FFmpeg: {messages[0]})"
        conn.send(("error", item_id, text))


def _probe(path: str, decoder: str, log: _StderrLog) -> VideoInfo | str:
    """The container's :class:`VideoInfo` of a video or image, or the reason it has none
    (missing, a folder, empty, unreadable, not a video or image: with FFmpeg's own word)."""
    log.reset()
    try:
        file = Path(path)
        if not file.exists():
            from featpipe.manifest import normalisation_note

            return "file does not exist" + normalisation_note(file)
        if file.is_dir():
            return "a folder, not a file"
        if file.stat().st_size == 0:
            return "empty file (0 bytes)"
        with open(file, "rb"):
            pass
        if is_image(file):
            height, width = read_image(file).shape[:2]
            return VideoInfo(1, 0.0, height, width)
        info = getattr(get_decoder(decoder), "info", None)
        return info(file) if info is not None else VideoInfo(None, 0.0, 0, 0)
    except OSError as err:
        return f"cannot read it ({err.strerror or _first_line(err)})"
    except Exception as err:
        text, messages = _first_line(err), log.ffmpeg_messages()
        return text + (f" (FFmpeg: {messages[0]})" if messages and "FFmpeg" not in text
                       else "")


def header_problems(manifest, decoder: str = "opencv") -> list:
    """A :class:`featpipe.manifest.Problem` for each existing file of ``manifest`` that
    cannot be what extraction reads: an empty file, and for videos and images (by their
    extension) one that cannot be read or opened (no video stream, a damaged header), as
    decoding workers probe them (:meth:`DecodePool.probe`: a file that crashes or hangs the
    decoder costs only its answer).  Missing files are :meth:`Manifest.check`'s."""
    from featpipe.backend import available_cores
    from featpipe.datasets import VIDEO_EXTENSIONS
    from featpipe.manifest import Problem

    rows: dict[str, list] = {}
    for item in manifest:
        path = manifest.resolve_path(item) if item.path else None
        if path is None or not path.exists():
            continue
        media = path.suffix.lower() in VIDEO_EXTENSIONS or is_image(path)
        if media or (path.is_file() and path.stat().st_size == 0):
            rows.setdefault(str(path), []).append(item)
    media = [p for p in rows if Path(p).suffix.lower() in VIDEO_EXTENSIONS or is_image(p)]
    reasons = {p: "empty file (0 bytes)" for p in rows if p not in media}
    if media:
        with DecodePool(min(len(media), available_cores(), 4), decoder) as pool:
            reasons.update((p, r) for p, r in pool.probe(media).items() if isinstance(r, str))
    return [Problem(item.line, f"file {item.path!r} of {item.id!r}: {reasons[path]}")
            for path, items in rows.items() if path in reasons for item in items]


def _worker_main(conn, decoder: str) -> None:  # pragma: no cover - runs in the child process
    """Child loop: ``("program", p)`` sets the program, ``("probe", path)`` answers a
    :class:`VideoInfo`, ``("item", id, path, sampling, allow_partial)`` decodes an item;
    ``None`` or a closed connection (the parent is gone) ends it."""
    import cv2

    cv2.setNumThreads(1)
    signal.signal(signal.SIGINT, signal.SIG_IGN)  # the parent handles interrupts, kills us
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    log = _StderrLog()
    program: WorkerProgram = SendFrames()
    try:
        while True:
            request = conn.recv()
            if request is None:
                return
            if request[0] == "program":
                program = request[1]
            elif request[0] == "probe":
                conn.send(("probe", request[1], _probe(request[1], decoder, log)))
            else:
                _decode_item(conn, request, decoder, program, log)
    except (EOFError, OSError):
        return
    except Exception as err:  # e.g. a program that cannot be unpickled: say why, then die
        conn.send(("crashed", _first_line(err)))
        raise


def _exit_now() -> None:  # pragma: no cover - runs in the child process
    """End a worker whose loop returned: exit handlers run (coverage's among them) and the
    streams are flushed, but not the interpreter's teardown, which frees every module and
    numba's objects one by one (0.15-0.25 s of CPU); the normal exit while a thread runs."""
    if threading.active_count() > 1:
        return
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except (OSError, ValueError):
            pass
    os._exit(0)


#: a worker's first young-generation collection after this many allocations, not 700:
#: its start-up makes about a million long-lived objects (numpy, OpenCV, numba's types and
#: its kernels' loading), which 270 collections at 700 went through (0.1 s of CPU)
WORKER_GC_THRESHOLD = 10_000


class DecodeWorker:
    """One decoding process (a fresh interpreter running :func:`_worker_main`), restarted
    when it dies or is killed; ``item`` is the item it decodes (None when idle)."""

    def __init__(self, decoder: str = "opencv", timeout: float = 600.0):
        self.decoder = decoder
        self.timeout = timeout
        self.process: subprocess.Popen | None = None
        self.conn: Connection | None = None
        self.item: tuple[str, str] | None = None  # (id, path) in flight
        self.deadline = 0.0
        self.program = None  # the program the process has

    @property
    def pid(self) -> int | None:
        return None if self.process is None else self.process.pid

    def alive(self) -> bool:
        return self.process is not None and self.process.poll() is None

    def start(self, program: WorkerProgram | None = None) -> None:
        """Start the process if needed; hand it ``program`` unless it has it."""
        if self.alive():
            if program is not None and program is not self.program:
                try:
                    self.conn.send(("program", program))
                except (OSError, ValueError):  # it died: the next poll reports it
                    return
                self.program = program
            return
        self.kill()
        # A fresh interpreter (not fork: torch and BLAS threads do not survive it; not
        # multiprocessing's spawn: it re-imports the caller's __main__ script) on one end of a
        # socket pair, with the caller's import path so plugin decoders import as they do
        # here, and never from the working folder (featpipe.processes).
        from featpipe.processes import child_environment, python_command

        parent, child = socket.socketpair()
        code = (f"import gc, sys; gc.set_threshold({WORKER_GC_THRESHOLD}); "
                "from multiprocessing.connection import Connection; "
                "from featpipe.io.video import _exit_now, _worker_main; "
                f"_worker_main(Connection({child.fileno()}), sys.argv[1]); _exit_now()")
        env = child_environment()
        # one decoding thread: the workers run beside the model, which wants the cores
        env.setdefault("OPENCV_FFMPEG_CAPTURE_OPTIONS", "threads;1")
        self.process = subprocess.Popen(python_command("-c", code, self.decoder),
                                        pass_fds=[child.fileno()], env=env,
                                        stdin=subprocess.DEVNULL)
        child.close()
        self.conn = Connection(parent.detach())
        self.program = None
        if program is not None:
            self.conn.send(("program", program))
            self.program = program

    def send(self, request) -> None:
        self.conn.send(request)
        self.deadline = time.monotonic() + self.timeout

    def close(self) -> None:
        """Stop the process politely (it finishes nothing), then by force."""
        if self.process is None:
            return
        try:
            self.conn.send(None)
        except (OSError, ValueError):
            pass
        try:
            self.process.wait(timeout=2)
        except subprocess.TimeoutExpired:
            pass
        self.kill()

    def kill(self) -> None:
        """Kill the process now (an item in flight is abandoned)."""
        if self.process is not None:
            if self.process.poll() is None:
                self.process.kill()
            self.process.wait()
        if self.conn is not None:
            self.conn.close()
        self.process = self.conn = self.item = self.program = None


class DecodePool:
    """N decoding worker processes fed from one queue of items, their messages multiplexed.

    ``submit`` queues items; ``poll(timeout)`` hands queued items to idle workers and returns
    the messages that arrived, as tuples::

        ("frames", id, payloads, timestamps)   # the program's payloads, frames' timestamps
        ("restart", id)                        # forget the item's frames so far
        ("end", id, result, warning)           # the program's result; warning: frames lost,
                                               # the job's own (no rows at all)
        ("error", id, ItemError, pid)          # the item failed in worker ``pid``
        ("store-error", id, WriteError, pid)   # the store cannot be written (disk full)

    ``timeout`` is the time limit in seconds a worker may go without a message while it has
    an item: past it the worker is killed and its item fails (the next one gets a fresh
    process).  A worker that crashes fails its item the same way.
    """

    def __init__(self, workers: int = 1, decoder: str = "opencv", timeout: float = 600.0,
                 program: WorkerProgram | None = None):
        self.workers = [DecodeWorker(decoder, timeout) for _ in range(max(1, int(workers)))]
        self.program = program
        self.queue: deque = deque()

    def __enter__(self) -> DecodePool:
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def submit(self, items: Iterable[tuple[str, str | os.PathLike]], sampling: Sampling,
               allow_partial: bool = False) -> None:
        """Queue ``(id, path)`` items for decoding with ``sampling``."""
        for item_id, path in items:
            self.queue.append(("item", item_id, str(path), sampling, allow_partial))

    @property
    def busy(self) -> bool:
        """Items are queued or in flight."""
        return bool(self.queue) or any(w.item is not None for w in self.workers)

    def in_flight(self) -> dict[str, int]:
        """Item id -> pid of the worker decoding it."""
        return {w.item[0]: w.pid for w in self.workers if w.item is not None}

    def _dispatch(self) -> None:
        for worker in self.workers:
            if worker.item is None and self.queue:
                request = self.queue.popleft()
                worker.start(self.program)  # (kill() of a dead process clears ``item``)
                worker.item = (request[1], request[2])
                try:
                    worker.send(request)
                except (OSError, ValueError):  # it died at start: the poll reports it
                    worker.deadline = 0.0

    def _failure(self, worker: DecodeWorker, cause: str) -> tuple:
        item_id, path = worker.item
        pid = worker.pid
        worker.kill()
        return ("error", item_id, ItemError(item_id, f"{path}: {cause}"), pid)

    def poll(self, timeout: float | None = None, wake: Sequence = ()) -> list[tuple]:
        """Messages that arrived within ``timeout`` seconds (None: wait for one); the wait
        also ends when one of ``wake`` (file descriptors, connections) becomes readable."""
        self._dispatch()
        active = [w for w in self.workers if w.item is not None]
        if not active and not wake:
            return []
        if active:
            limit = max(0.0, min(w.deadline for w in active) - time.monotonic())
            timeout = limit if timeout is None else min(timeout, limit)
        ready = set(wait([w.conn for w in active] + list(wake), timeout))
        events = []
        for worker in active:
            if worker.conn in ready:
                events += self._receive(worker)
            elif time.monotonic() >= worker.deadline:
                events.append(self._failure(worker, f"no frame within the {worker.timeout:g} "
                                                    "s time limit (decoder killed)"))
        self._dispatch()
        return events

    def _receive(self, worker: DecodeWorker) -> list[tuple]:
        events = []
        while worker.item is not None and worker.conn.poll(0):
            try:
                message = worker.conn.recv()
            except (EOFError, OSError):
                worker.process.wait()
                code = worker.process.returncode
                events.append(self._failure(worker, f"decoder crashed (exit code {code})"))
                break
            worker.deadline = time.monotonic() + worker.timeout
            if message[0] == "crashed":
                events.append(self._failure(worker, f"decoding worker failed: {message[1]}"))
                break
            if message[0] == "error":
                item_id, path = worker.item
                events.append(("error", item_id, ItemError(item_id, f"{path}: {message[2]}"),
                               worker.pid))
                worker.item = None
            elif message[0] == "store-error":
                events.append(("store-error", worker.item[0], WriteError(message[2]),
                               worker.pid))
                worker.item = None
            else:
                if message[0] == "end":
                    worker.item = None
                events.append(message)
        return events

    def probe(self, paths: Iterable[str]) -> dict[str, VideoInfo | str]:
        """The :class:`VideoInfo` (or the reason it is missing) of each path, the workers
        probing in parallel; call it while no item is queued or in flight."""
        todo, found = deque(dict.fromkeys(str(p) for p in paths)), {}
        asked: dict[DecodeWorker, str] = {}
        while todo or asked:
            for worker in self.workers:
                if worker not in asked and todo:
                    worker.start()
                    asked[worker] = todo.popleft()
                    worker.send(("probe", asked[worker]))
            limit = max(0.0, min(w.deadline for w in asked) - time.monotonic())
            ready = wait([w.conn for w in asked], limit)
            for worker in list(asked):
                if worker.conn in ready:
                    try:
                        _, path, info = worker.conn.recv()
                    except (EOFError, OSError):
                        path, info = asked[worker], "decoder crashed while probing"
                        worker.kill()
                elif time.monotonic() >= worker.deadline:
                    path = asked[worker]
                    info = f"no answer within the {worker.timeout:g} s time limit (killed)"
                    worker.kill()
                else:
                    continue
                found[path] = info
                del asked[worker]
        return found

    def kill(self) -> None:
        """Kill every worker now."""
        for worker in self.workers:
            worker.kill()
        self.queue.clear()

    def close(self) -> None:
        """Stop every worker (politely when idle)."""
        for worker in self.workers:
            if worker.item is None:
                worker.close()
            else:
                worker.kill()
        self.queue.clear()
