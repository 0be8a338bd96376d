"""Progress display and verbosity: count, rate and ETA; -q, -v, -vv the same for every command.

The terminal form is tested on a StatusBoard with a fake clock and a list as its stream (a
test process has no terminal); the log-file form and the verbosity levels through real
subprocesses, whose stderr is a pipe exactly as in a SLURM log.
"""

import logging
from pathlib import Path

import numpy as np
import pytest

from featpipe.progress import RATE_WINDOW_S, RateEstimate, format_duration
from featpipe.progress_line import StatusBoard, format_clock
from tests.conftest import run_cli


class FakeClock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def board(tty, verbosity=0, interval=10.0):
    clock, out = FakeClock(), []
    return StatusBoard(tty, verbosity, interval=interval, write=out.append, clock=clock), \
        clock, out


def test_durations_and_clock_format():
    assert format_duration(45.4) == "45 s"
    assert format_duration(82) == "1 min 22 s"
    assert format_duration(7380) == "2 h 03 min"
    assert format_duration(0.4) == "less than 1 s"
    assert format_clock(12) == "0:12" and format_clock(3723) == "1:02:03"


def test_terminal_line_counts_every_item_with_rate_and_eta():
    status, clock, out = board(tty=True)
    progress = status.open(80, "encode", "items")
    for _ in range(32):
        clock.now += 0.25  # 4 items/s, one update per item
        progress.advance(1)
    drawn = [text for text in out if text.startswith("\r")]
    assert len(drawn) == 32  # updates 0.25 s apart: every one is drawn
    last = drawn[-1]
    assert "encode [" in last and "32/80 items" in last
    assert "4 items/s" in last and "ETA 0:12" in last  # 48 left at 4/s
    progress.close()
    assert out[-1] == "\n" and "32/80 items" in out[-2]  # the final state stays on screen


def test_terminal_redraws_at_most_ten_times_a_second_and_shares_the_line():
    status, clock, out = board(tty=True)
    items = status.open(8, "extract", "items")
    frames = status.open(None, "frames", "frames")
    for _ in range(100):
        clock.now += 0.01
        frames.advance(3)
    assert 9 <= len([t for t in out if t.startswith("\r")]) <= 11
    clock.now += 5.0  # past the warm-up, which the ETA ignores
    items.advance(1)
    clock.now += 2.0
    items.advance(1)
    clock.now += 0.2
    frames.advance(3)
    line = out[-1]
    assert "extract [" in line and "2/8 items" in line and " | frames  303 frames" in line
    assert "ETA" in line.split(" | ")[0] and "ETA" not in line.split(" | ")[1]  # no total
    status.print_above("INFO something")
    assert out[-3:-1] == ["\r\x1b[K", "INFO something\n"] and out[-1].startswith("\r")
    frames.close()
    items.close()


def test_log_file_lines_at_v_every_interval_and_a_final_line():
    status, clock, out = board(tty=False, verbosity=1, interval=10.0)
    progress = status.open(100, "encode fc6", "items")
    for _ in range(100):
        clock.now += 0.5
        progress.advance(1)
    progress.close()
    lines = [text.rstrip("\n") for text in out]
    assert len(lines) == 5  # at 10, 20, 30, 40 s, then the final line (not "100/100" twice)
    assert lines[0] == "progress: encode fc6 20/100 items (20%), 2 items/s, about 40 s left"
    assert lines[-1] == "progress: encode fc6 100/100 items in 50 s (2 items/s)"
    quiet, clock, out = board(tty=False, verbosity=0)
    progress = quiet.open(10, "encode", "items")
    progress.advance(10)
    progress.close()
    assert out == []
    debug, clock, out = board(tty=False, verbosity=2)
    progress = debug.open(None, "frames", "frames")
    clock.now += 2
    progress.advance(60)
    progress.advance(60)
    progress.close()
    assert out == ["progress: frames 60 frames, 30 frames/s\n",
                   "progress: frames 120 frames, 60 frames/s\n",
                   "progress: frames 120 frames in 2 s (60 frames/s)\n"]


def test_the_rate_is_the_work_of_the_last_30_s_and_a_stall_lowers_it():
    start = 0.0
    estimate = RateEstimate(start)
    assert estimate.rate(1.0) is None and estimate.eta(1.0, 100) is None  # nothing done yet
    t = 0.0
    while t < 60.0 - 1e-9:  # 50 units/s for a minute
        t += 0.5
        estimate.add(25, t)
    assert estimate.rate(t) == pytest.approx(50.0, rel=1e-12)
    for _ in range(20):  # then 20 units/s for 10 s: 20 s at 50 and 10 s at 20 in the window
        t += 0.5
        estimate.add(10, t)
    assert estimate.rate(t) == pytest.approx((20 * 50 + 10 * 20) / RATE_WINDOW_S, rel=1e-12)
    for _ in range(40):
        t += 0.5
        estimate.add(10, t)
    assert estimate.rate(t) == pytest.approx(20.0, rel=1e-12)  # the old rate left the window
    # nothing for 30 s more: read then, the rate counts the stall (the last update's work over
    # the time since the update before it)
    assert estimate.rate(t + RATE_WINDOW_S) == pytest.approx(10 / (RATE_WINDOW_S + 0.5))
    assert estimate.eta(t, estimate.done + 100) == pytest.approx(100 / 20.0, rel=1e-12)


def test_a_burst_right_after_the_start_is_no_spike_of_the_rate():
    """Issue 40: a terminal line read 634 frames/s where the rate was about 120: the old
    smoothed rate took its first value from two updates a moment apart.  Now a burst counts
    over the time since the start (or the last 30 s), whatever the time between updates."""
    estimate = RateEstimate(0.0)
    estimate.add(16, 2.0)
    estimate.add(16, 2.01)  # a second batch 10 ms later
    assert estimate.rate(2.01) == pytest.approx(32 / 2.01)  # not 16 / 0.01 = 1,600
    for k in range(1, 200):  # then 8 frames every 0.1 s: 80 frames/s
        estimate.add(8, 2.01 + 0.1 * k)
    assert estimate.rate(2.01 + 19.9) == pytest.approx((32 + 199 * 8) / 21.91)
    assert estimate.rate(2.01 + 19.9 + 40) == pytest.approx(8 / 40.1)  # a stall of 40 s


def test_sparse_items_keep_a_rate_between_their_updates():
    """Items a minute apart: the rate spans at least the last update's work."""
    estimate = RateEstimate(0.0)
    estimate.add(1, 60.0)
    estimate.add(1, 120.0)
    assert estimate.rate(120.0) == pytest.approx(1 / 60)
    assert estimate.rate(150.0) == pytest.approx(1 / 90)  # the last item over 90 s
    assert estimate.eta(150.0, 4) == pytest.approx(2 * 90)


class _SlowModel:
    """A model that takes ``seconds`` per crop; it records when each batch came out."""

    device = "cpu"

    def __init__(self, seconds: float):
        import threading

        self.seconds = seconds
        self.out: list[tuple[float, int]] = []  # (time, frames out so far)
        self.lock = threading.Lock()

    def forward_crops(self, crops):
        import time

        time.sleep(self.seconds * len(crops))
        with self.lock:
            self.out.append((time.monotonic(), len(crops) + (self.out[-1][1] if self.out
                                                             else 0)))
        return crops.float().mean(dim=(1, 2)).numpy()

    def frames_out(self, when: float) -> int:
        with self.lock:
            return max((n for t, n in self.out if t <= when), default=0)


def test_the_rate_is_the_models_not_the_decoders(tmp_path):
    """Issue 40: behind a slow model (VGG-16 at 0.41 frames/s) the first progress line said
    31.3 frames/s, about 9 s left, at 16 %: frames were counted as the decoders read them
    ahead.  A model at 25 frames/s behind decoders far faster: every line's count is at most
    the frames out of the model when it was printed, and its rate at most the model's."""
    import re
    import time

    pytest.importorskip("torch")
    from featpipe.extract.streaming import CropProgram, Extraction, FrameSinks, Network
    from featpipe.extract.vgg import VGGPreprocess
    from featpipe.io.video import DecodePool, Sampling
    from featpipe.manifest import Manifest
    from featpipe.store import Store
    from tests.cli.test_extract_cli import write_manifest
    from tests.unit.test_video import write_video

    paths = {f"v{k}": str(write_video(tmp_path / f"v{k}.mp4", n_frames=8, size=(64, 48)))
             for k in range(6)}
    manifest = Manifest.read(write_manifest(tmp_path, [(i, p, "a", "train")
                                                       for i, p in paths.items()]))
    stage = Store(tmp_path / "s").stage("extract", {"test": "rate"}, items=manifest)
    model, prep = _SlowModel(0.04), VGGPreprocess(40, 32)
    lines: list[tuple[float, str]] = []
    status = StatusBoard(False, 2, interval=0.0,
                         write=lambda text: lines.append((time.monotonic(), text)))
    with DecodePool(2, program=CropProgram(prep)) as pool:
        extraction = Extraction(stage, pool, Sampling(), FrameSinks(str(stage.path),
                                                                    local=False),
                                network=Network(model, prep, 4))
        with status.open(48, "extract", "frames") as display:
            extraction.on_frames = display.advance
            assert all(error is None for _, error in extraction.run(list(paths.items())))
    shown = [(when, re.match(r"progress: extract (\d+)/48 frames \(\d+%\)(?:, ([0-9.,]+) "
                             r"frames/s)?", text)) for when, text in lines[:-1]]
    assert len(shown) >= 6 and all(found for _, found in shown)
    for when, found in shown:
        assert int(found.group(1)) <= model.frames_out(when), (found.group(0), model.out)
        if found.group(2):
            assert float(found.group(2).replace(",", "")) <= 1.5 / model.seconds, \
                found.group(0)
    assert lines[-1][1].startswith("progress: extract 48/48 frames in ")


@pytest.mark.parametrize("tty", [True, False])
def test_a_finished_run_ends_at_100_percent_with_the_real_total(tty):
    """Issue 23: 5,000 frames declared (estimated before decoding), 4,910 decoded: the run
    ends at 100 % with 4,910 and names the declared total; an interrupted run does not."""
    status, clock, out = board(tty=tty, verbosity=1)
    with status.open(5000, "extract", "frames") as progress:
        for _ in range(491):
            clock.now += 0.1
            progress.advance(10)
    if tty:
        assert "100%  4,910/4,910 frames" in out[-2] and out[-1] == "\n"
    else:
        assert out[-1] == "progress: extract 4,910/4,910 frames in 49 s (100 frames/s; " \
                          "5,000 declared)\n"
    status, clock, out = board(tty=tty, verbosity=1)
    with pytest.raises(KeyboardInterrupt), status.open(5000, "extract", "frames") as progress:
        clock.now += 1.0
        progress.advance(4910)
        raise KeyboardInterrupt
    assert "4,910/5,000 frames" in (out[-2] if tty else out[-1])
    assert "declared" not in "".join(out)


@pytest.fixture
def ts_store(tmp_path):
    """A store path and aeon's GunPoint files (real; 50 train + 150 test series)."""
    aeon = pytest.importorskip("aeon")
    data = Path(aeon.__file__).parent / "datasets" / "data" / "GunPoint"
    return tmp_path / "store", [data / "GunPoint_TRAIN.ts", data / "GunPoint_TEST.ts"]


def test_verbosity_levels_are_the_same_for_every_command(tmp_path, ts_store):
    store, (train, test) = ts_store
    base = ("import", "--from", train, "--from", test, "--store", store)
    default = run_cli(*base, "--name", "gp")
    assert "summary: 200 done" in default.stdout
    assert "progress:" not in default.stderr and "INFO" not in default.stderr
    verbose = run_cli("-v", *base, "--name", "gp", "--force")
    assert "progress: import gp 200/200 items in" in verbose.stderr
    assert "featpipe.stages.imports: source" in verbose.stderr  # log lines at -v
    assert "summary: 200 done" in verbose.stdout
    # -q: errors only on stderr, the results stay on stdout
    for args in [("-q", *base, "--name", "gp", "--force"),
                 ("-q", "encode", "--store", store, "--input", "gp", "--method", "avg",
                  "--name", "avg"),
                 ("-q", "classify", "--store", store, "--input", "avg"),
                 ("-q", "manifest", "check", store / "stages" / next(
                     p.name for p in (store / "stages").iterdir() if p.name.startswith(
                         "import")) / "items.csv", "--no-files")]:
        proc = run_cli(*args)
        assert proc.stderr == "", (args, proc.stderr)
        assert proc.stdout.strip(), args
    failed = run_cli("-q", "encode", "--store", store, "--input", "nope", "--method", "avg",
                     "--name", "x", check=False)
    assert failed.returncode == 1 and failed.stderr.startswith("error: no stage named 'nope'")
    both = run_cli("-q", "-v", "cache", "ls", "--store", store, check=False)
    assert both.returncode == 2 and "exclude each other" in both.stderr


def test_fit_gmm_logs_em_iterations_with_the_objective_at_v(tmp_path):
    rng = np.random.default_rng(0)
    folder = tmp_path / "npy"
    folder.mkdir()
    rows = ["id,path,label,split1"]
    for i in range(6):
        np.save(folder / f"i{i}.npy", rng.normal(size=(200, 4)).astype(np.float32))
        rows.append(f"i{i},,{'ab'[i % 2]},{'train' if i < 4 else 'test'}")
    manifest = tmp_path / "m.csv"
    manifest.write_text("\n".join(rows) + "\n")
    store = tmp_path / "store"
    run_cli("import", "--manifest", manifest, "--from", folder, "--store", store, "--name", "d")
    fit = ("fit", "gmm", "--store", store, "--input", "d", "--components", 3, "--name", "g")
    silent = run_cli(*fit)
    assert "EM iteration" not in silent.stderr
    verbose = run_cli("-v", *fit, "--force")
    lines = [line for line in verbose.stderr.splitlines() if "EM iteration" in line]
    assert lines and "featpipe.encode.fisher: EM iteration 1/100: mean log-likelihood" in \
        lines[0]
    assert "initialising K=3 by kmeans on 800 descriptors" in verbose.stderr


def test_deep_gmm_and_gmsop_log_their_iterations(caplog):
    from featpipe.encode.fisher import GaussianMixtureModel
    from featpipe.learn.deep_fisher import DeepFisherKernel
    from featpipe.learn.gmsop import GatedMixtureSOP

    rng = np.random.default_rng(0)
    sets = [rng.normal(size=(30, 3)) + (i % 2) for i in range(12)]
    labels = np.array(["a", "b"] * 6)
    gmm = GaussianMixtureModel(2, random_state=0).fit(np.concatenate(sets))
    with caplog.at_level(logging.INFO, logger="featpipe"):
        DeepFisherKernel(max_iter=2, subsample=1.0).fit(
            sets[:8], labels[:8], sets[8:], labels[8:],
            (gmm.weights_, gmm.means_, gmm.variances_))
        GatedMixtureSOP(n_components=2, top_k=1, dim=2, epochs=2, batch_size=4).fit(
            [rng.normal(size=(5, 3)).astype(np.float32) for _ in range(8)], labels[:8])
    messages = [r.getMessage() for r in caplog.records]
    assert any(m.startswith("iteration 1/2: objective ") for m in messages), messages
    assert [m.split(":")[0] for m in messages if m.startswith("epoch")] == ["epoch 1/2",
                                                                             "epoch 2/2"]


def test_a_real_terminal_shows_count_rate_and_percentage(tmp_path, ts_store):
    from tests.cli.test_cli import run_with_tty_stderr

    store, (train, test) = ts_store
    code, stdout, terminal = run_with_tty_stderr(
        ["import", "--from", train, "--from", test, "--store", store, "--name", "gp"])
    assert code == 0 and "summary: 200 done" in stdout
    assert "import gp [" in terminal and "100%  200/200 items" in terminal
    assert "items/s" in terminal


def test_the_demo_shows_each_stages_progress(tmp_path):
    """Issue 23: the demo's stages (VGG-16's extract among them) report progress through
    the command line's progress line; here an encode stage's, counted in full."""
    from featpipe.demo.runner import Runner
    from featpipe.manifest import from_rows
    from featpipe.store import Store

    store = Store(tmp_path / "demo" / "store")
    ids = [f"s{i}" for i in range(5)]
    stage = store.stage("import", {"n": 5},
                        items=from_rows([(i, "", ["a"], ["train"]) for i in ids], tmp_path))
    for i in ids:
        stage.write_item(i, np.ones((4, 3), np.float32))
    store.set_name("seq", stage)
    status, clock, out = board(tty=False, verbosity=1)
    opened = []

    def progress(total, label, unit="items"):
        opened.append((total, label, unit))
        return status.open(total, label, unit)

    Runner(tmp_path / "demo", echo=lambda text: None, progress=progress).encode(
        "seq", "avg", "seq-avg")
    assert opened == [(5, "encode seq-avg", "items")]
    assert out[-1].startswith("progress: encode seq-avg 5/5 items in ")


def test_more_units_than_declared_stay_at_100_percent_in_both_forms():
    """A video that decodes more frames than its container declared: 12 of 10."""
    status, clock, _ = board(tty=False)
    frames = status.open(10, "extract", "frames")
    clock.now += 1.0
    frames.advance(12)
    assert frames.plain(clock.now).startswith("extract 12/10 frames (100%)")
    assert "100%" in frames.line(clock.now)
    frames.close()


def test_off_a_terminal_progress_lines_come_by_default_every_30_s_and_a_last_one(
        monkeypatch):
    """Issue 30: off a terminal (a SLURM log, ``> out.txt``) a long step printed nothing
    without ``-v``.  By default: a line every 30 s and a last one; a step shorter than that
    prints none (its summary line says it all)."""
    monkeypatch.delenv("FEATPIPE_PROGRESS_INTERVAL", raising=False)
    clock, out = FakeClock(), []
    status = StatusBoard(False, 0, write=out.append, clock=clock)
    frames = status.open(100, "extract fc6", "frames")
    for _ in range(100):
        clock.now += 1.0  # one frame a second: 100 s
        frames.advance(1)
    frames.close()
    assert [line.split(" (")[0] for line in out] == [
        "progress: extract fc6 30/100 frames", "progress: extract fc6 60/100 frames",
        "progress: extract fc6 90/100 frames", "progress: extract fc6 100/100 frames in 1 min "
        "40 s"]
    quick = status.open(10, "encode", "items")
    for _ in range(10):
        clock.now += 1.0
        quick.advance(1)
    quick.close()
    assert len(out) == 4  # 10 s: no line


def test_off_a_terminal_default_progress_lines_and_q_silences_them(tmp_path):
    """The same through a real command whose stderr is a pipe (interval 0: every update)."""
    from tests.cli.test_cli import import_args

    args = import_args(tmp_path, n=3)
    env = {"FEATPIPE_PROGRESS_INTERVAL": "0"}
    default = run_cli(*args, env=env)
    assert default.stderr.splitlines()[-1].startswith("progress: import feat 3/3 items in ")
    assert run_cli(*args, "--force", "-q", env=env).stderr == ""
