"""``featpipe extract --features dt|idt`` from the command line: the generated options
(``--descriptors``, ``--track-length``, ``--human-boxes``), the dry run, a SIGKILLed run
finished by the same command (its items equal an uninterrupted run's), and the real idt
tracker given human boxes."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import numpy as np

from featpipe.store import Store
from tests._avi import write_avi
from tests.cli.test_extract_cli import write_manifest
from tests.cli.test_extract_interrupt import environment
from tests.stages.test_extract_trajectories import SMALL, write_clips

OPTIONS = [f"--{k.replace('_', '-')}={v}" for k, v in SMALL.items()]


def test_options_and_dry_run(tmp_path, cli):
    ids = write_clips(tmp_path)
    manifest = write_manifest(tmp_path, [(i, f"{i}.avi", i, "train") for i in ids])
    assert "dense trajectories" in cli("extract", "--help").output
    helped = cli("extract", "--features", "idt", "--help")
    assert "--descriptors TEXT" in helped.output and "--human-boxes" in helped.output
    assert "--keypoints" in helped.output
    dry = cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "idt", *OPTIONS,
              "--descriptors", "hog,hof,mbh", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "would compute carphone: 10 frames -> 10 sampled" in dry.output
    assert not (tmp_path / "s").exists()
    run = cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "idt", *OPTIONS,
              "--descriptors", "hog,hof,mbh", "-n", "t")
    assert run.exit_code == 0, run.output
    assert "summary: 2 done, 0 skipped (already complete), 0 failed" in run.output
    bad = cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "dt", "--human-boxes",
              tmp_path)
    assert bad.exit_code == 2
    assert "error: --human-boxes applies to methods that estimate the camera motion (idt), " \
        "not dt" in bad.output


def test_human_boxes_reach_the_improved_tracker(tmp_path, cli):
    """A box over the whole frame leaves the homography no match: the trajectories differ
    from those without boxes (camera motion is then not removed), and the key too."""
    ids = write_clips(tmp_path)
    manifest = write_manifest(tmp_path, [(i, f"{i}.avi", i, "train") for i in ids])
    boxes = tmp_path / "boxes"
    boxes.mkdir()
    (boxes / "carphone.bb").write_text("")
    (boxes / "motion.bb").write_text("".join(f"{k} 0 0 127 95 1.0\n" for k in range(10)))
    args = ("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "idt", *OPTIONS)
    assert cli(*args, "-n", "plain").exit_code == 0
    boxed = cli(*args, "--human-boxes", boxes, "-n", "boxed")
    assert boxed.exit_code == 0, boxed.output
    store = Store(tmp_path / "s")
    plain, with_boxes = store.resolve("plain"), store.resolve("boxed")
    assert plain.name != with_boxes.name and len(with_boxes.params["human_boxes"]) == 16
    np.testing.assert_array_equal(plain.read_item("carphone"), with_boxes.read_item("carphone"))
    assert not np.array_equal(plain.read_item("motion"), with_boxes.read_item("motion"))


ITEMS = 5


def command(folder):
    return [sys.executable, "-m", "featpipe", "extract", "-m", str(folder / "manifest.csv"),
            "-s", str(folder / "store"), "-f", "dt", *OPTIONS, "--decoder",
            "tests.cli.test_extract_interrupt:SlowDecoder", "-n", "raw"]


def test_a_sigkilled_extract_is_finished_by_the_same_command(tmp_path):
    from featpipe.demo.motion import render_clip

    rng = np.random.default_rng(2)
    for k in range(ITEMS):
        clip = render_clip(("left", "right", "towards", "away")[k % 4], rng, frames=20)
        write_avi(tmp_path / f"v{k}.avi", list(np.ascontiguousarray(clip[..., ::-1])), 12)
    write_manifest(tmp_path, [(f"v{k}", f"v{k}.avi", "a", "train") for k in range(ITEMS)])
    proc = subprocess.Popen(command(tmp_path), env=environment(), cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            start_new_session=True)
    store, stage = Store(tmp_path / "store"), None
    deadline = time.monotonic() + 240
    while time.monotonic() < deadline:  # one item done, the next begun
        found = store.all_stages()
        stage = found[0] if found else None
        if stage is not None and stage.done_ids() and list(stage.path.rglob("*.tmp.*")):
            break
        time.sleep(0.05)
    assert stage is not None and stage.done_ids(), "no item finished in time"
    os.killpg(proc.pid, signal.SIGKILL)
    proc.communicate(timeout=60)
    done = len(stage.done_ids())
    assert 1 <= done < ITEMS
    again = subprocess.run(command(tmp_path), env=environment(), cwd=tmp_path,
                           capture_output=True, text=True, timeout=600)
    assert again.returncode == 0, again.stderr
    assert f"{ITEMS - done} done, {done} skipped" in again.stdout
    assert stage.is_complete()
    fresh = subprocess.run([*command(tmp_path)[:-2], "-s", str(tmp_path / "fresh")],
                           env=environment(), cwd=tmp_path, capture_output=True, text=True,
                           timeout=600)
    assert fresh.returncode == 0, fresh.stderr
    other = Store(tmp_path / "fresh").all_stages()[0]
    for k in range(ITEMS):
        np.testing.assert_array_equal(stage.read_item(f"v{k}"), other.read_item(f"v{k}"))


def test_grouped_models_from_the_command_line(tmp_path, cli):
    """sample -> fit gmm --groups (one PCA and GMM per group) -> streamed per-frame grouped FVs
    -> one group's part -> rank pooling, as the recipe's steps run them."""
    ids = write_clips(tmp_path)
    manifest = write_manifest(tmp_path, [(i, f"{i}.avi", i, "train") for i in ids])
    extract = ("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "idt", *OPTIONS,
               "--descriptors", "hog,hof,mbh")
    steps = [(*extract, "--sample-descriptors", 400, "-n", "sample"),
             ("fit", "gmm", "-s", tmp_path / "s", "-i", "sample", "--groups", "hog,mbh",
              "--pca-fraction", 0.25, "--components", 2, "-n", "g"),
             (*extract, "--encode", "fisher", "--gmm", "g", "--per-frame", "-n", "fv"),
             ("encode", "-s", tmp_path / "s", "-i", "fv", "--method", "fisher-group", "--gmm",
              "g", "--group", "mbh", "-n", "fv-mbh"),
             ("encode", "-s", tmp_path / "s", "-i", "fv-mbh", "--method", "rankpool", "-n",
              "rp-mbh")]
    for step in steps:
        result = cli(*step)
        assert result.exit_code == 0, (step, result.output)
    assert "mbh: columns 136..263, PCA 128 -> 32, K=2" in cli(*steps[1], "--force").output
    store = Store(tmp_path / "s")
    fv, mbh = store.resolve("fv").read_item("motion"), store.resolve("fv-mbh").read_item("motion")
    assert fv.shape == (10, 2 * 2 * (16 + 32)) and mbh.shape == (10, 2 * 2 * 32)
    np.testing.assert_array_equal(mbh, fv[:, 64:])
    assert store.resolve("rp-mbh").read_item("motion").shape == (2 * 2 * 2 * 32,)
    wrong = cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "idt", *OPTIONS,
                "--encode", "fisher", "--gmm", "g", "--per-frame")
    assert wrong.exit_code == 1
    assert "use --descriptors hog,hof,mbhx,mbhy" in wrong.output
