"""`featpipe export NAME --per-item DIR` (issue 49.4): one .npy per item named by its escaped
id, sidecars beside it, an index; every item read back equal for ids that need escaping; and
`extract -m` given a video or a folder says how to make a manifest."""

from __future__ import annotations

import csv
import os

import numpy as np
import pytest

from featpipe.io.per_item import CONTINUED, INDEX, PART_CHARS, file_stem, file_stems, item_id
from featpipe.manifest import from_rows
from featpipe.store import Store
from tests.conftest import one_line_error

#: ids that need escaping: a path, its flat twin, dots, case-only twins, a Windows device
#: name, unicode (composed and not: ids equal after NFC are refused as duplicates, issue 51
#: §7), the escape characters themselves, a folder that looks like a file, very long ids; and
#: a plain one (UCF101's)
IDS = ["a/b", "a_b", "..", ".", ".hidden", "A", "a", "Run/V1", "run/v1", "con", "CON.txt",
       "café", "nai\u0308ve", "日本/動画", "a+b", "%41", "!a", "sp ace", "tab\\back", "x" * 300,
       "é" * 150 + "/" + "Z" * 120, "x.npy/y", "x.npy", "a//b", "/a", "b/", "a./b",
       "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01"]
PLAIN = "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01"


@pytest.fixture
def stage_with_ids(tmp_path):
    """A stage named ``odd`` holding one (T, 3) array per id of :data:`IDS`, with
    timestamps for every other item."""
    rng = np.random.default_rng(0)
    rows = [(i, f"v{n}.mp4", [f"c{n % 2}", "both"] if n == 1 else [f"c{n % 2}"],
             ["train" if n % 3 else "test", "test" if n % 2 else ""])
            for n, i in enumerate(IDS)]
    store = Store(tmp_path / "S")
    stage = store.stage("import", {"odd": 1}, items=from_rows(rows, root=tmp_path))
    arrays = {}
    for n, i in enumerate(IDS):
        arrays[i] = rng.standard_normal((3 + n % 4, 3)).astype(np.float32)
        extras = {"timestamps": np.arange(len(arrays[i]), dtype=np.float64) / 4} \
            if n % 2 == 0 else None
        stage.write_item(i, arrays[i], extras)
    store.set_name("odd", stage)
    return store, arrays


@pytest.mark.parametrize("name", IDS + ["A" * 1000, "\U0001f600", "nul.tar.gz", "~", "a~/b",
                                  "b" * 200 + "con", "a" * 199 + ".b"])
@pytest.mark.parametrize("case_safe", [False, True])
def test_file_stem_is_reversible_ascii_and_never_leaves_its_folder(name, case_safe):
    stem = file_stem(name, case_safe)
    assert item_id(stem) == name
    assert stem.isascii() and (stem == stem.lower() or not case_safe)
    parts = stem.split("/")
    assert all(p for p in parts) and "." not in parts and ".." not in parts
    assert all(len(p) <= PART_CHARS + 1 for p in parts)
    assert not stem.startswith(".")
    for part in parts[:-1]:  # a folder: a piece of a long name, or not like a file
        assert part.endswith(CONTINUED) or not (part.endswith(".") or
                                                part.lower().endswith(".npy"))
    for part in parts:
        assert part.split(".")[0].lower() not in {"con", "nul", "prn", "aux"}


def test_every_item_is_read_back_equal_with_its_sidecars_and_index(stage_with_ids, tmp_path,
                                                                   cli):
    store, arrays = stage_with_ids
    out = tmp_path / "per-item"
    result = cli("export", "-s", store.root, "odd", "--per-item", out, check=True)
    assert result.stdout.startswith(f"wrote {out}: {len(IDS)} items, one .npy each, sidecars "
                                    f"timestamps; index {out / INDEX}")
    files = [p for p in out.rglob("*") if p.is_file()]
    names = [p.relative_to(out).as_posix() for p in files]
    # distinct ids never share a file, not even on a case-insensitive disk
    assert len({n.casefold() for n in names}) == len(names) == len(IDS) + (len(IDS) + 1) // 2 + 1
    assert all(p.resolve().is_relative_to(out.resolve()) for p in files)
    with open(out / INDEX, newline="", encoding="utf-8") as handle:
        rows = list(csv.DictReader(handle))
    assert list(rows[0]) == ["id", "file", "label", "split1", "split2", "shape", "dtype",
                             "timestamps"]
    assert [r["id"] for r in rows] == IDS
    items = store.resolve("odd").items
    for n, row in enumerate(rows):
        name = row["id"]
        assert row["file"] == file_stems(IDS)[name] + ".npy"
        assert item_id(row["file"][:-len(".npy")]) == name
        loaded = np.load(out / row["file"], allow_pickle=False)
        assert loaded.dtype == arrays[name].dtype and np.array_equal(loaded, arrays[name])
        assert row["shape"] == "x".join(map(str, arrays[name].shape)) and row["dtype"] == \
            "float32"
        assert row["label"] == items[name].label and row["split1"] == items[name].split(1)
        if n % 2 == 0:
            stamps = np.load(out / row["timestamps"], allow_pickle=False)
            assert np.array_equal(stamps, np.arange(len(arrays[name])) / 4)
        else:
            assert row["timestamps"] == ""
    assert rows[1]["label"] == "c1;both"
    files_of = {r["id"]: r["file"] for r in rows}
    assert files_of[PLAIN] == PLAIN + ".npy" and files_of["a/b"] == "a/b.npy"
    assert (files_of["A"], files_of["a"]) == ("!a.npy", "a.npy")  # case-only twins
    assert (files_of["Run/V1"], files_of["run/v1"]) == ("!run/!v1.npy", "run/v1.npy")
    assert files_of["a_b"] == "a_b.npy" and files_of["a//b"] == "a%2f%2fb.npy"


def test_plain_ids_come_back_through_import_from_the_folder(stage_with_ids, tmp_path, cli):
    """The layout `featpipe import --from DIR` reads: <id>.npy, ids with / in subfolders."""
    store, arrays = stage_with_ids
    out = tmp_path / "round"
    cli("export", "-s", store.root, "odd", "--per-item", out, check=True)
    ids = [PLAIN, "a/b", "a_b", "x.npy"]
    manifest = tmp_path / "m.csv"
    store.resolve("odd").items.subset(set(ids)).write(manifest)
    cli("import", "--manifest", manifest, "--from", out, "-s", tmp_path / "T", "--name", "back",
        check=True)
    back = Store(tmp_path / "T").resolve("back")
    for i in ids:
        assert np.array_equal(back.read_item(i), arrays[i]), i


def test_a_rerun_replaces_an_earlier_export_and_other_folders_are_refused(stage_with_ids,
                                                                          tmp_path, cli):
    store, _ = stage_with_ids
    out = tmp_path / "again"
    cli("export", "-s", store.root, "odd", "--per-item", out, check=True)
    # a smaller stage without sidecars exported into the same folder: the files of the items
    # it lacks go, every sidecar, and !a.npy: without its twin a, A is A.npy
    stage = store.stage("import", {"two": 1}, items=store.resolve("odd").items.subset(
        {"a/b", "A"}))
    for i in ("a/b", "A"):
        stage.write_item(i, np.ones((2, 3), np.float32))
    store.set_name("two", stage)
    result = cli("export", "-s", store.root, "two", "--per-item", out, check=True)
    assert f"removed {len(IDS) - 2 + (len(IDS) + 1) // 2 + 1} files of the earlier export" in \
        result.stdout
    left = sorted(p.relative_to(out).as_posix() for p in out.rglob("*.npy"))
    assert left == sorted([file_stem("a/b") + ".npy", file_stem("A") + ".npy"])
    assert np.array_equal(np.load(out / (file_stem("A") + ".npy")), np.ones((2, 3)))
    other = tmp_path / "other"
    other.mkdir()
    (other / "keep.txt").write_text("mine")
    error = one_line_error(cli("export", "-s", store.root, "odd", "--per-item", other))
    assert "holds files and no index.csv (not a featpipe export)" in error
    assert os.listdir(other) == ["keep.txt"]
    assert "give one of -o FILE and --per-item DIR" in cli("export", "-s", store.root,
                                                           "odd").stderr
    inside = one_line_error(cli("export", "-s", store.root, "odd", "--per-item",
                                store.root / "x"), 2)
    assert "is inside the store" in inside


def test_a_crash_while_writing_leaves_no_part_file_and_a_rerun_finishes(stage_with_ids,
                                                                       tmp_path, monkeypatch):
    from featpipe.io import per_item

    store, arrays = stage_with_ids
    out = tmp_path / "crash"
    calls = {"n": 0}
    real = per_item.atomic_save_npy

    def dies_on_the_fifth(path, array):
        calls["n"] += 1
        if calls["n"] == 5:
            raise KeyboardInterrupt
        return real(path, array)

    monkeypatch.setattr(per_item, "atomic_save_npy", dies_on_the_fifth)
    with pytest.raises(KeyboardInterrupt):
        per_item.export_per_item(store.resolve("odd"), out)
    assert not [p for p in out.rglob("*") if ".tmp." in p.name]
    with open(out / INDEX, encoding="utf-8") as handle:  # the index lists no item yet
        assert len(handle.read().splitlines()) == 1
    monkeypatch.setattr(per_item, "atomic_save_npy", real)
    done = per_item.export_per_item(store.resolve("odd"), out)
    assert done.n_items == len(IDS)
    for name, array in arrays.items():
        assert np.array_equal(np.load(out / (file_stems(IDS)[name] + ".npy")), array)


def test_extract_given_a_video_or_a_folder_says_how_to_make_a_manifest(tmp_path, cli):
    videos = tmp_path / "videos"
    videos.mkdir()
    (videos / "clip.mp4").write_bytes(b"\x00\x00\x00\x18ftypmp42")
    one = cli("extract", "-m", videos / "clip.mp4", "-s", tmp_path / "S", "-f", "dsift")
    assert one.exit_code == 2
    assert f"is a video file, not a manifest (a CSV: id,path,label,split1...); make one of " \
           f"the videos in its folder: featpipe manifest build {videos} -o videos.csv" in \
        " ".join(one.stderr.split())
    folder = cli("extract", "-m", videos, "-s", tmp_path / "S", "-f", "dsift")
    assert folder.exit_code == 2
    assert f"is a folder, not a manifest; make one of the videos in it: featpipe manifest " \
           f"build {videos} -o videos.csv" in " ".join(folder.stderr.split())
    assert not (tmp_path / "S").exists()


def test_an_empty_id_is_refused_and_long_parts_are_cut_at_200_characters():
    """The layout other tools and a rerun read: parts cut every 200 characters, each cut
    ending in ``~``; an empty id has no name; a lone surrogate (an id no UTF-8 text holds)
    still comes back."""
    from featpipe.errors import FeatpipeError

    with pytest.raises(FeatpipeError, match="an empty item id has no file name"):
        file_stem("")
    assert file_stem("x" * 401) == "x" * 200 + "~/" + "x" * 200 + "~/x"
    assert item_id(file_stem("a\udc80")) == "a\udc80"
    assert [file_stem(i) for i in ("com1", "COM9.txt", "lpt1", "lpt9", "com10", "lpt10")] == [
        "%63om1", "%43OM9.txt", "%6cpt1", "%6cpt9", "com10", "lpt10"]  # Windows' devices


def test_a_file_an_incomplete_or_empty_stage_are_refused_and_partial_exports_the_rest(
        stage_with_ids, tmp_path):
    from featpipe.errors import FeatpipeError
    from featpipe.io.per_item import export_per_item

    store, _ = stage_with_ids
    odd = store.resolve("odd")
    a_file = tmp_path / "out.npy"
    a_file.write_bytes(b"mine")
    with pytest.raises(FeatpipeError, match="out.npy is a file; give a folder"):
        export_per_item(odd, a_file)
    assert a_file.read_bytes() == b"mine"
    part = store.stage("import", {"part": 1}, items=odd.items.subset({"a/b", "A", "con"}))
    part.write_item("A", np.ones((2, 3), np.float32))
    with pytest.raises(FeatpipeError, match="is incomplete: 2 of 3 items not computed"):
        export_per_item(part, tmp_path / "part")
    done = export_per_item(part, tmp_path / "part", partial=True)
    assert (done.n_items, done.missing) == (1, 2)
    assert sorted(p.name for p in (tmp_path / "part").iterdir()) == ["A.npy", INDEX]
    none = store.stage("import", {"none": 1}, items=odd.items.subset({"a/b"}))
    with pytest.raises(FeatpipeError, match="has no computed items to export"):
        export_per_item(none, tmp_path / "none", partial=True)
    assert not (tmp_path / "none").exists()


def test_a_rerun_of_one_export_keeps_its_files_and_ignores_rows_that_name_none(
        stage_with_ids, tmp_path):
    """The same stage exported again into its folder removes nothing (its sidecars
    included); rows of the index without an id or a file name no file; an index that is not
    UTF-8 is one line; the index's lines end in a newline alone."""
    from featpipe.errors import FeatpipeError
    from featpipe.io.per_item import export_per_item

    store, _ = stage_with_ids
    odd = store.resolve("odd")
    out = tmp_path / "same"
    export_per_item(odd, out)
    files = sorted(p.relative_to(out) for p in out.rglob("*.npy"))
    index = (out / INDEX).read_bytes()
    assert b"\r" not in index and index.endswith(b"\n")
    (out / INDEX).write_bytes(index + b"short\n,x.npy,c0\n")
    again = export_per_item(odd, out)
    assert (again.removed, again.n_items) == (0, len(IDS))
    assert sorted(p.relative_to(out) for p in out.rglob("*.npy")) == files
    assert (out / INDEX).read_bytes() == index
    (out / INDEX).write_bytes(b"\xff\xfeid\n")
    with pytest.raises(FeatpipeError, match="its index.csv is unreadable"):
        export_per_item(odd, out)


def test_a_rerun_removes_the_folders_it_empties_and_names_a_file_it_cannot_remove(
        stage_with_ids, tmp_path, monkeypatch):
    """Files of an earlier export that a rerun does not write go with the folders they leave
    empty (a row of the index needs only its id and file); an empty index lists none; a file
    that cannot be removed is one line naming it."""
    from pathlib import Path

    from featpipe.errors import FeatpipeError
    from featpipe.io.per_item import export_per_item

    store, _ = stage_with_ids
    odd = store.resolve("odd")
    one = store.stage("import", {"one": 1}, items=odd.items.subset({"a/b"}))
    one.write_item("a/b", np.ones((2, 3), np.float32))
    out = tmp_path / "dirs"
    export_per_item(odd, out)
    (out / "zz.npy").write_bytes(b"")
    with open(out / INDEX, "ab") as handle:
        handle.write(b"zz,zz.npy\n")
    export_per_item(one, out)
    assert sorted(p.relative_to(out).as_posix() for p in out.rglob("*")) == [
        "a", "a/b.npy", INDEX]
    (out / INDEX).write_bytes(b"")
    assert export_per_item(one, out).removed == 0
    again = tmp_path / "again"
    export_per_item(odd, again)
    real = Path.unlink

    def unlink(path, *args, **kwargs):
        if path.name == "a_b.npy":
            raise PermissionError(13, "Permission denied")
        return real(path, *args, **kwargs)

    monkeypatch.setattr(Path, "unlink", unlink)
    with pytest.raises(FeatpipeError, match=r"cannot remove \S*again/a_b\.npy: "):
        export_per_item(one, again)


def test_a_rerun_reads_the_earlier_index_as_utf8_whatever_the_locale(stage_with_ids, tmp_path):
    """The index is UTF-8 (its ids: café, 日本/動画...): a rerun under an ASCII locale
    (LC_ALL=C without Python's UTF-8 mode) reads it and replaces the export."""
    import subprocess
    import sys

    from featpipe.io.per_item import export_per_item
    from tests.conftest import REPO

    store, _ = stage_with_ids
    out = tmp_path / "ascii"
    export_per_item(store.resolve("odd"), out)
    before = sorted(p.relative_to(out) for p in out.rglob("*.npy"))
    env = dict(os.environ, LC_ALL="C", LANG="C", PYTHONUTF8="0", PYTHONCOERCECLOCALE="0",
               PYTHONPATH=str(REPO))
    proc = subprocess.run([sys.executable, "-m", "featpipe", "export", "-s", str(store.root),
                           "odd", "--per-item", str(out)], env=env, capture_output=True,
                          timeout=300)
    assert proc.returncode == 0, proc.stderr.decode("utf-8", "replace")
    assert sorted(p.relative_to(out) for p in out.rglob("*.npy")) == before
