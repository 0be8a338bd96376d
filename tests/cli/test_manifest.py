"""Manifests: CSV model, `manifest build` (folder and official split files), `manifest check`."""

from pathlib import Path

import pytest

from featpipe.datasets import from_folder, from_hmdb51, from_hollywood2, from_ucf101, from_voc
from featpipe.errors import FeatpipeError
from featpipe.manifest import Manifest


def touch(path: Path, text: str = "x") -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)
    return path


def video(path: Path) -> Path:
    """A real two-frame video (`manifest check` opens each video's header)."""
    from tests.unit.test_video import write_video

    path.parent.mkdir(parents=True, exist_ok=True)
    return write_video(path, n_frames=2, size=(32, 24))


def rows(manifest: Manifest) -> dict:
    return {it.id: (it.path, it.labels, it.splits) for it in manifest}


# -- folder scan ---------------------------------------------------------------------------
def test_build_from_folder_labels_ids_extensions(tmp_path, cli):
    data = tmp_path / "videos"
    touch(data / "run" / "a.avi")
    touch(data / "run" / "sub" / "b.MP4")
    touch(data / "walk" / "a.avi")
    touch(data / "walk" / "notes.txt")
    touch(data / "top.avi")
    touch(data / "run" / "._a.avi")  # hidden: skipped
    touch(data / ".cache" / "z.avi")
    out = tmp_path / "manifests" / "videos.csv"
    result = cli("manifest", "build", data, "-o", out)
    assert result.exit_code == 0, result.output
    assert "4 items, 3 classes" in result.output
    manifest = Manifest.read(out)
    assert rows(manifest) == {
        "run/a": ("../videos/run/a.avi", ("run",), ("",)),
        "run/sub/b": ("../videos/run/sub/b.MP4", ("sub",), ("",)),
        "top": ("../videos/top.avi", (), ("",)),
        "walk/a": ("../videos/walk/a.avi", ("walk",), ("",)),
    }
    assert manifest.check() == []
    only_mp4 = from_folder(data, [".mp4"], labels_from_parent=False)
    assert rows(only_mp4) == {"run/sub/b": ("run/sub/b.MP4", (), ())}


def test_build_from_folder_refuses_colliding_ids(tmp_path, cli):
    touch(tmp_path / "d" / "c" / "x.avi")
    touch(tmp_path / "d" / "c" / "x.mp4")
    result = cli("manifest", "build", tmp_path / "d", "-o", tmp_path / "m.csv")
    assert result.exit_code == 1
    assert "'c/x.avi' and 'c/x.mp4' would share the id 'c/x'" in result.output
    assert not (tmp_path / "m.csv").exists()


# -- official split files -------------------------------------------------------------------
def write_ucf(lists: Path):
    # the official files use CRLF line ends
    touch(lists / "classInd.txt", "1 ApplyEyeMakeup\r\n2 Archery\r\n")
    touch(lists / "trainlist01.txt", "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1\r\n"
                                      "Archery/v_Archery_g08_c02.avi 2\r\n")
    touch(lists / "testlist01.txt", "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi\r\n"
                                     "Archery/v_Archery_g01_c01.avi\r\n")
    touch(lists / "trainlist02.txt", "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi 1\r\n"
                                      "Archery/v_Archery_g01_c01.avi 2\r\n")
    touch(lists / "testlist02.txt", "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi\r\n"
                                     "Archery/v_Archery_g08_c02.avi\r\n")


def test_ucf101_split_files(tmp_path):
    write_ucf(tmp_path / "ucfTrainTestlist")
    manifest = from_ucf101(tmp_path / "UCF-101", tmp_path / "ucfTrainTestlist")
    assert rows(manifest) == {
        "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01": (
            "ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi", ("ApplyEyeMakeup",), ("test", "train")),
        "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01": (
            "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi", ("ApplyEyeMakeup",), ("train", "test")),
        "Archery/v_Archery_g01_c01": (
            "Archery/v_Archery_g01_c01.avi", ("Archery",), ("test", "train")),
        "Archery/v_Archery_g08_c02": (
            "Archery/v_Archery_g08_c02.avi", ("Archery",), ("train", "test")),
    }
    assert manifest.n_splits == 2
    assert manifest.split_ids(2, "train") == ["ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01",
                                              "Archery/v_Archery_g01_c01"]


@pytest.mark.parametrize("bad_line, message", [
    ("Archery/v_Archery_g08_c02.avi 7", "trainlist01.txt:2: expected 'Class/video.avi INDEX'"),
    ("Archery/v_Archery_g08_c02.avi", "trainlist01.txt:2: expected 'Class/video.avi INDEX'"),
    ("Archery/v_Archery_g08_c02.avi 1",
     "trainlist01.txt:2: 'Archery/v_Archery_g08_c02.avi' is in folder 'Archery' but index 1 "
     "is class 'ApplyEyeMakeup'"),
])
def test_ucf101_malformed_lines_name_file_and_line(tmp_path, bad_line, message):
    lists = tmp_path / "lists"
    write_ucf(lists)
    touch(lists / "trainlist01.txt", "ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1\n"
                                      f"{bad_line}\n")
    with pytest.raises(FeatpipeError, match=message):
        from_ucf101(tmp_path, lists)


def test_hmdb51_split_files(tmp_path, cli):
    splits = tmp_path / "testTrainMulti_7030_splits"
    for k, codes in enumerate([("1", "2", "0"), ("2", "1", "1"), ("0", "1", "2")], start=1):
        touch(splits / f"brush_hair_test_split{k}.txt",
              f"April_09_brush_hair_u_nm_np1_ba_goo_0.avi {codes[0]} \n"
              f"Blonde_being_brushed_brush_hair_f_nm_np2_ri_med_0.avi {codes[1]} \n")
        touch(splits / f"cartwheel_test_split{k}.txt",
              f"(Rad)Schlag_die_Bank!_cartwheel_f_cm_np1_le_med_0.avi {codes[2]} \n")
    data = tmp_path / "hmdb51"
    touch(data / "brush_hair" / "April_09_brush_hair_u_nm_np1_ba_goo_0.avi")
    out = tmp_path / "hmdb.csv"
    result = cli("manifest", "build", data, "-o", out, "--splits", f"hmdb51:{splits}")
    assert result.exit_code == 0, result.output
    assert "warning: 2 listed files do not exist" in result.output
    manifest = Manifest.read(out)
    assert rows(manifest) == {
        "brush_hair/April_09_brush_hair_u_nm_np1_ba_goo_0": (
            "hmdb51/brush_hair/April_09_brush_hair_u_nm_np1_ba_goo_0.avi", ("brush_hair",),
            ("train", "test", "")),
        "brush_hair/Blonde_being_brushed_brush_hair_f_nm_np2_ri_med_0": (
            "hmdb51/brush_hair/Blonde_being_brushed_brush_hair_f_nm_np2_ri_med_0.avi",
            ("brush_hair",), ("test", "train", "train")),
        "cartwheel/(Rad)Schlag_die_Bank!_cartwheel_f_cm_np1_le_med_0": (
            "hmdb51/cartwheel/(Rad)Schlag_die_Bank!_cartwheel_f_cm_np1_le_med_0.avi",
            ("cartwheel",), ("", "train", "test")),
    }
    touch(splits / "cartwheel_test_split1.txt", "x.avi 3\n")
    with pytest.raises(FeatpipeError, match=r"cartwheel_test_split1.txt:1: expected "
                                            r"'video.avi 1\|2\|0', got 'x.avi 3'"):
        from_hmdb51(data, splits)


def test_hollywood2_clipsets_multilabel(tmp_path):
    root = tmp_path / "Hollywood2"
    (root / "AVIClips").mkdir(parents=True)
    clips = root / "ClipSets"
    touch(clips / "AnswerPhone_train.txt", "actioncliptrain00001  1\nactioncliptrain00002  -1\n")
    touch(clips / "Kiss_train.txt", "actioncliptrain00001  1\nactioncliptrain00002  1\n")
    touch(clips / "AnswerPhone_test.txt", "actioncliptest00001  -1\n")
    touch(clips / "Kiss_test.txt", "actioncliptest00001  1\n")
    touch(clips / "AnswerPhone_autotrain.txt", "actioncliptrain99999  1\n")
    touch(clips / "actions_train.txt", "actioncliptrain00001  1\n")
    manifest = from_hollywood2(root, root)
    assert rows(manifest) == {
        "actioncliptrain00001": ("AVIClips/actioncliptrain00001.avi", ("AnswerPhone", "Kiss"),
                                 ("train",)),
        "actioncliptrain00002": ("AVIClips/actioncliptrain00002.avi", ("Kiss",), ("train",)),
        "actioncliptest00001": ("AVIClips/actioncliptest00001.avi", ("Kiss",), ("test",)),
    }
    assert manifest.is_multilabel and manifest.classes == ["AnswerPhone", "Kiss"]
    touch(clips / "Kiss_test.txt", "actioncliptrain00001  1\n")
    with pytest.raises(FeatpipeError, match="in both train and test"):
        from_hollywood2(root, clips)
    touch(clips / "Kiss_test.txt", "actioncliptest00001  yes\n")
    with pytest.raises(FeatpipeError, match=r"Kiss_test.txt:1: expected 'NAME 1\|-1'"):
        from_hollywood2(root, clips)


def test_voc_imagesets(tmp_path, cli):
    voc = tmp_path / "VOC2007"
    main = voc / "ImageSets" / "Main"
    (voc / "JPEGImages").mkdir(parents=True)
    touch(main / "cat_train.txt", "000005 -1\n000007  1\n")
    touch(main / "cat_val.txt", "000009  0\n")
    touch(main / "cat_trainval.txt", "000005 -1\n000007  1\n000009  0\n")
    touch(main / "cat_test.txt", "000001  1\n")
    touch(main / "dog_train.txt", "000005  1\n000007  1\n")
    touch(main / "dog_val.txt", "000009  1\n")
    touch(main / "dog_trainval.txt", "000005  1\n000007  1\n000009  1\n")
    touch(main / "dog_test.txt", "000001 -1\n")
    touch(main / "train.txt", "000005\n000007\n")  # the class-less lists are ignored
    manifest = from_voc(voc, voc)
    assert rows(manifest) == {
        "000001": ("JPEGImages/000001.jpg", ("cat",), ("test", "")),
        "000005": ("JPEGImages/000005.jpg", ("dog",), ("train", "train")),
        "000007": ("JPEGImages/000007.jpg", ("cat", "dog"), ("train", "train")),
        "000009": ("JPEGImages/000009.jpg", ("dog",), ("train", "test")),  # cat 0: difficult
    }
    out = tmp_path / "voc.csv"
    result = cli("manifest", "build", voc, "-o", out, "--splits", f"voc:{main}")
    assert result.exit_code == 0, result.output
    assert Manifest.read(out).ids == ["000001", "000005", "000007", "000009"]
    assert "000007,VOC2007/JPEGImages/000007.jpg,cat;dog,train,train" in out.read_text()


def test_build_splits_usage_errors(tmp_path, cli):
    assert cli("manifest", "build", tmp_path, "-o", tmp_path / "m.csv",
               "--splits", "ucf101").exit_code == 2
    result = cli("manifest", "build", tmp_path, "-o", tmp_path / "m.csv",
                 "--splits", f"kinetics:{tmp_path}")
    assert result.exit_code == 1 and "unknown split format 'kinetics'" in result.output


# -- check ----------------------------------------------------------------------------------
def test_check_reports_every_problem_with_its_line(tmp_path, cli):
    video(tmp_path / "data" / "a.avi")
    video(tmp_path / "outside.avi")
    manifest = tmp_path / "data" / "m.csv"
    manifest.write_text(
        "id,path,label,split1,split2\n"          # 1
        "a,a.avi,run,train,test\n"               # 2 ok
        "b,a.avi,run,train,validation\n"         # 3 unknown split value
        "a,a.avi,run,train,test\n"               # 4 duplicate id
        "c,missing.avi,walk,test,\n"             # 5 missing file
        "d,a.avi,,train,\n"                      # 6 train row without label
        "e,../outside.avi,run,test,test\n"       # 7 outside the root (with --no-outside)
        "f,a.avi\n"                              # 8 too few fields
    )
    result = cli("manifest", "check", manifest, "--no-outside")
    assert result.exit_code == 1
    lines = [line for line in result.output.splitlines() if line.startswith(str(manifest))]
    found = [line[len(str(manifest)) + 1:] for line in lines]
    assert found == [
        "3: split2 value 'validation' for 'b' must be 'train', 'test' or empty",
        "4: duplicate id 'a' (first on line 2)",
        "5: file 'missing.avi' of 'c' does not exist",
        "6: 'd' is in a train split but has no label",
        f"7: path '../outside.avi' of 'e' is outside the manifest folder {manifest.parent}",
        "8: expected 5 fields, got 2",
    ]
    assert "6 problem(s)" in result.output
    allowed = cli("manifest", "check", manifest)
    assert "outside" not in allowed.output and allowed.exit_code == 1


def test_check_header_quotes_and_ok(tmp_path, cli):
    bad_header = tmp_path / "h.csv"
    bad_header.write_text("name,file,label\nx,y,z\n")
    result = cli("manifest", "check", bad_header)
    assert result.exit_code == 1
    assert f"{bad_header}:1: header must start with 'id,path,label'" in result.output
    quoted = tmp_path / "q.csv"
    quoted.write_text('id,path,label,split1\n"multi\nline id",a.avi,run,train\nz,"a.avi,run,test\n')
    video(tmp_path / "a.avi")
    result = cli("manifest", "check", quoted)
    assert result.exit_code == 1
    assert f"{quoted}:4: expected 4 fields, got 2 (unclosed quote?" in result.output
    good = tmp_path / "ok.csv"
    good.write_text("\ufeffid,path,label,split1\nx,a.avi,run;jump,train\n")
    result = cli("manifest", "check", good)
    assert result.exit_code == 0 and "ok (1 items, 2 classes" in result.output
    assert cli("manifest", "check", tmp_path / "nope.csv").exit_code == 1


def test_read_strict_names_the_line_and_roundtrip(tmp_path):
    path = tmp_path / "m.csv"
    path.write_text("id,path,label,split1\nx,a,l,train\nx,b,l,test\n")
    with pytest.raises(FeatpipeError, match=r"m.csv, line 3: duplicate id 'x'"):
        Manifest.read(path)
    path.write_text("id,path,label,split1,split2\né/1,sub/é.avi,a;b,train,\n"
                    "\"q,1\",/abs/x.avi,a,test,train\n")
    manifest = Manifest.read(path)
    copy = tmp_path / "other" / "copy.csv"
    manifest.write(copy)
    again = Manifest.read(copy)
    assert again.ids == ["é/1", "q,1"]
    assert again.resolve_path(again["é/1"]).resolve() == (tmp_path / "sub" / "é.avi").resolve()
    assert again["q,1"].path == "/abs/x.avi"
    assert again["é/1"].labels == ("a", "b") and again["q,1"].splits == ("test", "train")


# -- splits from a folder scan -------------------------------------------------------------
def split_layout(root: Path, parts=("train", "test"), classes=("run", "walk"), per_class=3):
    for part in parts:
        for label in classes:
            for i in range(per_class):
                touch(root / part / label / f"v{i}.avi")


def class_folders(root: Path, **counts: int) -> Path:
    """``root/<class>/v<i>.avi`` for each class and count."""
    for label, n in counts.items():
        for i in range(n):
            touch(root / label / f"v{i}.avi")
    return root


def test_train_test_folders_become_the_split_and_stay_in_the_ids(tmp_path, cli):
    split_layout(tmp_path / "d")
    result = cli("manifest", "build", tmp_path / "d", "-o", tmp_path / "m.csv")
    assert result.exit_code == 0, result.output
    assert "split folders train/ test/: split1 = train/test" in result.output
    assert "split1: 6 train, 6 test" in result.output and "warning" not in result.output
    manifest = Manifest.read(tmp_path / "m.csv")
    assert rows(manifest)["train/run/v0"] == ("d/train/run/v0.avi", ("run",), ("train",))
    assert rows(manifest)["test/walk/v2"] == ("d/test/walk/v2.avi", ("walk",), ("test",))
    assert manifest.n_splits == 1 and manifest.classes == ["run", "walk"]


def test_val_folder_is_split2_or_the_test_part(tmp_path):
    split_layout(tmp_path / "three", parts=("train", "Val", "test"))
    manifest = from_folder(tmp_path / "three")
    assert manifest.n_splits == 2
    assert rows(manifest)["train/run/v0"][2] == ("train", "train")
    assert rows(manifest)["test/run/v0"][2] == ("test", "")
    assert rows(manifest)["Val/run/v0"][2] == ("", "test")
    split_layout(tmp_path / "two", parts=("train", "validation"))
    manifest = from_folder(tmp_path / "two")
    assert manifest.n_splits == 1
    assert rows(manifest)["validation/walk/v1"][2] == ("test",)
    # a class that happens to be called 'train' among others is a class, not a split
    split_layout(tmp_path / "voc", parts=("x",), classes=("train", "bus"))
    voc = from_folder(tmp_path / "voc" / "x")
    assert voc.n_splits == 1 and {it.split(1) for it in voc} == {""}
    assert sorted(voc.classes) == ["bus", "train"]
    assert from_folder(tmp_path / "three", split_folders=False).n_splits == 1


def test_test_fraction_is_stratified_seeded_and_order_free(tmp_path, cli):
    from featpipe.datasets import with_test_fraction

    data = class_folders(tmp_path / "d", run=10, walk=5, jump=1)
    out = tmp_path / "m.csv"
    result = cli("manifest", "build", data, "-o", out, "--test-fraction", "0.3", "--seed", "7")
    assert result.exit_code == 0, result.output
    manifest = Manifest.read(out)
    test = {label: sum(it.split(1) == "test" for it in manifest if it.label == label)
            for label in ("run", "walk", "jump")}
    assert test == {"run": 3, "walk": 2, "jump": 0}  # round(0.3 n), one-item class stays train
    assert "split1: 11 train, 5 test" in result.output
    again = with_test_fraction(from_folder(data), 0.3, seed=7)
    assert [it.splits for it in again] == [it.splits for it in manifest]
    # the assignment of an item does not depend on the listing order
    shuffled = Manifest(list(reversed(from_folder(data).items)), data)
    assert {it.id: it.splits for it in with_test_fraction(shuffled, 0.3, 7)} == \
        {it.id: it.splits for it in manifest}
    other = with_test_fraction(from_folder(data), 0.3, seed=8)
    assert [it.splits for it in other] != [it.splits for it in manifest]


def test_folds_make_k_stratified_split_columns(tmp_path, cli):
    data = class_folders(tmp_path / "d", run=7, walk=5, jump=1)
    out = tmp_path / "m.csv"
    result = cli("manifest", "build", data, "-o", out, "--folds", "3")
    assert result.exit_code == 0, result.output
    manifest = Manifest.read(out)
    assert manifest.n_splits == 3
    for it in manifest:
        if it.label == "jump":
            assert it.splits == ("train",) * 3
        else:
            assert it.splits.count("test") == 1 and it.splits.count("train") == 2
    sizes = [len(manifest.split_ids(k, "test")) for k in (1, 2, 3)]
    assert sorted(sizes) == [4, 4, 4]
    for k in (1, 2, 3):
        run_test = [i for i in manifest.split_ids(k, "test") if i.startswith("run/")]
        assert len(run_test) in (2, 3)


@pytest.mark.parametrize("args, message", [
    (("--test-fraction", "0"), "0<x<1"),
    (("--test-fraction", "1.5"), "0<x<1"),
    (("--folds", "1"), "x>=2"),
    (("--folds", "3", "--test-fraction", "0.2"), "exclude each other"),
    (("--seed", "3"), "--seed applies to"),
])
def test_split_options_usage_errors(tmp_path, cli, args, message):
    touch(tmp_path / "d" / "run" / "a.avi")
    result = cli("manifest", "build", tmp_path / "d", "-o", tmp_path / "m.csv", *args)
    assert result.exit_code == 2 and message in result.output, result.output
    assert not (tmp_path / "m.csv").exists()


def test_split_folders_and_generated_splits_conflict(tmp_path, cli):
    split_layout(tmp_path / "d")
    result = cli("manifest", "build", tmp_path / "d", "-o", tmp_path / "m.csv", "--folds", "2")
    assert result.exit_code == 2 and "--no-split-folders" in result.output
    result = cli("manifest", "build", tmp_path / "d", "-o", tmp_path / "m.csv", "--folds", "2",
                 "--no-split-folders")
    assert result.exit_code == 0 and Manifest.read(tmp_path / "m.csv").n_splits == 2


def test_missing_train_or_test_rows_warn_on_stderr(tmp_path, cli):
    video(tmp_path / "d" / "run" / "a.avi")
    out = tmp_path / "m.csv"
    built = cli("manifest", "build", tmp_path / "d", "-o", out, check=True)
    warning = "warning: split1 has no train and no test rows"
    assert warning in built.stderr and warning not in built.stdout
    checked = cli("manifest", "check", out, check=True)
    assert checked.exit_code == 0 and warning in checked.stderr
    assert "ok (1 items" in checked.stdout
    quiet = cli("-q", "manifest", "check", out, check=True)
    assert quiet.stderr == "" and "ok (1 items" in quiet.stdout
    out.write_text("id,path,label,split1,split2\nx,d/run/a.avi,run,train,train\n")
    checked = cli("manifest", "check", out, check=True)
    assert "split1 has no test rows" in checked.stderr
    assert "split2 has no test rows" in checked.stderr


def test_a_folder_scan_lists_every_image_extract_reads(tmp_path):
    """One list of image suffixes: what `extract` reads as an image (webp included), a folder
    scan lists."""
    from featpipe.io.images import IMAGE_SUFFIXES, is_image

    for suffix in IMAGE_SUFFIXES:
        (tmp_path / "cls").mkdir(exist_ok=True)
        (tmp_path / "cls" / f"x{suffix[1:]}{suffix.upper()}").write_bytes(b"")
    manifest = from_folder(tmp_path)
    assert len(manifest.ids) == len(IMAGE_SUFFIXES)
    assert all(is_image(item.path) for item in manifest)


def test_a_header_only_manifest_is_a_problem_for_check_as_for_import(tmp_path, cli):
    """Issue 30: `manifest check` called a manifest without rows `ok` (exit 0) while `import`
    refused it; an empty manifest is an error in both."""
    empty = tmp_path / "m.csv"
    empty.write_text("id,path,label,split1\n")
    checked = cli("manifest", "check", empty)
    assert checked.exit_code == 1 and "ok" not in checked.stdout
    assert checked.stdout == f"{empty}:2: no items: the header is not followed by any row " \
                             "(import and extract refuse it)\n"
    (tmp_path / "npy").mkdir()
    imported = cli("import", "--manifest", empty, "--from", tmp_path / "npy", "--store",
                   tmp_path / "s", "--name", "e")
    assert imported.exit_code == 1 and "has no items" in imported.stderr
