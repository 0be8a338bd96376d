"""Inputs keyed by content (issue 22 section 2): a file rewritten inside an ``import --from``
folder gives a new stage (even with its old size and mtime), a touched one keeps the stage;
HDF5 dataset paths are normalised and two ids naming one dataset are refused; data outside
the HDF5 file (external links, external storage, virtual datasets) are refused naming the
link."""

from __future__ import annotations

import hashlib
import os

import h5py
import numpy as np
import pytest

from featpipe import stages
from featpipe.errors import FeatpipeError
from featpipe.store import Store
from featpipe.store.content import CACHE_NAME, ContentHashes, sha256_of
from tests._stores import write_npy_dataset
from tests.cli.test_import_export import write_manifest


def _import(store, folder, manifest):
    return stages.import_features(store, [str(folder)], str(manifest), name="feat")


def test_a_rewritten_file_in_a_folder_gives_a_new_stage_a_touched_one_does_not(tmp_path):
    manifest = write_npy_dataset(tmp_path, n=4)
    folder = tmp_path / "npy"
    store = Store(tmp_path / "store")
    first = _import(store, folder, manifest).stage
    target = folder / "v01.npy"
    before = os.stat(target)
    rewritten = np.load(target) + 1  # same shape, same size, new values
    np.save(target, rewritten)
    os.utime(target, ns=(before.st_atime_ns, before.st_mtime_ns))  # even the old mtime
    assert os.stat(target).st_size == before.st_size
    second = _import(store, folder, manifest)
    assert second.stage != first and second.summary.done == 4
    np.testing.assert_array_equal(second.stage.read_item("v01"), rewritten)
    os.utime(target)  # touched: same bytes, new mtime
    third = _import(store, folder, manifest)
    assert third.stage == second.stage and third.summary.skipped == 4
    assert (store.root / CACHE_NAME).is_file()


def test_a_moved_dataset_keeps_its_import_stage_a_relabelled_one_does_not(tmp_path):
    manifest = write_npy_dataset(tmp_path / "here", n=4)
    store = Store(tmp_path / "store")
    first = _import(store, tmp_path / "here" / "npy", manifest).stage
    (tmp_path / "here").rename(tmp_path / "moved")  # the manifest and its folder together
    moved = _import(store, tmp_path / "moved" / "npy", tmp_path / "moved" / "m.csv")
    assert moved.stage == first and moved.summary.skipped == 4
    # what the stage holds besides the arrays (its items' labels, their order) is keyed
    text = (tmp_path / "moved" / "m.csv").read_text()
    (tmp_path / "moved" / "m.csv").write_text(text.replace(",c1,", ",c2,"))
    relabelled = _import(store, tmp_path / "moved" / "npy", tmp_path / "moved" / "m.csv")
    assert relabelled.stage != first
    assert [it.label for it in relabelled.stage.items if it.id == "v01"] == ["c2"]
    header, *rows = text.splitlines()
    (tmp_path / "moved" / "m.csv").write_text("\n".join([header, *rows[::-1]]) + "\n")
    reordered = _import(store, tmp_path / "moved" / "npy", tmp_path / "moved" / "m.csv")
    assert reordered.stage not in (first, relabelled.stage)
    assert reordered.stage.items.ids == ["v03", "v02", "v01", "v00"]


def test_the_cache_reads_a_file_again_only_when_its_stat_changes(tmp_path):
    path = tmp_path / "f.bin"
    path.write_bytes(b"abc")
    hashes = ContentHashes(tmp_path / "cache.json")
    assert hashes.file_hash(path) == (3, sha256_of(path)) and hashes.read_bytes == 3
    hashes.save()
    again = ContentHashes(tmp_path / "cache.json")
    assert again.file_hash(path)[1] == sha256_of(path) and again.read_bytes == 0
    path.write_bytes(b"abd")
    assert again.file_hash(path)[1] == sha256_of(path) and again.read_bytes == 3
    assert sha256_of(path) == hashlib.sha256(b"abd").hexdigest()


@pytest.mark.parametrize("alias", ["a//b", "./a/b", "a/b/", "/a/b"])
def test_hdf5_paths_are_normalised_and_two_ids_for_one_dataset_are_refused(tmp_path, alias):
    with h5py.File(tmp_path / "f.h5", "w") as handle:
        handle["a/b"] = np.ones((2, 3))
        handle["c"] = np.zeros((2, 3))
    store = Store(tmp_path / "store")
    alone = write_manifest(tmp_path, [alias, "c"])
    run = stages.import_features(store, [str(tmp_path / "f.h5")], str(alone), name="one")
    np.testing.assert_array_equal(run.stage.read_item(alias), np.ones((2, 3)))
    both = write_manifest(tmp_path, ["a/b", alias])
    with pytest.raises(FeatpipeError, match=f"items 'a/b' and '{alias}' both name dataset "
                       "/a/b of "):
        stages.import_features(Store(tmp_path / "other"), [str(tmp_path / "f.h5")],
                               str(both))
    assert not (tmp_path / "other" / "stages").exists()


@pytest.mark.parametrize("link", ["hard", "soft"])
def test_a_hard_or_soft_link_is_the_same_dataset(tmp_path, link):
    with h5py.File(tmp_path / "f.h5", "w") as handle:
        handle["a"] = np.ones((2, 3))
        # a second name for the same data
        handle["b"] = handle["a"] if link == "hard" else h5py.SoftLink("/a")
    manifest = write_manifest(tmp_path, ["a", "b"])
    with pytest.raises(FeatpipeError, match="items 'a' and 'b' both name dataset"):
        stages.import_features(Store(tmp_path / "s"), [str(tmp_path / "f.h5")], str(manifest))


def test_external_links_storage_and_virtual_datasets_are_refused_naming_them(tmp_path, cli):
    with h5py.File(tmp_path / "other.h5", "w") as handle:
        handle["x"] = np.ones((2, 3))
    raw = tmp_path / "raw.bin"
    raw.write_bytes(np.zeros((2, 3)).tobytes())
    with h5py.File(tmp_path / "f.h5", "w") as handle:
        handle["g/linked"] = h5py.ExternalLink("other.h5", "/x")
        handle.create_dataset("stored", shape=(2, 3), dtype="f8", external=[(str(raw), 0, 48)])
        layout = h5py.VirtualLayout(shape=(2, 3), dtype="f8")
        layout[:] = h5py.VirtualSource("other.h5", "x", shape=(2, 3))
        handle.create_virtual_dataset("virtual", layout)
        handle["own"] = np.ones((2, 3))
    for item_id, message in (("g/linked", "/g/linked is an external link to other.h5:/x "
                                           "(item 'g/linked')"),
                             ("stored", "dataset /stored (item 'stored') is stored in "
                                        "external files"),
                             ("virtual", "dataset /virtual (item 'virtual') is a virtual "
                                         "dataset")):
        manifest = write_manifest(tmp_path, ["own", item_id])
        result = cli("import", "--manifest", manifest, "--from", tmp_path / "f.h5",
                     "--store", tmp_path / "s", "--name", "x")
        assert result.exit_code == 1 and message in result.stderr, result.stderr
        assert len(result.stderr.strip().splitlines()) == 1
        assert not (tmp_path / "s" / "stages").exists()


def test_extract_keys_its_videos_by_content(tmp_path, cli):
    import shutil

    import cv2

    data = tmp_path / "data"
    data.mkdir()
    rng = np.random.default_rng(0)
    cv2.imwrite(str(data / "a.png"), rng.integers(0, 255, (40, 48, 3), np.uint8))
    (data / "m.csv").write_text("id,path,label,split1\na,a.png,x,train\n")

    def key(folder):
        result = cli("extract", "-m", folder / "m.csv", "-s", tmp_path / "store", "-f",
                     "dsift", "--sizes", "8", "--step", "8", "--dry-run")
        assert result.exit_code == 0, result.output
        return result.output.split("stage extract-")[1][:16]

    first = key(data)
    os.utime(data / "a.png")  # touched: same content
    assert key(data) == first
    moved = tmp_path / "moved"
    shutil.copytree(data, moved)  # the same files elsewhere
    assert key(moved) == first
    cv2.imwrite(str(data / "a.png"), rng.integers(0, 255, (40, 48, 3), np.uint8))  # rewritten
    assert key(data) != first
    assert not (tmp_path / "store").exists()  # dry runs create nothing, not even the cache
