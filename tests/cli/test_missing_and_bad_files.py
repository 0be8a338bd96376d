"""An item whose file is missing, and files that cannot be read (issue 47, item 7, part).

A missing file says so and names the manifest row to fix, never "re-run the same command to
finish it": as it is, a re-run fails the item again, and the fixed manifest is a new stage
(the key holds every file's content).  ``manifest check`` opens each video's and image's
header in a decoding worker: an empty file, a folder, an unreadable file, a file with no
video stream or a damaged header is one line naming its row; ``--no-files`` skips it."""

from __future__ import annotations

import os
import wave

import cv2
import numpy as np
import pytest

from featpipe.store import Store
from tests.conftest import one_line_error
from tests.unit.test_video import write_video


@pytest.fixture
def one_missing(tmp_path):
    write_video(tmp_path / "v.mp4", n_frames=8, size=(64, 48))
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,path,label,split1\nv,v.mp4,a,train\ngone,gone.mp4,a,test\n")
    return manifest


def test_a_missing_video_names_its_row_not_a_re_run(tmp_path, cli, one_missing):
    """A missing file cannot let a stage finish: refused before any work (issue 47 §1, §7),
    naming its row and the way out; with --on-error skip the others are computed and the
    missing one fails as an item, naming its row."""
    row = f"fix or remove its row in {one_missing} (line 3: path 'gone.mp4')"
    args = ["extract", "-m", one_missing, "-s", tmp_path / "s", "-f", "dsift", "--every", "4",
            "-n", "d"]
    stopped = cli(*args)
    line = one_line_error(stopped)
    assert line == (f"error: 1 item(s) have no file (first: 'gone': file {tmp_path / 'gone.mp4'} "
                    f"does not exist; {row}), or --on-error skip computes the others: nothing "
                    "was computed"), line
    assert "re-run" not in stopped.stderr, stopped.stderr
    assert not (tmp_path / "s").exists()
    skipped = cli(*args, "--on-error", "skip")
    assert skipped.exit_code == 1
    assert f"failed: gone: file {tmp_path / 'gone.mp4'} does not exist; {row}" \
        in skipped.stderr, skipped.stderr
    assert Store(tmp_path / "s").resolve("d").done_ids() == {"v"}


def test_a_missing_imported_file_names_its_row_not_a_re_run(tmp_path, cli):
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / "a.npy", np.ones((3, 2), np.float32))
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,path,label,split1\na,npy/a.npy,x,train\nzz,npy/zz.npy,x,test\n")
    stopped = cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store",
                  tmp_path / "s", "--name", "i")
    line = one_line_error(stopped)
    assert f"(formats tried: .npy, .mat); add its file, or fix or remove its row in {manifest} " \
           "(line 3: path 'npy/zz.npy')" in line, line
    assert "re-run" not in stopped.stderr, stopped.stderr


def test_manifest_check_opens_each_video_and_image_header(tmp_path, cli):
    write_video(tmp_path / "v.mp4", n_frames=4, size=(64, 48))
    cv2.imwrite(str(tmp_path / "img.png"), np.zeros((8, 8, 3), np.uint8))
    (tmp_path / "zero.mp4").write_bytes(b"")
    with wave.open(str(tmp_path / "sound.mp4"), "wb") as sound:  # a container, no video stream
        sound.setnchannels(1)
        sound.setsampwidth(2)
        sound.setframerate(8000)
        sound.writeframes(np.zeros(800, np.int16).tobytes())
    (tmp_path / "cut.mp4").write_bytes((tmp_path / "v.mp4").read_bytes()[:300])
    (tmp_path / "folder.avi").mkdir()
    (tmp_path / "bad.png").write_bytes(b"not a png")
    (tmp_path / "empty.npy").write_bytes(b"")
    rows = [("v", "v.mp4"), ("img", "img.png"), ("zero", "zero.mp4"), ("sound", "sound.mp4"),
            ("cut", "cut.mp4"), ("folder", "folder.avi"), ("bad", "bad.png"),
            ("empty", "empty.npy")]
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,path,label,split1\n" + "".join(f"{i},{p},a,train\n"
                                                           for i, p in rows))
    result = cli("manifest", "check", manifest)
    assert result.exit_code == 1
    opening = "OpenCV cannot open it as a video (not a video, unsupported codec or corrupt header)"
    expected = {
        4: "file 'zero.mp4' of 'zero': empty file (0 bytes)",
        5: f"file 'sound.mp4' of 'sound': {opening}",
        6: f"file 'cut.mp4' of 'cut': {opening}",
        7: "file 'folder.avi' of 'folder': a folder, not a file",
        8: "file 'bad.png' of 'bad': unreadable image",
        9: "file 'empty.npy' of 'empty': empty file (0 bytes)",
    }
    lines = result.stdout.splitlines()
    assert len(lines) == len(expected), result.stdout
    for line, (number, text) in zip(lines, sorted(expected.items()), strict=True):
        assert line.startswith(f"{manifest}:{number}: {text}"), (line, text)
    assert f"{len(expected)} problem(s)" in result.stderr
    skipped = cli("manifest", "check", manifest, "--no-files")
    assert skipped.exit_code == 0, skipped.output


@pytest.mark.skipif(os.geteuid() == 0, reason="root reads a file whatever its mode")
def test_manifest_check_names_an_unreadable_video(tmp_path, cli):
    write_video(tmp_path / "v.mp4", n_frames=4, size=(64, 48))
    (tmp_path / "v.mp4").chmod(0)
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,path,label,split1\nv,v.mp4,a,train\n")
    result = cli("manifest", "check", manifest)
    assert result.exit_code == 1
    assert f"{manifest}:2: file 'v.mp4' of 'v': cannot read it (Permission denied)" \
        in result.stdout, result.stdout
