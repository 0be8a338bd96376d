"""Per-item feature arrays from files made elsewhere: a folder of ``.npy`` or ``.mat`` files,
an ``.npz``, an HDF5 file, a MATLAB ``.mat`` file, or an aeon/sktime ``.ts`` file.

How an item id finds its array in each source:

- folder (``npy-dir``): ``FOLDER/<id>.npy`` (ids with ``/`` are subfolders); else
  ``FOLDER/<flat id>.npy`` where the flat id replaces every character outside
  ``[A-Za-z0-9._-]`` by ``_`` (used only when no other id has the same flat form); else
  ``FOLDER/<manifest path with its extension replaced by .npy>``; each of these with ``.mat``
  instead of ``.npy`` too (``.npy`` first).  A per-item ``.mat`` file holds one numeric
  variable, or the one named by ``mat_variable``.
- ``.npz``: the key equal to the id.  HDF5 (``.h5``/``.hdf5``): the dataset at path ``id``.
- ``.mat`` (v5 through scipy, v7.3 through h5py): the variable named like the id, else its
  MATLAB form (characters outside ``[A-Za-z0-9_]`` become ``_``, when no other id shares it).
  Matrices read as MATLAB shows them: rows are frames (T x D), the layout of VideoDarwin's
  ``VideoDarwin(data)`` ("row vector data matrix", ``size(data,1)`` frames);
  ``transpose=True`` (``--transpose``) reads one frame per column (VLFeat's D x N
  descriptors).
- ``.ts``: case ``i`` (0-based) of ``NAME.ts`` has id ``NAME/<i>`` (zero-padded to the width of
  the case count); its array is ``T x channels`` (aeon stores ``channels x T``).

Every array is checked before it is written: numeric (integers become floats), not empty,
finite, and with the same feature shape as the other items (``shape[1:]`` for sequences,
``shape`` for vectors); the reference shape is the most common one over all items of the
import, read from the files' headers, so every shard of a run agrees on it.  Two items that
would read the same ``.npy`` file are refused before anything is computed.
"""

from __future__ import annotations

import functools
import hashlib
import json
import logging
import os
import re
import zipfile
from collections import Counter
from collections.abc import Sequence
from pathlib import Path

import numpy as np

from featpipe.content import ContentHashes, changed_since_key, sha256_of, stat_record
from featpipe.errors import FeatpipeError, ItemError
from featpipe.fileio import check_h5_dataset, check_npy_header, first_line, npy_from_bytes
from featpipe.io import matlab
from featpipe.manifest import Manifest, ManifestItem, from_rows, normalisation_note
from featpipe.parallel import ItemOutput

log = logging.getLogger(__name__)
FORMATS = ("npy-dir", "npz", "h5", "mat", "ts")
#: Per-item file extensions a folder source tries, in this order.
FOLDER_EXTENSIONS = (".npy", ".mat")
_FLAT = re.compile(r"[^A-Za-z0-9._-]")
#: (ndim, feature shape): feature shape is shape[1:] for ndim >= 2 and shape for vectors.
Signature = tuple[int, tuple[int, ...]]


def detect_format(path: str | Path) -> str:
    """The source format of ``path`` from its kind and extension."""
    path = Path(path)
    if not path.exists():
        raise FeatpipeError(f"--from {path}: no such file or folder")
    if path.is_dir():
        return "npy-dir"
    suffix = path.suffix.lower()
    formats = {".npz": "npz", ".h5": "h5", ".hdf5": "h5", ".hdf": "h5", ".mat": "mat",
               ".ts": "ts"}
    if suffix not in formats:
        raise FeatpipeError(f"--from {path}: unknown format; expected a folder of .npy or .mat "
                            "files, an .npz, an HDF5 (.h5/.hdf5), a MATLAB .mat or an aeon .ts "
                            "file")
    return formats[suffix]


def signature(shape: Sequence[int]) -> Signature:
    shape = tuple(int(n) for n in shape)
    return (len(shape), shape[1:] if len(shape) >= 2 else shape)


def describe(sig: Signature) -> str:
    ndim, feature = sig
    if ndim == 1:
        return f"vectors of shape {feature}"
    return "arrays of shape (N, " + ", ".join(map(str, feature)) + ")"


class NpyDirSource:
    """A folder with one ``.npy`` or ``.mat`` file per item."""

    fmt = "npy-dir"

    def __init__(self, folder: Path, manifest: Manifest | None, mat_variable: str | None = None):
        self.path = Path(folder)
        self.root = manifest.root.resolve() if manifest is not None else None
        flats = Counter(_FLAT.sub("_", i) for i in (manifest.ids if manifest else ()))
        self._unique_flat = {f for f, n in flats.items() if n == 1}
        self.mat_variable = mat_variable

    def _candidates(self, item: ManifestItem) -> list[Path]:
        return [stem.with_name(stem.name[:-4] + ext) for stem in self._npy_candidates(item)
                for ext in FOLDER_EXTENSIONS]

    def _npy_candidates(self, item: ManifestItem) -> list[Path]:
        found = []
        rel = Path(item.id)
        if item.id and not rel.is_absolute() and ".." not in rel.parts:
            found.append(self.path / (item.id + ".npy"))
        flat = _FLAT.sub("_", item.id)
        if flat in self._unique_flat:
            found.append(self.path / (flat + ".npy"))
        if item.path and self.root is not None:
            path = Path(item.path)
            if path.is_absolute():
                try:
                    path = path.resolve().relative_to(self.root)
                except ValueError:
                    path = None
            if path is not None and ".." not in path.parts:
                found.append(self.path / path.with_suffix(".npy"))
        return found

    def locate(self, item: ManifestItem) -> Path | None:
        return next((p for p in self._candidates(item) if _is_file(p)), None)

    def header(self, item: ManifestItem):
        path = self.locate(item)
        if path is None:
            return None
        if path.suffix == ".mat":
            return matlab.numeric_variables(path)[self._mat_name(item, path)]
        with open(path, "rb") as handle:
            return check_npy_header(handle, os.fstat(handle.fileno()).st_size)

    def _mat_name(self, item: ManifestItem, path: Path) -> str:
        """The variable of a per-item ``.mat`` file: ``mat_variable``, else the only one."""
        found = matlab.numeric_variables(path)
        if self.mat_variable is not None:
            if self.mat_variable not in found:
                raise ItemError(item.id, f"{path} has no numeric variable "
                                         f"{self.mat_variable!r} (it has: "
                                         f"{', '.join(found) or 'none'})")
            return self.mat_variable
        if len(found) != 1:
            raise ItemError(item.id, f"{path} holds {len(found)} numeric variables "
                                     f"({', '.join(found) or 'none'}); choose one with "
                                     "--mat-variable NAME")
        return next(iter(found))

    def read_hashed(self, item: ManifestItem) -> tuple[np.ndarray, str]:
        """The item's array and the SHA-256 of the bytes it was read from: an ``.npy`` is read
        once, hashed, then parsed; a ``.mat`` (opened several times by its readers) is
        hashed after it is read, so a change meanwhile shows too."""
        path = self.locate(item)
        try:
            if path.suffix == ".mat":
                array = matlab.read_variable(path, self._mat_name(item, path))
                return array, sha256_of(path)
            data = path.read_bytes()
            return npy_from_bytes(data), hashlib.sha256(data).hexdigest()
        except FeatpipeError as err:
            raise ItemError(item.id, err.cause) from None
        except (OSError, ValueError, EOFError) as err:
            raise ItemError(item.id, f"cannot read {path}: {first_line(err)}") from None

    def describe_missing(self, item: ManifestItem) -> str:
        paths = self._candidates(item)
        too_long = " (file name too long for this file system)" if any(
            _is_file(p) is None for p in paths) else ""
        twins = "".join(dict.fromkeys(normalisation_note(p) for p in paths))
        return ("none of " + ", ".join(str(p)[:300] for p in paths)
                + f" (formats tried: {', '.join(FOLDER_EXTENSIONS)}){too_long}{twins}")


def _is_file(path: Path) -> bool | None:
    """``path.is_file()``, or ``None`` when the name cannot exist (too long, invalid)."""
    try:
        return path.is_file()
    except (OSError, ValueError):
        return None


class NpzSource:
    """An ``.npz`` archive whose keys are item ids."""

    fmt = "npz"

    def __init__(self, path: Path):
        self.path = Path(path)
        self.opened = stat_record(os.stat(self.path))
        try:
            self._zip = zipfile.ZipFile(self.path)
        except (OSError, zipfile.BadZipFile) as err:
            raise FeatpipeError(f"--from {self.path}: not a readable .npz ({first_line(err)})") \
                from None
        self._members = {n[:-4]: n for n in self._zip.namelist() if n.endswith(".npy")}

    def locate(self, item: ManifestItem) -> str | None:
        return self._members.get(item.id)

    def header(self, item: ManifestItem):
        member = self.locate(item)
        if member is None:
            return None
        with self._zip.open(member) as handle:
            return check_npy_header(handle, self._zip.getinfo(member).file_size)

    def read(self, item: ManifestItem) -> np.ndarray:
        try:
            self.header(item)
            with self._zip.open(self._members[item.id]) as handle:
                return np.lib.format.read_array(handle, allow_pickle=False)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise ItemError(item.id, f"cannot read key {item.id!r} of {self.path}: "
                                     f"{first_line(err)}") from None

    def describe_missing(self, item: ManifestItem) -> str:
        return f"no key {item.id!r} in {self.path}"


class H5Source:
    """An HDF5 file with one dataset per item, at the path given by the id."""

    fmt = "h5"

    def __init__(self, path: Path):
        import h5py

        self.path = Path(path)
        self.opened = stat_record(os.stat(self.path))
        try:
            self._file = h5py.File(self.path, "r")
        except OSError as err:
            raise FeatpipeError(f"--from {self.path}: not a readable HDF5 file "
                                f"({first_line(err)})") from None

    @staticmethod
    def dataset_path(item_id: str) -> str:
        """The HDF5 path an id names, normalised: ``a//b``, ``./a/b``, ``a/b/`` and ``/a/b``
        are ``/a/b`` (``..`` is refused: HDF5 has no parent links)."""
        parts = [p for p in item_id.split("/") if p not in ("", ".")]
        if ".." in parts:
            raise ItemError(item_id, "'..' in an HDF5 dataset path")
        return "/" + "/".join(parts)

    def locate(self, item: ManifestItem):
        """The dataset of ``item``, or ``None``; a dataset whose data are in another file is
        refused, naming the link or the storage."""
        import h5py

        path = self.dataset_path(item.id)
        if path == "/":
            return None
        group = self._file
        try:
            for part in path.strip("/").split("/"):
                link = group.get(part, getlink=True)
                if isinstance(link, h5py.ExternalLink):
                    raise FeatpipeError(f"{self.path}: {group.name.rstrip('/')}/{part} is an "
                                        f"external link to {link.filename}:{link.path} (item "
                                        f"{item.id!r}); featpipe does not follow them (their "
                                        "content is not keyed): copy the data into the file")
                group = group.get(part)
                if group is None:
                    return None
        except (KeyError, ValueError, OSError):
            return None
        if not isinstance(group, h5py.Dataset):
            return None
        if group.is_virtual or group.id.get_create_plist().get_external_count():
            what = "a virtual dataset" if group.is_virtual else "stored in external files"
            raise FeatpipeError(f"{self.path}: dataset {group.name} (item {item.id!r}) is "
                                f"{what}; featpipe does not read data outside the file (their "
                                "content is not keyed): copy the data into the file")
        return group

    def header(self, item: ManifestItem):
        node = self.locate(item)
        if node is None:
            return None
        check_h5_dataset(node, item.id)
        return node.shape, node.dtype

    def read(self, item: ManifestItem) -> np.ndarray:
        node = self.locate(item)
        if node.dtype.kind not in "biuf":
            raise ItemError(item.id, f"dataset {node.name!r} of {self.path} has non-numeric dtype "
                                     f"{node.dtype}")
        try:
            check_h5_dataset(node, item.id)
            return np.asarray(node[()])
        except (OSError, ValueError, TypeError) as err:
            raise ItemError(item.id, f"cannot read dataset {item.id!r} of {self.path}: "
                                     f"{first_line(err)}") from None

    def describe_missing(self, item: ManifestItem) -> str:
        return f"no dataset {item.id!r} in {self.path}"


class MatSource:
    """A MATLAB ``.mat`` file (v5 or v7.3) with one numeric variable per item."""

    fmt = "mat"

    def __init__(self, path: Path, manifest: Manifest | None):
        self.path = Path(path)
        self.opened = stat_record(os.stat(self.path))
        self._variables = matlab.numeric_variables(self.path)
        names = Counter(matlab.matlab_name(i) for i in (manifest.ids if manifest else ()))
        self._unique = {n for n, count in names.items() if count == 1}

    def locate(self, item: ManifestItem) -> str | None:
        if item.id in self._variables:
            return item.id
        name = matlab.matlab_name(item.id)
        return name if name in self._unique and name in self._variables else None

    def header(self, item: ManifestItem):
        name = self.locate(item)
        return None if name is None else self._variables[name]

    def read(self, item: ManifestItem) -> np.ndarray:
        try:
            return matlab.read_variable(self.path, self.locate(item))
        except FeatpipeError as err:
            raise ItemError(item.id, err.cause) from None

    def describe_missing(self, item: ManifestItem) -> str:
        name = matlab.matlab_name(item.id)
        tried = repr(item.id) + (f" or {name!r}" if name != item.id else "")
        return f"no numeric variable {tried} in {self.path}"


class TsSource:
    """An aeon/sktime ``.ts`` file: cases become items ``STEM/<index>`` of shape T x channels."""

    fmt = "ts"

    def __init__(self, path: Path):
        from aeon.datasets import load_from_ts_file

        self.path = Path(path)
        self.opened = stat_record(os.stat(self.path))
        try:
            X, y = load_from_ts_file(str(self.path))
        except (OSError, ValueError) as err:
            raise FeatpipeError(f"--from {self.path}: cannot parse .ts file ({first_line(err)})") \
                from None
        if stat_record(os.stat(self.path)) != self.opened:
            raise FeatpipeError(f"--from {self.path}: the file changed while it was read; run "
                                "again once it is complete")
        self.arrays = [np.asarray(case).T for case in X]
        if not self.arrays:
            raise FeatpipeError(f"--from {self.path}: the .ts file holds no cases")
        self.labels = [str(v) for v in y] if y is not None and len(y) else [""] * len(X)
        width = len(str(max(len(self.arrays) - 1, 0)))
        self.ids = [f"{self.path.stem}/{i:0{width}d}" for i in range(len(self.arrays))]
        self._index = {item_id: i for i, item_id in enumerate(self.ids)}

    def locate(self, item: ManifestItem) -> int | None:
        return self._index.get(item.id)

    def header(self, item: ManifestItem):
        index = self.locate(item)
        return None if index is None else (self.arrays[index].shape, self.arrays[index].dtype)

    def read(self, item: ManifestItem) -> np.ndarray:
        return self.arrays[self._index[item.id]]

    def describe_missing(self, item: ManifestItem) -> str:
        return f"no case {item.id!r} in {self.path} (its ids are {self.ids[0]}..{self.ids[-1]})"

    def split(self) -> str:
        """``train`` or ``test`` from the file name (``X_TRAIN.ts``, ``X_TEST.ts``)."""
        stem = self.path.stem.lower()
        if "train" in stem and "test" not in stem:
            return "train"
        if "test" in stem and "train" not in stem:
            return "test"
        raise FeatpipeError(f"{self.path}: cannot tell train from test (the file name must "
                            "contain TRAIN or TEST); pass --manifest instead")


def open_source(fmt: str, path: str | Path, manifest: Manifest | None,
                mat_variable: str | None = None):
    path = Path(path)
    if fmt == "npy-dir":
        return NpyDirSource(path, manifest, mat_variable)
    if fmt == "npz":
        return NpzSource(path)
    if fmt == "h5":
        return H5Source(path)
    if fmt == "mat":
        return MatSource(path, manifest)
    if fmt == "ts":
        return TsSource(path)
    raise FeatpipeError(f"unknown source format {fmt!r}; use one of {', '.join(FORMATS)}")


def ts_manifest(sources: Sequence[TsSource]) -> Manifest:
    """A manifest for the cases of ``.ts`` files: ids, class labels, split1 from the names."""
    stems = Counter(s.path.stem for s in sources)
    if max(stems.values()) > 1:
        raise FeatpipeError(f"two .ts files share the name {stems.most_common(1)[0][0]!r}; "
                            "their item ids would collide")
    rows = []
    for source in sources:
        part = source.split()
        for item_id, label in zip(source.ids, source.labels, strict=True):
            rows.append((item_id, str(source.path.resolve()), [label] if label else [], [part]))
    return from_rows(rows, sources[0].path.resolve().parent, n_splits=1)


def source_fingerprint(source, manifest: Manifest, hashes: ContentHashes,
                       read: dict | None = None) -> dict:
    """What identifies a source in a stage key: its format and the content of what it reads
    (:mod:`featpipe.content`): for a folder, the file each item reads (by item id; a missing
    one as missing), else the file itself.  Never the path: a moved or touched source keeps
    its stages, a rewritten one gives new ones.  ``read`` (when given) receives, by item id,
    the SHA-256 of the folder file each item will read (None: no file), for
    :func:`featpipe.content.read_hashes_record`."""
    if isinstance(source, NpyDirSource):
        files = [(item.id, source.locate(item)) for item in manifest]
        fingerprint = {"format": source.fmt, "content": hashes.digest(files)}
        if read is not None:
            for item_id, path in files:
                seen = None if path is None else hashes.seen[os.path.abspath(path)][4]
                if read.get(item_id) is None:
                    read[item_id] = seen
        return fingerprint
    return {"format": source.fmt, "content": hashes.digest([("file", source.path)])}


def source_changed(source, keyed: list | None) -> str | None:
    """Why a single-file ``source`` may not hold the bytes the stage key was computed from
    (``keyed``: the stat record they were hashed under, :func:`featpipe.content.stat_record`):
    it was opened, or is now, under another record (written to, or replaced); None if not."""
    if keyed is None:
        return None
    if source.opened == keyed[:4] == stat_record(os.stat(source.path)):
        return None
    return (f"{source.path} changed after the stage key was computed from it: nothing was "
            "written; run the command again once the file is complete")


def check_h5_items(sources: Sequence, manifest: Manifest) -> None:
    """Refuse, before a stage exists, what an HDF5 source would read wrongly: two item ids
    that name one dataset (``a//b``, ``./a/b``, ``/a/b`` and ``a/b`` are one path; a hard or
    soft link is the same data), and a dataset whose data lie in another file (an external
    link on its path, external storage, a virtual dataset): their content is not keyed."""
    for source in sources:
        if isinstance(source, H5Source):
            claimed: dict = {}
            for item in manifest:
                node = source.locate(item)
                if node is None:
                    continue
                other = claimed.setdefault(node.id, item.id)
                if other != item.id:
                    raise FeatpipeError(f"items {other!r} and {item.id!r} both name dataset "
                                        f"{node.name} of {source.path}; give each item its "
                                        "own dataset")


def items_digest(manifest: Manifest) -> str:
    """Hash of a manifest's rows in order: ids, labels and splits (what a stage's ``items.csv``
    holds).  Not their paths: :func:`source_fingerprint` keys what each item reads by content,
    so a moved dataset keeps its stage."""
    rows = [[it.id, list(it.labels), list(it.splits)] for it in manifest]
    return hashlib.sha256(json.dumps(rows, ensure_ascii=True).encode()).hexdigest()[:16]


def file_stamp(specs: Sequence[tuple[str, str]], manifest_file: str | None) -> tuple:
    """Sizes and mtimes of the files involved: a rewritten file is opened afresh."""
    paths = [Path(path) for _, path in specs] + ([Path(manifest_file)] if manifest_file else [])
    return tuple((str(p), p.stat().st_size, p.stat().st_mtime_ns) if p.is_file() else (str(p),)
                 for p in paths)


@functools.lru_cache(maxsize=4)
def open_sources(specs: tuple[tuple[str, str], ...], manifest_file: str | None,
                 stamp: tuple = (), mat_variable: str | None = None):
    """Sources opened once per process (workers reuse them across batches); ``stamp`` (see
    :func:`file_stamp`) is part of the cache key so a rewritten file is not served stale."""
    manifest = Manifest.read(manifest_file) if manifest_file else None
    return manifest, [open_source(fmt, path, manifest, mat_variable) for fmt, path in specs]


def reference_signature(sources: Sequence, manifest: Manifest, transpose: bool = False
                        ) -> Signature | None:
    """The most common feature shape over all items (earliest item wins a tie), from headers.

    Also refuses a folder layout where two items would read the same ``.npy`` file.
    """
    counts: Counter[Signature] = Counter()
    first: dict[Signature, int] = {}
    claimed: dict[Path, str] = {}
    for position, item in enumerate(manifest):
        for source in sources:
            if isinstance(source, NpyDirSource):
                path = source.locate(item)
                if path is not None and claimed.setdefault(path, item.id) != item.id:
                    raise FeatpipeError(f"items {claimed[path]!r} and {item.id!r} would both "
                                        f"read {path}; rename the files or the ids")
            try:
                header = source.header(item)
            except (OSError, ValueError, EOFError, zipfile.BadZipFile, FeatpipeError):
                header = None
            if header is not None:
                sig = signature(transposed_shape(header[0], transpose))
                counts[sig] += 1
                first.setdefault(sig, position)
                break
    if not counts:
        return None
    return max(counts, key=lambda s: (counts[s], -first[s]))


def check_array(item_id: str, array: np.ndarray, expected: Signature | None) -> np.ndarray:
    """The checks every imported array passes (see the module docstring)."""
    if array.dtype.kind not in "biuf":
        raise ItemError(item_id, f"non-numeric array (dtype {array.dtype})")
    if array.ndim == 0 or array.size == 0:
        raise ItemError(item_id, f"empty array (shape {array.shape})")
    if array.dtype.kind == "f":
        bad = ~np.isfinite(array)
        if bad.any():
            where = tuple(int(i) for i in np.argwhere(bad)[0])
            raise ItemError(item_id, f"{int(bad.sum())} NaN/Inf value(s), first at index "
                                     f"{where}; nothing was written")
    if expected is not None and signature(array.shape) != expected:
        raise ItemError(item_id, f"ragged features: shape {array.shape} but the other items "
                                 f"are {describe(expected)}")
    return array if array.dtype.kind == "f" else array.astype(np.float64)


def transposed_shape(shape: Sequence[int], transpose: bool) -> tuple[int, ...]:
    """The shape after ``--transpose`` (2-D arrays swap their axes; others are unchanged)."""
    shape = tuple(shape)
    return shape[::-1] if transpose and len(shape) == 2 else shape


def _mat_header(source, item: ManifestItem):
    """The header of an item read from a ``.mat`` file by ``source``, else None."""
    if isinstance(source, NpyDirSource):
        path = source.locate(item)
        if path is None or path.suffix != ".mat":
            return None
    elif not isinstance(source, MatSource):
        return None
    try:
        return source.header(item)
    except (OSError, ValueError, FeatpipeError):
        return None


def mat_shapes(sources: Sequence, manifest: Manifest) -> list[tuple[int, ...]]:
    """The shapes (as MATLAB shows them) of the items that come from ``.mat`` files."""
    shapes = []
    for item in manifest:
        header = next((h for h in (_mat_header(s, item) for s in sources) if h is not None),
                      None)
        if header is not None:
            shapes.append(tuple(header[0]))
    return shapes


def orientation_warning(shapes: Sequence[tuple[int, ...]], transpose: bool) -> str | None:
    """A warning when 2-D ``.mat`` matrices (``shapes`` as MATLAB shows them) look the other
    way round: all have the same number of rows but not of columns, or all have one column."""
    shapes = [transposed_shape(s, transpose) for s in shapes if len(s) == 2]
    rows, cols = {s[0] for s in shapes}, {s[1] for s in shapes}
    flag = "without --transpose" if transpose else "with --transpose"
    if len(shapes) > 1 and len(rows) == 1 and len(cols) > 1:
        return (f"warning: every .mat matrix has {rows.pop()} rows but their column counts "
                f"differ ({min(cols)}..{max(cols)}): frames look like columns; re-run {flag} "
                "if so")
    if shapes and cols == {1} and rows != {1}:
        return (f"warning: every .mat matrix has one column: read as sequences of 1-D "
                f"frames; if each is one vector, re-run {flag}")
    return None


def item_shapes(sources: Sequence, manifest: Manifest, transpose: bool = False
                ) -> dict[str, tuple[int, ...]]:
    """Id -> shape (after ``--transpose``) of every item whose header can be read."""
    shapes = {}
    for item in manifest:
        for source in sources:
            try:
                header = source.header(item)
            except (OSError, ValueError, EOFError, zipfile.BadZipFile, FeatpipeError):
                header = None
            if header is not None:
                shapes[item.id] = transposed_shape(header[0], transpose)
                break
    return shapes


def wide_items_warning(shapes: dict[str, tuple[int, ...]], transpose: bool) -> str | None:
    """A warning when every item is a matrix with more columns than rows, except when the
    row counts vary over one column count (T x D sequences of different lengths): a D x N
    layout (one frame per column, as VLFeat and much MATLAB code store descriptors) read
    without ``--transpose`` passes the shape checks when every item has the same N.
    Manifests have no frame counts, so the shapes alone decide."""
    matrices = {i: s for i, s in shapes.items() if len(s) == 2}
    if not matrices or len(matrices) != len(shapes):
        return None
    if any(rows >= cols for rows, cols in matrices.values()):
        return None
    rows, cols = {s[0] for s in matrices.values()}, {s[1] for s in matrices.values()}
    if len(rows) > 1 and len(cols) == 1:
        return None
    item_id, (n_rows, n_cols) = next(iter(matrices.items()))
    flag = "without --transpose" if transpose else "with --transpose (one frame per column)"
    return (f"warning: every item has more columns than rows (e.g. {item_id!r}: {n_rows} x "
            f"{n_cols}, read as {n_rows} frames of {n_cols} values): if each column is a "
            f"frame (D x N), re-run the same command {flag}; if each row is one, ignore this")


class ImportCompute:
    """Picklable compute for :func:`featpipe.parallel.run_items`: reads and checks items."""

    def __init__(self, specs: Sequence[tuple[str, str]], manifest_file: str | None,
                 stage_path: str, expected: Signature | None, stamp: tuple = (),
                 transpose: bool = False, mat_variable: str | None = None,
                 keyed: dict[str, list] | None = None):
        """``keyed``: the stat record each single-file source was hashed under for the key
        (its folder sources' hashes are in the stage: :func:`featpipe.content.read_hashes`)."""
        self.keyed = dict(keyed or {})
        self.specs = tuple((fmt, str(path)) for fmt, path in specs)
        self.manifest_file = manifest_file
        self.stage_path = str(stage_path)
        self.expected = expected
        self.stamp = stamp
        self.transpose = transpose
        self.mat_variable = mat_variable

    def __call__(self, ids: Sequence[str]) -> list:
        manifest, sources = open_sources(self.specs, self.manifest_file, self.stamp,
                                         self.mat_variable)
        if manifest is None:
            manifest = _stage_items(self.stage_path)
        results = []
        for item_id in ids:  # every failure, whatever its type, belongs to its own item
            try:
                results.append(ItemOutput(self.read(manifest[item_id], sources)))
            except ItemError as err:
                results.append(err)
            except Exception as err:
                results.append(ItemError(item_id, f"{type(err).__name__}: {first_line(err)}"))
        return results

    def read(self, item: ManifestItem, sources: Sequence) -> np.ndarray:
        holders = [s for s in sources if s.locate(item) is not None]
        if not holders:
            raise ItemError(item.id, "not found: " + "; ".join(
                s.describe_missing(item) for s in sources))
        if len(holders) > 1:
            raise ItemError(item.id, "found in more than one source: " + ", ".join(
                str(s.path) for s in holders))
        source = holders[0]
        if isinstance(source, NpyDirSource):
            array, digest = source.read_hashed(item)
            changed = changed_since_key(self.stage_path, item.id, digest, source.locate(item))
        else:
            array = source.read(item)
            changed = source_changed(source, self.keyed.get(str(source.path)))
        if changed:
            raise ItemError(item.id, changed)
        if self.transpose:
            if array.ndim > 2:
                raise ItemError(item.id, f"--transpose applies to 2-D arrays, got shape "
                                         f"{array.shape}")
            array = array.T
        return check_array(item.id, array, self.expected)


@functools.lru_cache(maxsize=4)
def _stage_items(stage_path: str) -> Manifest:
    from featpipe.store import Stage

    return Stage(stage_path).items
