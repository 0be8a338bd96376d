"""Ids equal after Unicode normalisation are one id twice, and symbolic links that loop are
named as such (issue 51, item 7): ``café`` composed (NFC) and decomposed (NFD) print the
same, so a manifest, a folder scan or .ts files that hold both are refused naming both rows;
a manifest, a ``--from`` or an item's file that is a looping link is called one, never
"not found" (nor "file name too long")."""

from __future__ import annotations

import unicodedata
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pytest

from featpipe.errors import FeatpipeError
from featpipe.store import Store
from tests.conftest import one_line_error

NFC = unicodedata.normalize("NFC", "café")
NFD = unicodedata.normalize("NFD", "café")
TWINS = (f"duplicate id {NFD!r}: equal to {NFC!r} on line 2 after Unicode normalisation "
         r"(NFD 'cafe\u0301' here, NFC 'caf\xe9' there; they print the same)")


def twin_manifest(folder: Path) -> Path:
    (folder / "npy").mkdir(parents=True, exist_ok=True)
    for name in ("a", "b"):
        np.save(folder / "npy" / f"{name}.npy", np.ones((3, 2), np.float32))
    path = folder / "m.csv"
    path.write_text(f"id,path,label,split1\n{NFC},npy/a.npy,c,train\n{NFD},npy/b.npy,c,test\n",
                    encoding="utf-8")
    return path


def test_manifest_check_refuses_ids_equal_after_normalisation_naming_both_rows(tmp_path, cli):
    manifest = twin_manifest(tmp_path)
    result = cli("manifest", "check", manifest)
    assert result.exit_code == 1
    assert f"{manifest}:3: {TWINS}" in result.stdout, result.stdout


def test_import_refuses_them_before_any_stage(tmp_path, cli):
    manifest = twin_manifest(tmp_path)
    line = one_line_error(cli("import", "--manifest", manifest, "--from", tmp_path / "npy",
                              "--store", tmp_path / "s", "--name", "x"))
    assert line == f"error: manifest {manifest}, line 3: {TWINS}: write one form for both, " \
                   "or rename one", line
    assert not (tmp_path / "s" / "stages").exists()


def test_a_folder_scan_and_ts_files_refuse_names_equal_after_normalisation(tmp_path, cli):
    from featpipe.io.importers import ts_manifest

    data = tmp_path / "data" / "c"
    data.mkdir(parents=True)
    for name in (NFC, NFD):
        (data / f"{name}.png").write_bytes(b"")
    if len(list(data.iterdir())) < 2:
        pytest.skip("this file system stores one form of a name")
    line = one_line_error(cli("manifest", "build", tmp_path / "data", "-o",
                              tmp_path / "m.csv"))
    first, later = sorted([NFC, NFD])  # the scan's order
    assert line.startswith(f"error: duplicate id 'c/{later}' (from 'c/{later}.png'): equal to "
                           f"'c/{first}' on the row of 'c/{first}.png' after Unicode "
                           "normalisation ("), line
    assert r"'c/cafe\u0301'" in line and r"'c/caf\xe9'" in line, line
    assert not (tmp_path / "m.csv").exists()

    def ts(stem):
        return SimpleNamespace(path=tmp_path / f"{stem}.ts", ids=[f"{stem}/0"], labels=["a"],
                               split=lambda: "train")

    with pytest.raises(FeatpipeError, match=r"have names equal after Unicode normalisation "
                                            r"\('caf\\xe9_TRAIN' and 'cafe\\u0301_TRAIN'"):
        ts_manifest([ts(f"{NFC}_TRAIN"), ts(f"{NFD}_TRAIN")])


def test_a_looping_link_is_named_as_such_by_import_and_manifest_check(tmp_path, cli):
    """Before: ``not found: none of ... (file name too long for this file system)``."""
    folder = tmp_path / "npy"
    folder.mkdir()
    np.save(folder / "ok.npy", np.ones((3, 2), np.float32))
    (folder / "x.npy").symlink_to("y.npy")
    (folder / "y.npy").symlink_to("x.npy")
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,path,label,split1\nok,npy/ok.npy,c,train\nx,npy/x.npy,c,test\n")
    result = cli("import", "--manifest", manifest, "--from", folder, "--store", tmp_path / "s",
                 "--name", "x", "--on-error", "skip")
    assert result.exit_code == 1
    failed = [line for line in result.output.splitlines() if line.startswith("failed: ")]
    assert failed == [f"failed: x: {folder / 'x.npy'} is a symbolic link that loops (Too many "
                      "levels of symbolic links): point it at the item's file, or fix or remove "
                      f"its row in {manifest} (line 3: path 'npy/x.npy')"]
    assert Store(tmp_path / "s").resolve("x").done_ids() == {"ok"}
    check = cli("manifest", "check", manifest)
    assert f"{manifest}:3: file 'npy/x.npy' of 'x' does not exist; {tmp_path}/npy/x.npy is a " \
           "symbolic link that loops" in check.stdout, check.stdout

    (tmp_path / "loop").symlink_to("loop")
    line = one_line_error(cli("import", "--manifest", manifest, "--from", tmp_path / "loop",
                              "--store", tmp_path / "s2", "--name", "x"))
    assert line == f"error: --from {tmp_path / 'loop'} is a symbolic link that loops (Too many " \
                   "levels of symbolic links): point it at the features", line
    (tmp_path / "l.csv").symlink_to("l.csv")
    for args in (["import", "--manifest", tmp_path / "l.csv", "--from", folder, "--name", "x",
                  "--store", tmp_path / "s3"],
                 ["extract", "-m", tmp_path / "l.csv", "-s", tmp_path / "s3", "-f", "dsift"]):
        line = one_line_error(cli(*args))
        assert line == f"error: manifest {tmp_path / 'l.csv'} is a symbolic link that loops " \
                       "(Too many levels of symbolic links)", (args, line)
    assert not (tmp_path / "s2").exists() and not (tmp_path / "s3" / "stages").exists()
