"""Manifests from a folder of files and from the official split files of public datasets.

Every builder returns a :class:`~featpipe.manifest.Manifest` whose paths are relative to the
data folder ``root`` (``Manifest.write`` rewrites them relative to the CSV's folder).

Formats (the files as the dataset authors distribute them):

- **folder**: every file below ``root`` with a wanted extension (hidden ones skipped); id = its
  path relative to ``root`` without the extension; label = the name of its parent folder
  (optional).  When every file lies below a top-level ``train/`` folder and a ``test/`` or
  ``val/`` folder (``valid``, ``validation`` too, any case), those folders are the splits (and
  stay part of the ids): split1 = train/test; with both test and val, split2 = train/val (val
  plays the test part, as VOC's split2); with val but no test, split1 = train/val.
- **generated splits** (:func:`with_test_fraction`, :func:`with_folds`): stratified per
  class (the ``;``-joined label) and seeded; within a class, items are ordered by
  sha256(seed, id), so the assignment does not depend on the file system's listing order, the
  numpy version or the other items of other classes.
- **UCF101** (``ucfTrainTestlist/``): ``classInd.txt`` lines ``"1 ApplyEyeMakeup"``;
  ``trainlist0K.txt`` lines ``"ApplyEyeMakeup/v_ApplyEyeMakeup_g08_c01.avi 1"`` (1-based class
  index); ``testlist0K.txt`` lines ``"ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.avi"``.
  Split K comes from the K-th pair of lists.
- **HMDB51** (``testTrainMulti_7030_splits/``): ``<class>_test_split{1,2,3}.txt`` lines
  ``"name.avi 1|2|0"``: 1 train, 2 test, 0 unused in that split; videos at ``<class>/name.avi``.
- **Hollywood2** (``ClipSets/``): ``<action>_{train,test}.txt`` lines ``"clipname  1|-1"``;
  a clip's labels are the actions marked 1 (multi-label); clips at ``AVIClips/<clip>.avi``.
  One split: the ``_train`` files give train, the ``_test`` files give test.
- **PASCAL VOC** (``ImageSets/Main/``): ``<class>_{train,val,trainval,test}.txt`` lines
  ``"id  1|-1|0"``; labels are the classes marked 1 (0, "difficult only", is not a label);
  images at ``JPEGImages/<id>.jpg``.  split1 = trainval/test, split2 = train/val (each only
  when its files exist).
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Iterable
from pathlib import Path

from featpipe.errors import FeatpipeError
from featpipe.io.images import IMAGE_SUFFIXES as IMAGE_EXTENSIONS
from featpipe.manifest import Manifest, ManifestItem, from_rows
from featpipe.suggest import did_you_mean

VIDEO_EXTENSIONS = (".avi", ".mp4", ".mkv", ".mov", ".webm", ".mpg", ".mpeg", ".m4v")
SPLIT_FORMATS = ("ucf101", "hmdb51", "hollywood2", "voc")
#: Top-level folder names (lower case) that a folder scan reads as splits.
SPLIT_FOLDERS = {"train": "train", "test": "test", "val": "val", "valid": "val",
                 "validation": "val"}


def _lines(path: Path) -> list[tuple[int, list[str]]]:
    """Non-empty lines of a split file as (line number, whitespace-separated fields)."""
    try:
        text = path.read_text(encoding="utf-8", errors="strict")
    except FileNotFoundError:
        raise FeatpipeError(f"split file {path} does not exist") from None
    except UnicodeDecodeError as err:
        raise FeatpipeError(f"split file {path} is not UTF-8 ({err.reason})") from None
    return [(n, line.split()) for n, line in enumerate(text.splitlines(), start=1)
            if line.strip()]


def _bad(path: Path, lineno: int, message: str) -> FeatpipeError:
    return FeatpipeError(f"{path}:{lineno}: {message}")


def _strip_ext(name: str) -> str:
    return name.rsplit(".", 1)[0] if "." in Path(name).name else name


def _numbered(folder: Path, pattern: str) -> dict[int, Path]:
    """Files in ``folder`` matching ``pattern`` (a regex with one group: the split number)."""
    found = {}
    for path in folder.iterdir() if folder.is_dir() else ():
        match = re.fullmatch(pattern, path.name)
        if match:
            found[int(match.group(1))] = path
    return found


def _subfolder(root: Path, name: str) -> str:
    """``name/`` when the data folder holds that subfolder (the dataset's own layout), else ''."""
    return f"{name}/" if (root / name).is_dir() else ""


def from_folder(root: str | Path, extensions: Iterable[str] = VIDEO_EXTENSIONS + IMAGE_EXTENSIONS,
                labels_from_parent: bool = True, split_folders: bool = True) -> Manifest:
    """Every file below ``root`` with one of ``extensions``; ids are relative paths without
    extension (two files that differ only by extension are an error, not a silent overwrite).

    With ``split_folders``, a ``train/`` + ``test/`` (or ``val/``) layout gives the split
    columns (module docstring); otherwise the one split column is empty.
    """
    root = Path(root)
    if not root.is_dir():
        raise FeatpipeError(f"{root} is not a folder")
    wanted = {e.lower() if e.startswith(".") else "." + e.lower() for e in extensions}
    rows, seen = [], {}
    for path in sorted(p for p in root.rglob("*") if p.is_file()):
        if path.suffix.lower() not in wanted:
            continue
        if any(part.startswith(".") for part in path.relative_to(root).parts):
            continue  # hidden files and folders (macOS "._x.avi" forks, .git ...)
        rel = path.relative_to(root).as_posix()
        item_id = rel[: -len(path.suffix)]
        if item_id in seen:
            raise FeatpipeError(f"files {seen[item_id]!r} and {rel!r} would share the id "
                                f"{item_id!r}; keep one or restrict --ext")
        seen[item_id] = rel
        parent = path.parent.relative_to(root)
        label = [parent.name] if labels_from_parent and parent.parts else []
        rows.append((item_id, rel, label, []))
    if not rows:
        raise FeatpipeError(f"no files with extensions {sorted(wanted)} under {root}")
    parts = split_folder_parts([rel for _, rel, _, _ in rows]) if split_folders else None
    if parts is None:
        return from_rows(rows, root, n_splits=1)
    columns = _split_columns(set(parts))
    rows = [(i, rel, label, [column.get(part, "") for column in columns])
            for (i, rel, label, _), part in zip(rows, parts, strict=True)]
    return from_rows(rows, root, n_splits=len(columns))


def split_folder_parts(paths: Iterable[str]) -> list[str] | None:
    """The split part (``train``, ``test``, ``val``) of each relative path when the paths form a
    split-folder layout (every path below a split folder, ``train`` and ``test`` or ``val``
    among them), else ``None``."""
    parts = []
    for rel in paths:
        top, sep, _ = rel.partition("/")
        if not sep or top.lower() not in SPLIT_FOLDERS:
            return None
        parts.append(SPLIT_FOLDERS[top.lower()])
    found = set(parts)
    return parts if "train" in found and found & {"test", "val"} else None


def _split_columns(found: set[str]) -> list[dict[str, str]]:
    """Split columns (folder part -> membership) for the split folders present."""
    if "test" not in found:
        return [{"train": "train", "val": "test"}]
    columns = [{"train": "train", "test": "test"}]
    if "val" in found:
        columns.append({"train": "train", "val": "test"})
    return columns


def describe_split_folders(manifest: Manifest) -> str | None:
    """One line saying how split folders became split columns (None when they did not)."""
    parts = split_folder_parts(it.path for it in manifest)
    if parts is None:
        return None
    found = set(parts)
    names = [f"{name}/" for name in ("train", "test", "val") if name in found]
    columns = ["split1 = train/val" if "test" not in found else "split1 = train/test"]
    if {"test", "val"} <= found:
        columns.append("split2 = train/val")
    return f"split folders {' '.join(names)}: {', '.join(columns)}"


def _stratified_order(manifest: Manifest, seed: int) -> list[list[ManifestItem]]:
    """Items grouped by class (the joined label, sorted), each group in sha256(seed, id)
    order."""
    groups: dict[str, list[ManifestItem]] = {}
    for it in manifest:
        groups.setdefault(it.label, []).append(it)

    def rank(it: ManifestItem) -> str:
        return hashlib.sha256(f"{seed}\0{it.id}".encode("utf-8", "surrogatepass")).hexdigest()

    return [sorted(groups[label], key=rank) for label in sorted(groups)]


def _with_splits(manifest: Manifest, splits: dict[str, list[str]], n_splits: int) -> Manifest:
    items = [ManifestItem(it.id, it.path, it.labels, tuple(splits[it.id]), it.line)
             for it in manifest]
    return Manifest(items, manifest.root, n_splits, manifest.source)


def with_test_fraction(manifest: Manifest, fraction: float, seed: int = 0) -> Manifest:
    """One split column: round(``fraction`` x n) items of each class are test, the rest
    train; a class of n >= 2 items keeps at least one item on each side, a class of one item
    is train only (a test class needs train items)."""
    if not 0 < fraction < 1:
        raise FeatpipeError(f"test fraction must be in (0, 1), got {fraction}")
    splits = {}
    for group in _stratified_order(manifest, seed):
        n_test = min(len(group) - 1, max(1, round(fraction * len(group))))
        for position, it in enumerate(group):
            splits[it.id] = ["test" if position < n_test else "train"]
    return _with_splits(manifest, splits, 1)


def with_folds(manifest: Manifest, folds: int, seed: int = 0) -> Manifest:
    """``folds`` split columns (stratified k-fold): the items of each class are dealt to the
    folds in turn, continuing from where the previous class stopped (fold sizes differ by
    at most one); split k tests fold k and trains on the others.  A class of one item is
    train in every split (a test class needs train items)."""
    if folds < 2:
        raise FeatpipeError(f"folds must be at least 2, got {folds}")
    fold_of, dealt = {}, 0
    for group in _stratified_order(manifest, seed):
        for it in group:
            fold_of[it.id] = dealt % folds if len(group) > 1 else None
            dealt += len(group) > 1
    splits = {item_id: ["test" if fold == k else "train" for k in range(folds)]
              for item_id, fold in fold_of.items()}
    return _with_splits(manifest, splits, folds)


def from_ucf101(root: str | Path, lists: str | Path) -> Manifest:
    """UCF101 from ``classInd.txt``, ``trainlist0K.txt`` and ``testlist0K.txt`` in ``lists``."""
    root, lists = Path(root), Path(lists)
    class_file = lists / "classInd.txt"
    classes: dict[int, str] = {}
    for lineno, fields in _lines(class_file):
        if len(fields) != 2 or not fields[0].isdigit():
            raise _bad(class_file, lineno, f"expected 'INDEX CLASS', got {' '.join(fields)!r}")
        classes[int(fields[0])] = fields[1]
    known = set(classes.values())
    trains = _numbered(lists, r"trainlist0*(\d+)\.txt")
    tests = _numbered(lists, r"testlist0*(\d+)\.txt")
    if not trains:
        raise FeatpipeError(f"no trainlist0K.txt in {lists}")
    n_splits = max(trains)
    membership: dict[str, list[str]] = {}
    labels: dict[str, str] = {}

    def add(video: str, label: str, k: int, part: str, path: Path, lineno: int):
        if label not in known:
            raise _bad(path, lineno, f"class {label!r} is not in {class_file.name}")
        if labels.setdefault(video, label) != label:
            raise _bad(path, lineno, f"{video!r} has class {label!r} here but {labels[video]!r} "
                                     "elsewhere")
        splits = membership.setdefault(video, [""] * n_splits)
        if splits[k - 1] not in ("", part):
            raise _bad(path, lineno, f"{video!r} is both train and test in split {k}")
        splits[k - 1] = part

    for k in range(1, n_splits + 1):
        if k not in trains:
            raise FeatpipeError(f"{lists}: trainlist{k:02d}.txt is missing (found "
                                f"{sorted(trains)})")
        for lineno, fields in _lines(trains[k]):
            if len(fields) != 2 or not fields[1].isdigit() or int(fields[1]) not in classes:
                raise _bad(trains[k], lineno, "expected 'Class/video.avi INDEX' with an index "
                                              f"from classInd.txt, got {' '.join(fields)!r}")
            label = classes[int(fields[1])]
            if "/" in fields[0] and fields[0].split("/", 1)[0] != label:
                raise _bad(trains[k], lineno, f"{fields[0]!r} is in folder "
                                              f"{fields[0].split('/', 1)[0]!r} but index "
                                              f"{fields[1]} is class {label!r}")
            add(fields[0], label, k, "train", trains[k], lineno)
        for lineno, fields in _lines(tests[k]) if k in tests else ():
            if len(fields) != 1 or "/" not in fields[0]:
                raise _bad(tests[k], lineno, f"expected 'Class/video.avi', got "
                                             f"{' '.join(fields)!r}")
            add(fields[0], fields[0].split("/", 1)[0], k, "test", tests[k], lineno)
    rows = [(_strip_ext(v), v, [labels[v]], membership[v]) for v in sorted(membership)]
    return from_rows(rows, root, n_splits=n_splits)


def from_hmdb51(root: str | Path, splits_dir: str | Path) -> Manifest:
    """HMDB51 from ``<class>_test_split{1,2,3}.txt`` (1 train, 2 test, 0 unused)."""
    root, splits_dir = Path(root), Path(splits_dir)
    files = {}
    for path in sorted(splits_dir.glob("*_test_split*.txt")):
        match = re.fullmatch(r"(.+)_test_split(\d+)\.txt", path.name)
        if match:
            files[(match.group(1), int(match.group(2)))] = path
    if not files:
        raise FeatpipeError(f"no <class>_test_splitK.txt files in {splits_dir}")
    n_splits = max(k for _, k in files)
    codes = {"1": "train", "2": "test", "0": ""}
    membership: dict[tuple[str, str], list[str]] = {}
    for (label, k), path in files.items():
        for lineno, fields in _lines(path):
            if len(fields) != 2 or fields[1] not in codes:
                raise _bad(path, lineno, f"expected 'video.avi 1|2|0', got {' '.join(fields)!r}")
            splits = membership.setdefault((label, fields[0]), [""] * n_splits)
            splits[k - 1] = codes[fields[1]]
    rows = [(f"{label}/{_strip_ext(video)}", f"{label}/{video}", [label], splits)
            for (label, video), splits in sorted(membership.items())]
    return from_rows(rows, root, n_splits=n_splits)


def _binary_lists(folder: Path, parts: Iterable[str], values: dict[str, int]
                  ) -> dict[str, dict[str, dict[str, int]]]:
    """``<class>_<part>.txt`` files -> {part: {item: {class: value}}} for the given parts."""
    table: dict[str, dict[str, dict[str, int]]] = {}
    pattern = re.compile(r"(.+)_(" + "|".join(parts) + r")\.txt")
    for path in sorted(folder.glob("*.txt")):
        match = pattern.fullmatch(path.name)
        if not match or match.group(1) in ("actions", "scenes"):
            continue
        label, part = match.groups()
        for lineno, fields in _lines(path):
            if len(fields) != 2 or fields[1] not in values:
                raise _bad(path, lineno, f"expected 'NAME {'|'.join(values)}', got "
                                         f"{' '.join(fields)!r}")
            table.setdefault(part, {}).setdefault(fields[0], {})[label] = values[fields[1]]
    return table


def from_hollywood2(root: str | Path, clipsets: str | Path) -> Manifest:
    """Hollywood2 actions from ``ClipSets/<action>_{train,test}.txt`` (multi-label)."""
    root, clipsets = Path(root), Path(clipsets)
    if (clipsets / "ClipSets").is_dir():
        clipsets = clipsets / "ClipSets"
    table = _binary_lists(clipsets, ("train", "test"), {"1": 1, "-1": -1})
    if not table:
        raise FeatpipeError(f"no <action>_train.txt / <action>_test.txt files in {clipsets}")
    both = set(table.get("train", {})) & set(table.get("test", {}))
    if both:
        raise FeatpipeError(f"{clipsets}: clip {sorted(both)[0]!r} is listed in both train and "
                            "test files")
    prefix = _subfolder(root, "AVIClips")
    rows = []
    for part in ("train", "test"):
        for clip, marks in sorted(table.get(part, {}).items()):
            labels = sorted(label for label, value in marks.items() if value == 1)
            rows.append((clip, f"{prefix}{clip}.avi", labels, [part]))
    return from_rows(rows, root, n_splits=1)


def from_voc(root: str | Path, imagesets: str | Path) -> Manifest:
    """PASCAL VOC classification from ``ImageSets/Main/<class>_{train,val,trainval,test}.txt``."""
    root, imagesets = Path(root), Path(imagesets)
    for sub in ("ImageSets/Main", "Main"):
        if (imagesets / sub).is_dir():
            imagesets = imagesets / sub
            break
    table = _binary_lists(imagesets, ("train", "val", "trainval", "test"),
                          {"1": 1, "-1": -1, "0": 0})
    if not table:
        raise FeatpipeError(f"no <class>_trainval.txt / <class>_test.txt files in {imagesets}")
    designs = [("trainval", "test"), ("train", "val")]
    designs = [d for d in designs if d[0] in table]
    if not designs:
        raise FeatpipeError(f"{imagesets}: no <class>_trainval.txt or <class>_train.txt files")
    images: dict[str, dict[str, int]] = {}
    for marks_by_image in table.values():
        for image, marks in marks_by_image.items():
            images.setdefault(image, {}).update(marks)
    prefix = _subfolder(root, "JPEGImages")
    rows = []
    for image in sorted(images):
        labels = sorted(label for label, value in images[image].items() if value == 1)
        splits = []
        for train, test in designs:
            in_train, in_test = image in table.get(train, {}), image in table.get(test, {})
            if in_train and in_test:
                raise FeatpipeError(f"{imagesets}: image {image!r} is in both {train} and "
                                    f"{test}")
            splits.append("train" if in_train else "test" if in_test else "")
        rows.append((image, f"{prefix}{image}.jpg", labels, splits))
    return from_rows(rows, root, n_splits=len(designs))


def from_split_files(fmt: str, root: str | Path, path: str | Path) -> Manifest:
    """Dispatch ``--splits FORMAT:PATH`` to the converter of that dataset."""
    builders = {"ucf101": from_ucf101, "hmdb51": from_hmdb51, "hollywood2": from_hollywood2,
                "voc": from_voc}
    if fmt not in builders:
        hint = did_you_mean(fmt, builders)
        raise FeatpipeError(f"unknown split format {fmt!r}; {hint + ' ' if hint else ''}use one "
                            f"of {', '.join(builders)}")
    if not Path(path).is_dir():
        raise FeatpipeError(f"--splits {fmt}:{path}: not a folder")
    return builders[fmt](root, path)
