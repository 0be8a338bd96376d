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

import errno
import functools
import hashlib
import json
import logging
import os
import re
import stat
import unicodedata
import zipfile
from array import array
from collections import Counter
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

from featpipe.errors import FeatpipeError, ItemError
from featpipe.fileio import check_h5_dataset, check_npy_header, first_line, npy_from_bytes
from featpipe.io import matlab
from featpipe.manifest import (
    Manifest,
    ManifestItem,
    from_rows,
    normalisation_note,
    row_fix,
    symlink_loop,
)
from featpipe.parallel import ItemOutput
from featpipe.store.content import ContentHashes, changed_since_key, sha256_of, stat_record

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
        loop = symlink_loop(path)
        raise FeatpipeError(f"--from {loop}: point it at the features" if loop else
                            f"--from {path}: no such file or folder" + normalisation_note(path))
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
        self.folder = str(self.path)
        self.root = manifest.root.resolve() if manifest is not None else None
        self._shared_flats = _shared_flats(manifest.ids) if manifest is not None else None
        self.mat_variable = mat_variable

    def _candidates(self, item: ManifestItem) -> list[str]:
        return [stem[:-4] + ext for stem in self._npy_candidates(item)
                for ext in FOLDER_EXTENSIONS]

    def _npy_candidates(self, item: ManifestItem) -> list[str]:
        """The ``.npy`` paths the item may read, as normalised strings (``Path`` writes them
        the same): ``Path`` objects made for each item left 50-190 bytes an item alive
        (tracemalloc: the names pathlib interns), 50-190 MB at 10^6 items."""
        found = []
        if item.id and not item.id.startswith("/") and ".." not in item.id.split("/"):
            found.append(self._inside(item.id + ".npy"))
        flat = _FLAT.sub("_", item.id)
        if self._shared_flats is not None and flat not in self._shared_flats:
            found.append(self._inside(flat + ".npy"))
        if item.path and self.root is not None:
            path = item.path
            if path.startswith("/"):
                try:
                    path = str(Path(path).resolve().relative_to(self.root))
                except ValueError:
                    path = None
            if path is not None and ".." not in path.split("/"):
                folder, name = os.path.split(os.path.normpath(path))
                dot = name.rfind(".")  # Path.with_suffix's rule for the suffix replaced
                found.append(self._inside(os.path.join(
                    folder, (name[:dot] if 0 < dot < len(name) - 1 else name) + ".npy")))
        return found

    def _inside(self, relative: str) -> str:
        return os.path.normpath(os.path.join(self.folder, relative))

    def locate(self, item: ManifestItem) -> str | None:
        return next((p for p in self._candidates(item) if _is_file(p)), None)

    def header(self, item: ManifestItem, path: str | None = None):
        path = self.locate(item) if path is None else path
        if path is None:
            return None
        if path.endswith(".mat"):
            return matlab.numeric_variables(path)[self._mat_name(item, path)]
        with open(path, "rb") as handle:
            return check_npy_header(handle, os.fstat(handle.fileno()).st_size)

    def _mat_name(self, item: ManifestItem, path: str) -> str:
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

    def read_hashed(self, item: ManifestItem, path: str | None = None
                    ) -> tuple[np.ndarray, str]:
        """The item's array (from ``path``, :meth:`locate`'s answer) and the SHA-256 of the
        bytes it was read from: an ``.npy`` is read once, hashed, then parsed; a ``.mat``
        (opened several times by its readers) is hashed after it is read, so a change
        meanwhile shows too."""
        path = self.locate(item) if path is None else path
        try:
            if path.endswith(".mat"):
                array = matlab.read_variable(path, self._mat_name(item, path))
                return array, sha256_of(path)
            with open(path, "rb") as handle:
                data = handle.read()
            return npy_from_bytes(data), hashlib.sha256(data).hexdigest()
        except FeatpipeError as err:
            raise ItemError(item.id, err.cause) from None
        except (OSError, ValueError, EOFError) as err:
            raise ItemError(item.id, f"cannot read {path}: {first_line(err)}") from None

    def looping(self, item: ManifestItem) -> str | None:
        """``PATH is a symbolic link that loops (...)`` for the first path the item may read
        that is such a link (the item is then not missing: its link cannot be followed)."""
        return next(filter(None, map(symlink_loop, self._candidates(item))), None)

    def describe_missing(self, item: ManifestItem) -> str:
        paths = list(dict.fromkeys(self._candidates(item)))
        too_long = " (file name too long for this file system)" if any(
            _is_file(p) is None for p in paths) else ""
        twins = "".join(dict.fromkeys(normalisation_note(p) for p in paths))
        return ("none of " + ", ".join(str(p)[:300] for p in paths)
                + f" (formats tried: {', '.join(FOLDER_EXTENSIONS)}){too_long}{twins}")


def _shared_flats(ids: Sequence[str]) -> set[str]:
    """The flat forms (:data:`_FLAT` replaced by ``_``) that more than one of ``ids`` has.
    Only ids with a character to replace can share one (with each other, or with an id that
    is its own flat form), so the common case of plain ids costs one pass and no memory."""
    changed = Counter(flat for i in ids if (flat := _FLAT.sub("_", i)) != i)
    if not changed:
        return set()
    plain = set(ids).intersection(changed)
    return {flat for flat, n in changed.items() if n > 1 or flat in plain}


def _is_file(path: str) -> bool | None:
    """Whether ``path`` is a file, or ``None`` when the name cannot exist (too long,
    invalid)."""
    try:
        return stat.S_ISREG(os.stat(path).st_mode)
    except (FileNotFoundError, NotADirectoryError):
        return False
    except OSError as err:
        return False if err.errno == errno.ELOOP else None  # a loop is named by the caller
    except ValueError:
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

    def header(self, item: ManifestItem, member: str | None = None):
        member = self.locate(item) if member is None else member
        if member is None:
            return None
        with self._zip.open(member) as handle:
            return check_npy_header(handle, self._zip.getinfo(member).file_size)

    def read(self, item: ManifestItem, member: str | None = None) -> np.ndarray:
        member = self.locate(item) if member is None else member
        try:
            self.header(item, member)
            with self._zip.open(member) as handle:
                return np.lib.format.read_array(handle, allow_pickle=False)
        except (OSError, ValueError, EOFError, zipfile.BadZipFile) as err:
            raise ItemError(item.id, f"cannot read key {item.id!r} of {self.path}: "
                                     f"{first_line(err)}") from None

    def describe_missing(self, item: ManifestItem) -> str:
        return f"no key {item.id!r} in {self.path}"


@functools.cache
def _h5():
    """h5py's low-level modules, imported once (an import per item costs at 10^6 items)."""
    import h5py

    return h5py


class H5Dataset:
    """An HDF5 dataset opened with h5py's low-level API: what :func:`check_h5_dataset` reads
    (``shape``, ``dtype``, ``id``) and :meth:`read`, the array as ``h5py.Dataset[()]`` gives
    it (same dtype, byte order included)."""

    __slots__ = ("dtype", "id", "name", "plist", "shape")

    def __init__(self, dataset_id, name: str, plist):
        h5s = _h5().h5s
        self.id = dataset_id
        self.name = name
        self.plist = plist
        space = dataset_id.get_space()
        self.shape = None if space.get_simple_extent_type() == h5s.NULL else space.shape
        self.dtype = dataset_id.dtype

    def read(self) -> np.ndarray:
        h5s = _h5().h5s
        array = np.empty(self.shape, self.dtype)
        if array.size:
            self.id.read(h5s.ALL, h5s.ALL, array)
        return array


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

    def locate(self, item: ManifestItem) -> H5Dataset | None:
        """The dataset of ``item``, or ``None``; a dataset whose data are in another file is
        refused, naming the link or the storage.  Opened through h5py's low-level API (about
        a fifth of the cost of ``h5py.File.get``, which counts at 10^6 items), and nothing
        of it is kept: an open HDF5 object costs about 10 kB of the library's memory."""
        h5d, h5l, h5o = _h5().h5d, _h5().h5l, _h5().h5o
        path = self.dataset_path(item.id)
        if path == "/":
            return None
        links = self._file.id.links
        prefix = b""
        try:
            for part in path.strip("/").split("/"):
                parent, prefix = prefix, prefix + b"/" + part.encode("utf-8")
                if links.get_info(prefix).type == h5l.TYPE_EXTERNAL:
                    filename, target = (v.decode("utf-8", "replace")
                                        for v in links.get_val(prefix))
                    raise FeatpipeError(
                        f"{self.path}: {parent.decode('utf-8', 'replace')}/{part} is an "
                        f"external link to {filename}:{target} (item {item.id!r}); featpipe "
                        "does not follow them (their content is not keyed): copy the data into "
                        "the file")
            node = h5o.open(self._file.id, prefix)
        except (KeyError, ValueError, OSError, RuntimeError):
            return None  # a missing part, a dangling soft link, a dataset used as a group
        if not isinstance(node, h5d.DatasetID):
            return None
        plist = node.get_create_plist()
        virtual = plist.get_layout() == h5d.VIRTUAL
        if virtual or plist.get_external_count():
            what = "a virtual dataset" if virtual else "stored in external files"
            raise FeatpipeError(f"{self.path}: dataset {path} (item {item.id!r}) is {what}; "
                                "featpipe does not read data outside the file (their content "
                                "is not keyed): copy the data into the file")
        return H5Dataset(node, path, plist)

    def header(self, item: ManifestItem, node: H5Dataset | None = None):
        node = self.locate(item) if node is None else node
        if node is None:
            return None
        check_h5_dataset(node, item.id)
        return node.shape, node.dtype

    def identity(self, node: H5Dataset) -> int:
        """What two ids naming the same dataset share (a hard or soft link, ``a//b``): the
        address of its object header in the file."""
        return _h5().h5o.get_info(node.id).addr

    def read(self, item: ManifestItem, node: H5Dataset | None = None) -> np.ndarray:
        node = self.locate(item) if node is None else node
        if node.dtype.kind not in "biuf":
            raise ItemError(item.id, f"dataset {node.name!r} of {self.path} has non-numeric dtype "
                                     f"{node.dtype}")
        try:
            check_h5_dataset(node, item.id)
            return node.read()
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

    def header(self, item: ManifestItem, name: str | None = None):
        name = self.locate(item) if name is None else name
        return None if name is None else self._variables[name]

    def read(self, item: ManifestItem, name: str | None = None) -> np.ndarray:
        try:
            return matlab.read_variable(self.path, self.locate(item) if name is None else name)
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

    def header(self, item: ManifestItem, index: int | None = None):
        index = self.locate(item) if index is None else index
        return None if index is None else (self.arrays[index].shape, self.arrays[index].dtype)

    def read(self, item: ManifestItem, index: int | None = None) -> np.ndarray:
        return self.arrays[self._index[item.id] if index is None else index]

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
    stems: dict[str, Path] = {}
    for source in sources:
        first = stems.setdefault(unicodedata.normalize("NFC", source.path.stem), source.path)
        if first != source.path:
            same = "share the name" if first.stem == source.path.stem else (
                f"have names equal after Unicode normalisation ({ascii(first.stem)} and "
                f"{ascii(source.path.stem)}: they print the same)")
            raise FeatpipeError(f"--from {first} and {source.path} {same}; their item ids "
                                f"({source.path.stem}/0, ...) would collide: rename one")
    rows = []
    for source in sources:
        part = source.split()
        for item_id, label in zip(source.ids, source.labels, strict=True):
            rows.append((item_id, str(source.path.resolve()), [label] if label else [], [part]))
    return from_rows(rows, sources[0].path.resolve().parent, n_splits=1)


def source_fingerprint(source, manifest: Manifest, hashes: ContentHashes,
                       read: dict | None = None) -> dict:
    """What identifies a source in a stage key: its format and the content of what it reads
    (:mod:`featpipe.store.content`): for a folder, the file each item reads (by item id; a missing
    one as missing), else the file itself.  Never the path: a moved or touched source keeps
    its stages, a rewritten one gives new ones.  ``read`` (when given) receives, by item id,
    the SHA-256 of the folder file each item will read (None: no file), for
    :func:`featpipe.store.content.read_hashes_record`."""
    if isinstance(source, NpyDirSource):
        def files():  # one item at a time: nothing per item is kept but ``read``
            for item in manifest:
                path = source.locate(item)
                yield item.id, path  # hashed by ``digest`` before the next line runs
                seen = None if path is None else hashes.seen.pop(os.path.abspath(path))
                if read is not None and read.get(item.id) is None:
                    read[item.id] = None if seen is None else seen[4]

        return {"format": source.fmt, "content": hashes.digest(files())}
    return {"format": source.fmt, "content": hashes.digest([("file", source.path)])}


def source_changed(source, keyed: list | None) -> str | None:
    """Why a single-file ``source`` may not hold the bytes the stage key was computed from
    (``keyed``: the stat record they were hashed under, :func:`featpipe.store.content.stat_record`):
    it was opened, or is now, under another record (written to, or replaced); None if not."""
    if keyed is None:
        return None
    if source.opened == keyed[:4] == stat_record(os.stat(source.path)):
        return None
    return (f"{source.path} changed after the stage key was computed from it: nothing was "
            "written; run the command again once the file is complete")


def items_digest(manifest: Manifest) -> str:
    """Hash of a manifest's rows in order: ids, labels and splits (what a stage's ``items.csv``
    holds).  Not their paths: :func:`source_fingerprint` keys what each item reads by content,
    so a moved dataset keeps its stage.  The hash of ``json.dumps`` of the list of rows, fed
    row by row (the same bytes, without the whole text in memory)."""
    digest = hashlib.sha256(b"[")
    for position, it in enumerate(manifest):
        row = json.dumps([it.id, list(it.labels), list(it.splits)], ensure_ascii=True)
        digest.update(((", " if position else "") + row).encode())
    digest.update(b"]")
    return digest.hexdigest()[:16]


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
    return manifest, open_each(specs, manifest, mat_variable)


def open_each(specs: Sequence[tuple[str, str]], manifest: Manifest | None,
              mat_variable: str | None = None) -> list:
    """Each source of ``specs`` (format, path) opened for the items of ``manifest``."""
    return [open_source(fmt, path, manifest, mat_variable) for fmt, path in specs]


@dataclass
class ShapeSummary:
    """What the orientation warnings need of a set of item shapes, summed up item by item:
    how many there are, how many are matrices, the row and column counts of those (sets of
    distinct values), whether one has at least as many rows as columns, and the first."""

    items: int = 0
    matrices: int = 0
    rows: set[int] = field(default_factory=set)
    cols: set[int] = field(default_factory=set)
    tall: bool = False
    first: tuple[str, tuple[int, ...]] | None = None

    def add(self, item_id: str, shape: tuple[int, ...]) -> None:
        self.items += 1
        if len(shape) != 2:
            return
        self.matrices += 1
        self.rows.add(shape[0])
        self.cols.add(shape[1])
        self.tall = self.tall or shape[0] >= shape[1]
        if self.first is None:
            self.first = (item_id, shape)


@dataclass
class SourceScan:
    """One pass over every item's header, before the stage exists (:func:`scan_sources`):
    the reference feature shape, and the shapes the orientation warnings look at."""

    expected: Signature | None
    mat: ShapeSummary
    shapes: ShapeSummary


def scan_sources(sources: Sequence, manifest: Manifest, transpose: bool = False
                 ) -> SourceScan:
    """Read every item's header once, in every source, and refuse what would be read wrongly.

    - The reference signature: the most common feature shape over all items (earliest item
      wins a tie), from the headers (the first source holding the item).
    - Two items that would read one thing are refused naming both: one ``.npy`` or ``.mat``
      file of a folder, or one HDF5 dataset (``a//b``, ``./a/b``, ``/a/b`` and ``a/b`` are one
      path; a hard or soft link is the same data); so is an HDF5 dataset whose data lie in
      another file (an external link on its path, external storage, a virtual dataset):
      their content is not keyed.
    - The shapes (after ``--transpose``) of the items read from ``.mat`` files and of all
      items, summed up for :func:`orientation_warning` and :func:`wide_items_warning`.

    Nothing per item is kept but one 8-byte key per item and source (what it reads), so a
    manifest of 10^6 items scans in a few tens of MB.
    """
    counts: Counter[Signature] = Counter()
    first: dict[Signature, int] = {}
    mat, shapes = ShapeSummary(), ShapeSummary()
    claims = {k: array("Q") for k, s in enumerate(sources)
              if isinstance(s, H5Source | NpyDirSource)}
    for position, item in enumerate(manifest):
        header = mat_header = None
        for k, source in enumerate(sources):
            where = source.locate(item)
            if where is None:
                continue
            if k in claims:
                claims[k].append(_claim_key(source, where))
            if header is None:
                try:
                    header = source.header(item, where)
                except (OSError, ValueError, EOFError, zipfile.BadZipFile, FeatpipeError):
                    header = None
            if mat_header is None:
                mat_header = _mat_header(source, item, where)
        if mat_header is not None:
            mat.add(item.id, transposed_shape(mat_header[0], transpose))
        if header is not None:
            shape = transposed_shape(header[0], transpose)
            sig = signature(shape)
            counts[sig] += 1
            first.setdefault(sig, position)
            shapes.add(item.id, shape)
    for k, keys in claims.items():
        _refuse_shared_reads(sources[k], manifest, keys)
    expected = max(counts, key=lambda s: (counts[s], -first[s])) if counts else None
    return SourceScan(expected, mat, shapes)


def _claim_key(source, where) -> int:
    """8 bytes that say what an item reads from ``source``: an HDF5 dataset's object address,
    else a hash of the file's path (equal paths, equal keys; the rare equal key of two paths
    is told apart by :func:`_refuse_shared_reads`)."""
    if isinstance(source, H5Source):
        return source.identity(where)
    return int.from_bytes(hashlib.blake2b(str(where).encode("utf-8", "surrogateescape"),
                                          digest_size=8).digest(), "little")


def _refuse_shared_reads(source, manifest: Manifest, keys: array) -> None:
    """Raise naming the first item (in manifest order) that reads what an earlier item reads
    from ``source`` (``keys``: :func:`_claim_key` of each item found there, in order), and
    that earlier item; the items whose keys are shared are located again to compare what
    they read exactly."""
    values = np.frombuffer(keys, dtype=np.uint64) if len(keys) else np.zeros(0, np.uint64)
    unique, counts = np.unique(values, return_counts=True)
    shared = set(unique[counts > 1].tolist())
    if not shared:
        return
    claimed: dict = {}
    for item in manifest:
        where = source.locate(item)
        if where is None or _claim_key(source, where) not in shared:
            continue
        what = _claim_key(source, where) if isinstance(source, H5Source) else where
        other = claimed.setdefault(what, item.id)
        if other == item.id:
            continue
        if isinstance(source, H5Source):
            raise FeatpipeError(f"items {other!r} and {item.id!r} both name dataset "
                                f"{where.name} of {source.path}; give each item its own "
                                "dataset")
        raise FeatpipeError(f"items {other!r} and {item.id!r} would both read {where}; "
                            "rename the files or the ids")


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


def _mat_header(source, item: ManifestItem, where):
    """The header of an item read from a ``.mat`` file by ``source`` (found at ``where``),
    else None."""
    if isinstance(source, NpyDirSource):
        if not where.endswith(".mat"):
            return None
    elif not isinstance(source, MatSource):
        return None
    try:
        return source.header(item, where)
    except (OSError, ValueError, FeatpipeError):
        return None


def orientation_warning(shapes: ShapeSummary, transpose: bool) -> str | None:
    """A warning when 2-D ``.mat`` matrices (``shapes``: as MATLAB shows them, after
    ``--transpose``) look the other way round: all have the same number of rows but not of
    columns, or all have one column."""
    rows, cols = shapes.rows, shapes.cols
    flag = "without --transpose" if transpose else "with --transpose"
    if shapes.matrices > 1 and len(rows) == 1 and len(cols) > 1:
        return (f"warning: every .mat matrix has {next(iter(rows))} rows but their column "
                f"counts differ ({min(cols)}..{max(cols)}): frames look like columns; re-run "
                f"{flag} if so")
    if shapes.matrices and cols == {1} and rows != {1}:
        return (f"warning: every .mat matrix has one column: read as sequences of 1-D "
                f"frames; if each is one vector, re-run {flag}")
    return None


def wide_items_warning(shapes: ShapeSummary, transpose: bool) -> str | None:
    """A warning when every item (``shapes``: those whose header could be read, after
    ``--transpose``) is a matrix with more columns than rows, except when the row counts vary
    over one column count (T x D sequences of different lengths): a D x N layout (one frame
    per column, as VLFeat and much MATLAB code store descriptors) read without
    ``--transpose`` passes the shape checks when every item has the same N.  Manifests have
    no frame counts, so the shapes alone decide."""
    if not shapes.matrices or shapes.matrices != shapes.items or shapes.tall:
        return None
    if len(shapes.rows) > 1 and len(shapes.cols) == 1:
        return None
    item_id, (n_rows, n_cols) = shapes.first
    flag = "without --transpose" if transpose else "with --transpose (one frame per column)"
    return (f"warning: every item has more columns than rows (e.g. {item_id!r}: {n_rows} x "
            f"{n_cols}, read as {n_rows} frames of {n_cols} values): if each column is a "
            f"frame (D x N), re-run the same command {flag}; if each row is one, ignore this")


class ImportCompute:
    """Picklable compute for :func:`featpipe.parallel.run_items`: reads and checks items."""

    def __init__(self, specs: Sequence[tuple[str, str]], manifest_file: str | None,
                 stage_path: str, expected: Signature | None, stamp: tuple = (),
                 transpose: bool = False, mat_variable: str | None = None,
                 keyed: dict[str, list] | None = None, opened: tuple | None = None):
        """``keyed``: the stat record each single-file source was hashed under for the key
        (its folder sources' hashes are in the stage: :func:`featpipe.store.content.read_hashes`);
        ``opened``: ``(manifest, sources)`` as the calling process opened them, used when
        the items are computed in that process (not pickled: a worker opens its own)."""
        self.keyed = dict(keyed or {})
        self._opened = opened
        self.specs = tuple((fmt, str(path)) for fmt, path in specs)
        self.manifest_file = manifest_file
        self.stage_path = str(stage_path)
        self.expected = expected
        self.stamp = stamp
        self.transpose = transpose
        self.mat_variable = mat_variable

    def __getstate__(self):
        return {**self.__dict__, "_opened": None}

    def __call__(self, ids: Sequence[str]) -> list:
        manifest, sources = self._opened or open_sources(
            self.specs, self.manifest_file, self.stamp, self.mat_variable)
        if manifest is None:
            manifest = _stage_items(self.stage_path)
        results = []
        for item_id in ids:  # every failure, whatever its type, belongs to its own item
            try:
                results.append(ItemOutput(self.read(manifest[item_id], sources, manifest)))
            except ItemError as err:
                results.append(err)
            except Exception as err:
                results.append(ItemError(item_id, f"{type(err).__name__}: {first_line(err)}"))
        return results

    def read(self, item: ManifestItem, sources: Sequence, manifest: Manifest | None = None
             ) -> np.ndarray:
        """The item's checked array; ``manifest`` (its rows) names the row of a missing one."""
        holders = [(s, where) for s in sources if (where := s.locate(item)) is not None]
        if not holders:
            loop = next(filter(None, (s.looping(item) for s in sources
                                      if isinstance(s, NpyDirSource))), None)
            if loop is not None:
                raise ItemError(item.id, f"{loop}: point it at the item's file, or "
                                         + row_fix(manifest, item.id))
            raise ItemError(item.id, "not found: " + "; ".join(
                s.describe_missing(item) for s in sources) + "; add its file, or "
                + row_fix(manifest, item.id))
        if len(holders) > 1:
            raise ItemError(item.id, "found in more than one source: " + ", ".join(
                str(s.path) for s, _ in holders))
        source, where = holders[0]
        if isinstance(source, NpyDirSource):
            array, digest = source.read_hashed(item, where)
            changed = changed_since_key(self.stage_path, item.id, digest, where)
        else:
            array = source.read(item, where)
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
