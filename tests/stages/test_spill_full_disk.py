"""A full disk under rank pooling's spill file (issue 51, item 1): the spill's blocks are
reserved before it is mapped, so a full disk is the store's one WriteError line (the disk,
its free bytes, the bytes needed), exit 1, no item failed, and the rerun finishes, never a
SIGBUS (``Bus error``, exit 135; "decoder crashed (exit code -7)" inside an extraction).
Real small tmpfs file systems (skipped, with the reason, where mounting is not allowed)."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import numpy as np
import pytest

from featpipe.errors import WriteError
from featpipe.store import Store
from tests.conftest import one_line_error
from tests.stages.test_fault_recovery import cli_env
from tests.stages.test_store_faults import mounted

#: rows beyond the dense solver's 2,048, so rank pooling builds its vectors in a spill file
LONG = 2100
SPILL_LINE = re.compile(r"cannot write a spill file in (?P<folder>\S+): No space left on device "
                        r"\(disk full\); its disk has (?P<free>[\d.]+ \w+) free, the file needs "
                        r"(?P<need>[\d.]+ \w+)")


def featpipe(*args, env=None) -> subprocess.CompletedProcess:
    """A real process: on the bug it dies of SIGBUS, which must not take pytest with it."""
    return subprocess.run([sys.executable, "-m", "featpipe", *map(str, args)],
                          env=dict(cli_env(), FEATPIPE_MEMORY="256K", **(env or {})),
                          capture_output=True, text=True, timeout=600)


def leave_free(disk, free: int) -> None:
    """Fill ``disk`` up to ``free`` bytes left."""
    room = os.statvfs(disk).f_bavail * os.statvfs(disk).f_frsize
    (disk / "filler").write_bytes(bytes(max(room - free, 0)))


def spill_files(root) -> list:
    return list(root.rglob("featpipe-spill-*"))


def test_a_spill_on_a_full_disk_is_a_write_error_naming_it(tmp_path, monkeypatch):
    """Both ways of reserving: posix_fallocate, and write() where a file system does not
    support it or a system lacks it."""
    import errno

    from featpipe.backend import SPILL_FOLDER, spill_array

    def unsupported(fd, offset, length):
        raise OSError(errno.EOPNOTSUPP, os.strerror(errno.EOPNOTSUPP))

    with mounted("-t", "tmpfs", "-o", "size=1m", "tmpfs", tmp_path / "disk") as disk:
        token = SPILL_FOLDER.set(str(disk))
        monkeypatch.setenv("FEATPIPE_MEMORY", "64K")
        try:
            mapped = spill_array((512, 256), np.float32)  # 512 KiB: room for it
            mapped[...] = 1.0
            assert mapped.sum() == 512 * 256
            del mapped
            for reserve in ("fallocate", "unsupported", "absent"):
                if reserve == "unsupported":
                    monkeypatch.setattr(os, "posix_fallocate", unsupported)
                    again = spill_array((512, 256), np.float32)  # written with write()
                    assert again.shape == (512, 256) and not again.any()
                    del again
                if reserve == "absent":
                    monkeypatch.delattr(os, "posix_fallocate")
                with pytest.raises(WriteError) as caught:
                    spill_array((2048, 256), np.float32)  # 2 MiB on a 1 MiB disk
                found = SPILL_LINE.match(str(caught.value))
                assert found and found["folder"] == str(disk) and found["need"] == "2.0 MiB", \
                    (reserve, str(caught.value))
                assert not spill_files(disk)
        finally:
            SPILL_FOLDER.reset(token)


def test_encode_on_a_full_disk_stops_in_one_line_and_the_rerun_finishes(tmp_path):
    """Before: ``Bus error``, exit 135, no error line."""
    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    rows = ["id,path,label,split1"]
    for item_id in ("a", "b"):
        np.save(data / f"{item_id}.npy", rng.standard_normal((LONG, 128)).astype(np.float32))
        rows.append(f"{item_id},{item_id}.npy,c,train")
    (data / "m.csv").write_text("\n".join(rows) + "\n")
    with mounted("-t", "tmpfs", "-o", "size=8m", "tmpfs", tmp_path / "disk") as disk:
        store = disk / "s"
        featpipe("import", "--manifest", data / "m.csv", "--from", data, "--store", store,
                 "--name", "x").check_returncode()
        leave_free(disk, 600 * 1024)  # each spill: 2100 x 128 float32, 1.0 MiB
        for on_error in ("fail", "skip"):
            full = featpipe("encode", "--store", store, "--input", "x", "-m", "rankpool",
                            "--name", "r", "--on-error", on_error)
            line = one_line_error(full)
            found = SPILL_LINE.search(line)
            assert found and found["need"] == "1.0 MiB", line
            assert found["folder"] == str(Store(store).resolve("x").path), line
            assert "0 of 2 item(s) are done and kept, none is marked failed" in line, line
            stage = next(s for s in Store(store).all_stages() if s.kind == "encode")
            assert stage.failed() == {} and "r" not in Store(store).names()
            assert not spill_files(disk)
        (disk / "filler").unlink()
        again = featpipe("encode", "--store", store, "--input", "x", "-m", "rankpool",
                         "--name", "r")
        assert again.returncode == 0, again.stderr
        assert "2 done, 0 skipped" in again.stdout
        assert Store(store).resolve("r").is_complete() and not spill_files(disk)


def test_a_fused_temporal_pass_on_a_full_disk_blames_the_disk_not_the_decoder(tmp_path):
    """Before: the video failed with "decoder crashed (exit code -7)" and, with --on-error
    skip, the name moved to a stage with 0 of 1 items done."""
    import cv2

    writer = cv2.VideoWriter(str(tmp_path / "long.mp4"), cv2.VideoWriter_fourcc(*"mp4v"),
                             25.0, (32, 32))
    rng = np.random.default_rng(0)
    for _ in range(LONG):
        writer.write(rng.integers(0, 255, (32, 32, 3), dtype=np.uint8))
    writer.release()
    (tmp_path / "m.csv").write_text("id,path,label,split1\nlong,long.mp4,a,train\n")
    # the per-frame grids (2100 x 512 float32, 4.1 MiB) spill as written rows and fit; the
    # rank-pooling vectors' spill of the same size then does not
    with mounted("-t", "tmpfs", "-o", "size=7m", "tmpfs", tmp_path / "disk") as disk:
        command = ["extract", "-m", tmp_path / "m.csv", "-s", disk / "s", "-f", "dsift",
                   "--sizes", "8", "--step", "8", "--every", "1", "--encode", "spatial-grid",
                   "--grid", "2x2", "--temporal", "rankpool", "-n", "t", "--on-error", "skip",
                   "--no-disk-check"]
        full = featpipe(*command)
        line = one_line_error(full)
        assert SPILL_LINE.search(line) and "decoder" not in line, line
        assert "0 of 1 item(s) are done and kept, none is marked failed" in line, line
        store = Store(disk / "s")
        assert all(s.failed() == {} for s in store.all_stages())
        assert "t" not in store.names() and not spill_files(disk)
        subprocess.run(["mount", "-o", "remount,size=64m", str(disk)], check=True)
        again = featpipe(*command)
        assert again.returncode == 0, again.stderr
        assert "1 done, 0 skipped" in again.stdout and store.resolve("t").is_complete()
