"""Integrity at rest (issue 31 §1): a flipped bit in a stored item, model file or packed shard
is named by `cache verify`, refused by the stage that reads it, and `cache verify --repair`
removes exactly that for a re-run to recompute.  Real processes throughout."""

from __future__ import annotations

import json

import h5py
import numpy as np
import pytest

from featpipe.fileio import safe_stem
from featpipe.store import Store
from tests._stores import make_old, write_npy_dataset
from tests.conftest import one_line_error, run_cli


def flip_bit(path, offset: int, bit: int = 0x10) -> None:
    data = bytearray(path.read_bytes())
    data[offset] ^= bit
    path.write_bytes(bytes(data))


def problems(proc) -> list[str]:
    return [line for line in proc.stdout.splitlines() if line.startswith("problem:")]


@pytest.fixture
def imported(tmp_path):
    """A store with 12 imported (T, 8) items named ``feat`` and the command that made it."""
    manifest = write_npy_dataset(tmp_path)
    store = tmp_path / "s"
    command = ("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store", store,
               "--name", "feat")
    run_cli(*command)
    return store, command


def test_flipped_bit_in_an_item_is_named_refused_and_recomputed_alone(imported):
    store, command = imported
    stage = Store(store).resolve("feat")
    path = stage.item_path("v03")
    original = path.read_bytes()
    flip_bit(path, len(original) - 3)  # a bit of the data: the header still parses
    verify = run_cli("cache", "verify", "--store", store, check=False)
    assert verify.returncode == 1
    assert len(problems(verify)) == 1, verify.stdout
    assert problems(verify)[0].startswith(f"problem: stage {stage.name}: item 'v03': damaged (")
    encode = run_cli("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "e", check=False)
    error = one_line_error(encode)
    assert "v03: input not available: " in error and "damaged" in error and "checksum" in error
    repair = run_cli("cache", "verify", "--store", store, "--repair")
    assert f"repaired: stage {stage.name}: removed damaged item 'v03'" in repair.stdout
    assert not path.exists()
    rerun = run_cli(*command)
    assert "summary: 1 done, 11 skipped" in rerun.stdout  # exactly the damaged item
    assert path.read_bytes() == original
    assert "0 problem(s)" in run_cli("cache", "verify", "--store", store).stdout
    run_cli("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "e")


def test_flipped_bit_in_a_model_file_is_named_refused_and_refitted(imported):
    store, _ = imported
    fit = ("fit", "standardize", "--store", store, "--input", "feat", "--name", "z")
    run_cli(*fit)
    stage = Store(store).resolve("z")
    meta = stage.path / "models" / "standardize.json"
    arrays_before, meta_before = stage.load_model("standardize")
    text = meta.read_bytes()
    flip_bit(meta, text.index(b'"n_items": ') + len(b'"n_items": '), 0x01)  # 6 -> 7: valid JSON
    verify = run_cli("cache", "verify", "--store", store, "z", check=False)
    assert verify.returncode == 1
    assert [p.split(": unreadable")[0] for p in problems(verify)] == \
        [f"problem: stage {stage.name}: model 'standardize'"]
    assert "is damaged" in problems(verify)[0]
    encode = run_cli("encode", "-s", store, "-i", "feat", "-m", "standardize", "--model", "z",
                     check=False)
    error = one_line_error(encode)
    assert "model 'standardize'" in error and "damaged" in error
    repair = run_cli("cache", "verify", "--store", store, "z", "--repair")
    assert "removed damaged model 'standardize'" in repair.stdout
    run_cli(*fit)  # refits: the model was removed
    arrays, meta_after = Store(store).resolve("z").load_model("standardize")
    assert meta_after == meta_before
    assert all(arrays[k].tobytes() == arrays_before[k].tobytes() for k in arrays_before)
    assert "0 problem(s)" in run_cli("cache", "verify", "--store", store).stdout


def test_flipped_bit_in_a_packed_shard_is_named_refused_and_recomputed_alone(imported):
    store, command = imported
    stage = Store(store).resolve("feat")
    original = {i: stage.read_item(i) for i in stage.items.ids}
    run_cli("cache", "pack", "--store", store, "feat", "--shards", "2")
    index = json.loads((stage.path / "packed" / "pack.json").read_text())
    shard = next(stage.path / "packed" / name for name in index["files"]
                 if "v03" in h5py.File(stage.path / "packed" / name, "r")["ids"].asstr()[()])
    with h5py.File(shard, "r") as handle:
        offset = handle["items"][safe_stem("v03")].id.get_offset()
    flip_bit(shard, offset + 5)
    verify = run_cli("cache", "verify", "--store", store, check=False)
    assert verify.returncode == 1
    found = problems(verify)
    assert f"problem: stage {stage.name}: packed file {shard.name}: damaged (" in found[0]
    assert len(found) == 2 and found[1].startswith(
        f"problem: stage {stage.name}: item 'v03': damaged (")
    encode = run_cli("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "e", check=False)
    error = one_line_error(encode)
    assert "v03: input not available: " in error and "damaged" in error
    repair = run_cli("cache", "verify", "--store", store, "--repair")
    assert "dropped damaged item 'v03' from the packed files" in repair.stdout
    assert "2 problem(s), 2 repaired" in repair.stdout
    rerun = run_cli(*command)
    assert "summary: 1 done, 11 skipped" in rerun.stdout
    assert "0 problem(s)" in run_cli("cache", "verify", "--store", store).stdout
    again = Store(store).resolve("feat")
    assert again.item_path("v03").exists()  # recomputed as a loose file beside the pack
    for item_id, array in original.items():
        assert again.read_item(item_id).tobytes() == array.tobytes()
    run_cli("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "e")


def test_old_ledger_lines_without_checksums_still_read_and_verify(imported):
    store, _ = imported
    make_old(store, item_sums=False)
    verify = run_cli("cache", "verify", "--store", store)
    assert "0 problem(s)" in verify.stdout
    assert "note: 12 item(s) were written before featpipe kept checksums" in verify.stdout
    assert np.isfinite(Store(store).resolve("feat").read_item("v00")).all()


def rewrite_between_key_and_read(monkeypatch, rewrite) -> None:
    """Run ``rewrite()`` after the stage key was hashed and before any item is read: when the
    stage is opened (a file written by another program at that moment)."""
    real_stage = Store.stage

    def stage_then_rewrite(self, *args, **kwargs):
        stage = real_stage(self, *args, **kwargs)
        rewrite()
        return stage

    monkeypatch.setattr(Store, "stage", stage_then_rewrite)


def test_import_of_a_file_rewritten_after_its_key_fails_the_item_and_a_rerun_is_right(
        tmp_path, monkeypatch, cli):
    manifest = write_npy_dataset(tmp_path)
    target = tmp_path / "npy" / "v03.npy"
    original = target.read_bytes()
    rewrite_between_key_and_read(
        monkeypatch, lambda: np.save(target, np.full_like(np.load(target), 7.0)))
    command = ("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store",
               tmp_path / "s", "--name", "feat")
    error = one_line_error(cli(*command))
    assert "v03" in error and "changed after the stage key was computed" in error
    monkeypatch.undo()
    target.write_bytes(original)  # restored: the same key, and v03 is computed from it now
    cli(*command, check=True)
    stored = Store(tmp_path / "s").resolve("feat").read_item("v03")
    assert stored.tobytes() == np.load(target).tobytes()


def test_import_from_one_file_replaced_after_its_key_fails_the_item(tmp_path, monkeypatch,
                                                                     cli):
    manifest = write_npy_dataset(tmp_path)
    arrays = {f"v{i:02d}": np.load(tmp_path / "npy" / f"v{i:02d}.npy") for i in range(12)}
    source = tmp_path / "all.npz"
    np.savez(source, **arrays)

    def replace():  # another program writes a new version and renames it into place
        np.savez(tmp_path / "new.npz", **{k: v * 0 + 7 for k, v in arrays.items()})
        (tmp_path / "new.npz").replace(source)

    rewrite_between_key_and_read(monkeypatch, replace)
    error = one_line_error(cli("import", "--manifest", manifest, "--from", source, "--store",
                               tmp_path / "s", "--name", "feat"))
    assert "changed after the stage key was computed from it" in error and "all.npz" in error


def rewrite_once(monkeypatch, rewrite) -> None:
    """:func:`rewrite_between_key_and_read` for commands that open their stage twice (a
    planned one first): the file is rewritten once, after the key."""
    done = []

    def first_time():
        if not done:
            done.append(rewrite())

    rewrite_between_key_and_read(monkeypatch, first_time)


def test_extract_of_a_video_rewritten_after_its_key_fails_the_item(tmp_path, monkeypatch,
                                                                   cli):
    from tests.unit.test_video import write_video

    video = write_video(tmp_path / "a.mp4", n_frames=12, size=(96, 80))
    original = video.read_bytes()
    write_video(tmp_path / "b.mp4", n_frames=12, size=(96, 80))
    (tmp_path / "m.csv").write_text("id,path,label,split1\na,a.mp4,x,train\nb,b.mp4,y,train\n")
    rewrite_once(monkeypatch, lambda: write_video(video, n_frames=20, size=(96, 80)))
    command = ("extract", "-m", tmp_path / "m.csv", "-s", tmp_path / "s", "-f", "dsift",
               "-n", "ds", "--every", "5", "--sizes", "8", "--step", "8")
    error = one_line_error(cli(*command))
    assert error.startswith("error: ") and "a: its file changed after the stage key" in error
    monkeypatch.undo()
    video.write_bytes(original)
    rerun = cli(*command, check=True)
    assert "0 failed" in rerun.output  # a is computed from its own bytes now
    stage = Store(tmp_path / "s").resolve("ds")
    assert stage.extras_of("a")["timestamps"].tolist() == pytest.approx([0.0, 0.5, 1.0])


def test_extract_with_weights_rewritten_after_the_key_computes_nothing(tmp_path, monkeypatch,
                                                                       cli):
    torch = pytest.importorskip("torch")
    from featpipe.extract.vgg import load_vgg16
    from tests.unit.test_video import write_video

    write_video(tmp_path / "a.mp4", n_frames=4, size=(96, 80))
    (tmp_path / "m.csv").write_text("id,path,label,split1\na,a.mp4,x,train\n")
    weights = tmp_path / "vgg16.pth"
    state = load_vgg16("random:0").state_dict()
    torch.save(state, weights)

    def other_weights():
        state["classifier.0.bias"] += 1.0  # still a valid checkpoint, other numbers
        torch.save(state, weights)

    rewrite_once(monkeypatch, other_weights)
    result = cli("extract", "-m", tmp_path / "m.csv", "-s", tmp_path / "s", "-f", "vgg16-fc6",
                 "--weights", weights, "--frames", "1", "--resize", "72", "--crop", "64")
    error = one_line_error(result)
    assert f"--weights {weights} changed after the stage key was computed" in error
    stage = Store(tmp_path / "s").all_stages()[0]
    assert stage.done_ids() == set() and not list(stage.ledger())


def test_streamed_extract_items_carry_the_checksum_of_the_bytes_on_disk(tmp_path, cli):
    """Dense SIFT items are appended frame by frame (RowFile: header patched last): their
    ledger checksums are those of the files as they lie, and a flipped bit is found."""
    from featpipe.checksums import DamagedItem, npy_file_checksum
    from tests.unit.test_video import write_video

    write_video(tmp_path / "a.mp4", n_frames=12, size=(96, 80))
    (tmp_path / "m.csv").write_text("id,path,label,split1\na,a.mp4,x,train\n")
    cli("extract", "-m", tmp_path / "m.csv", "-s", tmp_path / "s", "-f", "dsift", "-n", "ds",
        "--every", "5", "--sizes", "8", "--step", "8", check=True)
    stage = Store(tmp_path / "s").resolve("ds")
    sums = stage.recorded_sums("a")
    assert set(sums) == {".npy"} | {f"+{k}.npy" for k in stage.extras_of("a")}
    assert {"+frame_index.npy", "+timestamps.npy"} <= set(sums)
    for suffix, value in sums.items():
        name = stage.item_path("a").name.replace(".npy", suffix)
        assert npy_file_checksum(stage.item_path("a").with_name(name)) == value
    assert "0 problem(s)" in cli("cache", "verify", "--store", tmp_path / "s").output
    flip_bit(stage.item_path("a"), 200)
    with pytest.raises(DamagedItem, match="checksum"):
        stage.read_item("a")
