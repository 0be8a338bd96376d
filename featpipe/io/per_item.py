"""A stage's items as one ``.npy`` per item in a folder, the layout other tools read
(``featpipe export NAME --per-item DIR``; video_features writes one ``.npy`` per video).

``DIR/<file id>.npy`` holds item ``id`` (``np.load(path, allow_pickle=False)``), each sidecar
``DIR/<file id>+<sidecar>.npy`` beside it (``+timestamps``: seconds of each frame), and
``DIR/index.csv`` lists them: ``id, file, label, split1..splitK, shape, dtype`` and one
column per sidecar (its file, empty where the item has none); ``label`` is ``;``-joined for
multi-label items, ``shape`` is ``12x6``.

The file id (:func:`file_stem`) is a reversible escaping of the id, safe for any id on any
disk, and the id itself where it is plain (UCF101's ``ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01``
is ``ApplyEyeMakeup/v_ApplyEyeMakeup_g01_c01.npy``, the layout ``featpipe import --from DIR``
reads back):

- ``/`` between non-empty parts is a folder (else ``%2f``); in each part ``A``-``Z``,
  ``a``-``z``, ``0``-``9``, ``_``, ``-`` and ``.`` are kept, any other character is its UTF-8
  bytes as ``%xx`` (lower-case hex: ``a b`` is ``a%20b``, ``é`` ``%c3%a9``), so names are
  ASCII (no Unicode normalisation can change them); a leading ``.`` is ``%2e`` (no hidden
  file, never ``.`` or ``..``), and so is the first letter of a name Windows reserves
  (``con``, ``nul``, ``com1``...: ``%63on``); a folder never ends with ``.`` or ``.npy``
  (its last ``.`` is ``%2e``), so it is never taken for a file.
- Ids whose names differ only in case (``Run/A`` and ``run/a``: one file on a
  case-insensitive disk, macOS's or Windows') are written case-safe instead: each upper-case
  letter is ``!`` and the letter in lower case (the Go module cache's rule: ``!run/!a``).
- A part longer than :data:`PART_CHARS` is cut into folders of that many characters, each
  ending with ``~`` (which escaping never writes): names stay under the 255 bytes of common
  file systems and still spell the whole id.

:func:`item_id` reads the id back from either form, so distinct ids never share a file and a
name never leaves DIR.  Every file is written atomically (a crash leaves no part file); the
index is written last, so it lists only whole files.  DIR must be new, empty, or hold an
earlier export (its ``index.csv``): the files of its items that this export does not hold are
removed once the new index is written.
"""

from __future__ import annotations

import csv
import io
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import numpy as np

from featpipe.errors import FeatpipeError
from featpipe.fileio import (
    SIDECAR_NAME,
    atomic_save_npy,
    atomic_write_bytes,
    check_outside_store,
    make_dirs,
    writing,
)
from featpipe.io.export import computed_ids
from featpipe.store import Stage

#: The index of a per-item export, in its folder.
INDEX = "index.csv"
#: Characters a file id keeps as they are (the case-safe form: lower case only).
_KEPT = frozenset("ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789_-.")
#: Names Windows reserves for devices, whatever their extension.
_RESERVED = frozenset({"con", "prn", "aux", "nul", *(f"com{i}" for i in range(1, 10)),
                       *(f"lpt{i}" for i in range(1, 10))})
#: Longest part (folder or file name, before its suffix) of a file id.
PART_CHARS = 200
#: The end of a folder of a long file id.
CONTINUED = "~"


def _byte_escaped(char: str) -> str:
    return "".join(f"%{byte:02x}" for byte in char.encode("utf-8", "surrogatepass"))


def _part(text: str, case_safe: bool, folder: bool) -> str:
    """One ``/``-separated part of an id, escaped (module docstring), and cut into
    :data:`PART_CHARS`-long pieces when long."""
    out = []
    for char in text:
        if char not in _KEPT:
            out.append(_byte_escaped(char))
        elif case_safe and "A" <= char <= "Z":
            out.append("!" + char.lower())
        else:
            out.append(char)
    if out[0] == ".":
        out[0] = "%2e"
    if folder and out[-1] == ".":
        out[-1] = "%2e"
    elif folder and "".join(out[-4:]).lower() == ".npy":
        out[-4] = "%2e"
    escaped = "".join(out)
    pieces = [escaped[i:i + PART_CHARS] for i in range(0, len(escaped), PART_CHARS)]
    for n, piece in enumerate(pieces):
        if piece.split(".")[0].lower() in _RESERVED:
            pieces[n] = _byte_escaped(piece[0]) + piece[1:]
    return "/".join([p + CONTINUED for p in pieces[:-1]] + pieces[-1:])


def file_stem(item_id: str, case_safe: bool = False) -> str:
    """The file id of ``item_id``: its path in the export folder without the suffix
    (module docstring); ``case_safe``: upper-case letters as ``!x``."""
    if not item_id:
        raise FeatpipeError("an empty item id has no file name")
    parts = item_id.split("/")
    if "" in parts:  # a/ or a//b: no empty folder name, so the slashes are escaped
        parts = [item_id]
    return "/".join(_part(p, case_safe, folder=n < len(parts) - 1)
                    for n, p in enumerate(parts))


def file_stems(ids: Sequence[str]) -> dict[str, str]:
    """The file id of each of ``ids``: as :func:`file_stem`, case-safe for the ids whose
    names would differ from another's only in case."""
    plain = {i: file_stem(i) for i in ids}
    folded: dict[str, list[str]] = {}
    for i, stem in plain.items():
        folded.setdefault(stem.lower(), []).append(i)
    twins = {i for group in folded.values() if len(group) > 1 for i in group}
    return {i: file_stem(i, case_safe=True) if i in twins else stem
            for i, stem in plain.items()}


def item_id(stem: str) -> str:
    """The item id a file id (:func:`file_stem`, either form) spells."""
    text = stem.replace(CONTINUED + "/", "")
    data = bytearray()
    i = 0
    while i < len(text):
        char = text[i]
        if char == "%":
            data.append(int(text[i + 1:i + 3], 16))
            i += 3
        elif char == "!":
            data.extend(text[i + 1].upper().encode("ascii"))
            i += 2
        else:
            data.extend(char.encode("ascii"))
            i += 1
    return data.decode("utf-8", "surrogatepass")


@dataclass
class PerItemExport:
    """What :func:`export_per_item` wrote: the folder, the items, the sidecars met, the
    items not computed, and the files of an earlier export it removed."""

    folder: Path
    n_items: int
    sidecars: list[str]
    missing: int
    removed: int


def _check_folder(folder: Path, store_root: Path) -> bool:
    """Whether ``folder`` holds an earlier export; refuse a file, the store, or a folder with
    other files in it."""
    check_outside_store(folder, "per_item", store_root)
    if folder.exists() and not folder.is_dir():
        raise FeatpipeError(f"--per-item {folder} is a file; give a folder")
    if (folder / INDEX).is_file():
        return True
    if folder.is_dir() and any(folder.iterdir()):
        raise FeatpipeError(f"--per-item {folder} holds files and no {INDEX} (not a featpipe "
                            "export); give a new or empty folder")
    return False


def _earlier_files(folder: Path) -> set[Path]:
    """The files the earlier export's index lists, named again from its ids and sidecar
    columns (a path written in the index is never followed)."""
    try:
        with open(folder / INDEX, newline="", encoding="utf-8") as handle:
            reader = csv.reader(handle)
            header = next(reader, [])
            rows = list(reader)
    except (OSError, UnicodeDecodeError, csv.Error) as err:
        raise FeatpipeError(f"--per-item {folder}: its {INDEX} is unreadable ({err}); remove "
                            "the folder or give another") from None
    sidecars = [h for h in header[header.index("dtype") + 1:] if SIDECAR_NAME.fullmatch(h)] \
        if "dtype" in header else []
    found = set()
    for row in rows:
        if len(row) < 2 or not row[0]:
            continue
        stem = row[1].removesuffix(".npy")
        if stem in (file_stem(row[0]), file_stem(row[0], case_safe=True)):
            found.add(folder / f"{stem}.npy")
            found.update(folder / f"{stem}+{name}.npy" for name in sidecars)
    return found


def _remove(paths: set[Path], folder: Path) -> int:
    """Remove the files ``paths`` and the folders of ``folder`` they leave empty."""
    removed = 0
    for path in sorted(paths):
        if not path.is_file():
            continue
        with writing(path, "remove"):
            path.unlink()
        removed += 1
        parent = path.parent
        while parent != folder and parent.is_relative_to(folder):
            try:
                parent.rmdir()
            except OSError:  # not empty
                break
            parent = parent.parent
    return removed


def _index_text(stage: Stage, rows: Sequence[tuple], sidecars: Sequence[str]) -> bytes:
    items = stage.items
    n_splits = items.n_splits or 1
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(["id", "file", "label", *(f"split{k}" for k in range(1, n_splits + 1)),
                     "shape", "dtype", *sidecars])
    for item, stem, shape, dtype, present in rows:
        writer.writerow([item, f"{stem}.npy", items[item].label,
                         *(items[item].split(k) for k in range(1, n_splits + 1)),
                         "x".join(str(n) for n in shape), dtype,
                         *(f"{stem}+{name}.npy" if name in present else "" for name in sidecars)])
    return out.getvalue().encode("utf-8")


def export_per_item(stage: Stage, folder: str | Path, partial: bool = False) -> PerItemExport:
    """Write each computed item of ``stage`` (and its sidecars) as ``.npy`` files into
    ``folder`` with their index (module docstring); an incomplete stage is refused unless
    ``partial``."""
    folder = Path(folder)
    ids, missing = computed_ids(stage, partial)
    if not ids:
        raise FeatpipeError(f"stage {stage.name} has no computed items to export")
    earlier = _check_folder(folder, stage.store.root)
    stale = _earlier_files(folder) if earlier else set()
    make_dirs(folder)
    if not earlier:  # the folder is an export from now on: a rerun after a crash may reuse it
        atomic_write_bytes(folder / INDEX, _index_text(stage, [], []))
    rows, written, sidecars = [], set(), {}
    stems = file_stems(ids)
    for item in ids:
        stem = stems[item]
        array = np.asarray(stage.read_item(item))
        extras = stage.extras_of(item)
        target = folder / f"{stem}.npy"
        make_dirs(target.parent)
        for name, values in sorted(extras.items()):
            path = folder / f"{stem}+{name}.npy"
            atomic_save_npy(path, np.asarray(values))
            written.add(path)
            sidecars.setdefault(name)
        atomic_save_npy(target, array)
        written.add(target)
        rows.append((item, stem, array.shape, str(array.dtype), set(extras)))
    atomic_write_bytes(folder / INDEX, _index_text(stage, rows, list(sidecars)))
    removed = _remove(stale - written, folder)
    return PerItemExport(folder, len(ids), list(sidecars), missing, removed)
