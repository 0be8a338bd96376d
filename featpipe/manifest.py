"""Manifests: the items of a dataset, their labels and their train/test splits.

CSV, UTF-8, header ``id,path,label,split1[,split2,...]`` (docs/data.md).  ``id`` is
unique; ``path`` is relative to the manifest's folder or absolute; ``label`` is one class name
or several separated by ``;`` (multi-label sets such as Hollywood2 and VOC); ``splitK`` is
``train``, ``test`` or empty (not in that split).

Ids and labels may hold any Unicode text except control characters (U+0000-U+001F,
U+007F-U+009F): they end in ledgers, terminals and export files, where ``v2\\0`` and ``v2``
would become the same id.  Such a row is refused with its line number (or, for a manifest
built from files, its path); so is text that is not valid UTF-8.  Two ids equal after
Unicode normalisation (NFC: ``café`` composed and decomposed print the same) are duplicates,
refused naming both rows.  The file is read without newline translation, so a quoted
``\\r`` stays ``\\r``.

Relative paths are of the folder the manifest file is in: for a manifest given as a symbolic
link, the folder of the file it points to (its paths were written next to it), in every
command alike.
"""

from __future__ import annotations

import csv
import errno
import io
import os
import re
import unicodedata
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from featpipe.errors import FeatpipeError
from featpipe.fileio import atomic_write_bytes, make_dirs

SPLIT_VALUES = ("train", "test", "")
LABEL_SEPARATOR = ";"
_CONTROL = re.compile("[\x00-\x1f\x7f-\x9f]")
_SURROGATE = re.compile("[\ud800-\udfff]")


def text_problem(what: str, value: str) -> str | None:
    """Why ``value`` cannot be an id or label (a control character, text that is not UTF-8),
    or ``None``; ``what`` names it in the message (``id 'x'``)."""
    control = _CONTROL.search(value)
    if control:
        return (f"{what} contains a control character (U+{ord(control.group()):04X}); ids "
                "and labels must not (they would not survive export or a terminal)")
    if _SURROGATE.search(value):
        return f"{what} is not valid UTF-8 (a file name with undecodable bytes?)"
    return None


@dataclass(frozen=True, slots=True)
class ManifestItem:
    """One row: an item id, its path (as written), its labels and its split memberships.

    Slotted, and a manifest's label and split tuples are shared between its rows
    (:meth:`Manifest.parse`): a row costs about 200 bytes beyond its id and path, so a
    manifest of 10^6 items fits in a few hundred MB (docs/store.md, "Item counts").
    """

    id: str
    path: str
    labels: tuple[str, ...] = ()
    splits: tuple[str, ...] = ()
    line: int = 0  # line number in the CSV file (1 = header), 0 when built in memory

    @property
    def label(self) -> str:
        """The labels joined as written in the CSV (``a;b`` for multi-label items)."""
        return LABEL_SEPARATOR.join(self.labels)

    def split(self, k: int) -> str:
        """Membership in split ``k`` (1-based): ``train``, ``test`` or ``''``."""
        return self.splits[k - 1] if 0 < k <= len(self.splits) else ""


@dataclass(frozen=True)
class Problem:
    """A problem found by :meth:`Manifest.check`, with its CSV line number."""

    line: int
    message: str

    def __str__(self) -> str:
        return f"line {self.line}: {self.message}"


@dataclass
class Manifest:
    """An ordered list of items plus the folder relative paths are resolved against."""

    items: list[ManifestItem]
    root: Path = field(default_factory=Path.cwd)
    n_splits: int | None = None
    source: str | None = None

    def __post_init__(self):
        self.root = Path(self.root)
        if self.n_splits is None:
            self.n_splits = max((len(it.splits) for it in self.items), default=1) or 1
        self._by_id = None

    # -- access -----------------------------------------------------------------------------
    def __len__(self) -> int:
        return len(self.items)

    def __iter__(self) -> Iterator[ManifestItem]:
        return iter(self.items)

    @property
    def ids(self) -> list[str]:
        return [it.id for it in self.items]

    def __getitem__(self, item_id: str) -> ManifestItem:
        if self._by_id is None:
            self._by_id = {it.id: it for it in self.items}
        try:
            return self._by_id[item_id]
        except KeyError:
            raise FeatpipeError(f"item {item_id!r} is not in the manifest") from None

    def resolve_path(self, item: ManifestItem) -> Path:
        """Absolute path of an item's file."""
        path = Path(item.path)
        return path if path.is_absolute() else self.root / path

    @property
    def classes(self) -> list[str]:
        """Sorted class names over all items."""
        return sorted({label for it in self.items for label in it.labels})

    @property
    def is_multilabel(self) -> bool:
        return any(len(it.labels) > 1 for it in self.items)

    def subset(self, ids: Iterable[str]) -> Manifest:
        wanted = set(ids)
        return Manifest([it for it in self.items if it.id in wanted], self.root, self.n_splits,
                        self.source)

    def split_ids(self, k: int, part: str) -> list[str]:
        """Ids in split ``k`` (1-based) with membership ``part`` (``train`` or ``test``)."""
        if not 1 <= k <= (self.n_splits or 1):
            raise FeatpipeError(f"split {k} does not exist: the manifest has {self.n_splits}")
        return [it.id for it in self.items if it.split(k) == part]

    # -- reading and writing ----------------------------------------------------------------
    @classmethod
    def load(cls, path: str | os.PathLike) -> tuple[Manifest, list[Problem]]:
        """Read and parse a manifest CSV; format problems are returned, not raised."""
        path = Path(path)
        try:
            with open(path, encoding="utf-8", newline="") as handle:  # keep \r inside quotes
                text = handle.read()
        except FileNotFoundError:
            raise FeatpipeError(f"manifest {path} does not exist"
                                + normalisation_note(path)) from None
        except IsADirectoryError:
            raise FeatpipeError(f"manifest {path} is a folder, not a CSV file") from None
        except UnicodeDecodeError as err:
            raise FeatpipeError(f"manifest {path} is not UTF-8 ({err.reason})") from None
        except OSError as err:
            loop = symlink_loop(path)
            raise FeatpipeError(f"manifest {loop or f'{path} is unreadable ({err.strerror})'}"
                                ) from None
        return cls.parse(text, root=manifest_folder(path), source=str(path))

    @classmethod
    def read(cls, path: str | os.PathLike, strict: bool = True) -> Manifest:
        """Read a manifest CSV; with ``strict`` every format problem is fatal."""
        manifest, problems = cls.load(path)
        if strict and problems:
            raise FeatpipeError(f"manifest {path}, {problems[0]}"
                                + (f" (and {len(problems) - 1} more problems; run "
                                   "`featpipe manifest check`)" if len(problems) > 1 else ""))
        return manifest

    @classmethod
    def parse(cls, text: str, root: Path, source: str | None = None
              ) -> tuple[Manifest, list[Problem]]:
        """Parse CSV text into a manifest and the list of format problems (duplicates, splits)."""
        problems: list[Problem] = []
        reader = csv.reader(io.StringIO(text.removeprefix("\ufeff"), newline=""))
        try:
            header = next(reader)
        except csv.Error as err:
            return cls([], root, 1, source), [Problem(1, f"malformed CSV header: {err}")]
        except StopIteration:
            return cls([], root, 1, source), [Problem(1, "empty file: expected a header "
                                                         "'id,path,label,split1'")]
        header = [h.strip() for h in header]
        if header[:3] != ["id", "path", "label"]:
            problems.append(Problem(1, f"header must start with 'id,path,label', got "
                                       f"{','.join(header[:3])!r}"))
            return cls([], root, 1, source), problems
        split_cols = header[3:]
        for i, name in enumerate(split_cols, start=1):
            if name != f"split{i}":
                problems.append(Problem(1, f"column {i + 3} must be named 'split{i}', got "
                                           f"{name!r}"))
        items: list[ManifestItem] = []
        seen: dict[str, tuple[str, int]] = {}  # NFC form -> (id as written, line)
        shared: dict[tuple[str, ...], tuple[str, ...]] = {}  # one copy of each labels/splits
        for lineno, row in _records(reader, problems):
            if not row or all(not cell.strip() for cell in row):
                continue
            if len(row) < 3 or len(row) > len(header):
                hint = (" (unclosed quote? the field runs to the end of the file)"
                        if any("\n" in cell for cell in row) else "")
                problems.append(Problem(lineno, f"expected {len(header)} fields, got "
                                                f"{len(row)}{hint}"))
                continue
            row = row + [""] * (len(header) - len(row))
            item_id, item_path, label = row[0], row[1].strip(), row[2].strip()
            if not item_id:
                problems.append(Problem(lineno, "empty id"))
                continue
            key = unicodedata.normalize("NFC", item_id)
            if key in seen:
                first, first_line = seen[key]
                problems.append(Problem(lineno, duplicate_id(item_id, first,
                                                             f"line {first_line}")))
                continue
            seen[key] = (item_id, lineno)
            bad_text = text_problem(f"id {item_id!r}", item_id) or text_problem(
                f"label {label!r} of {item_id!r}", label)
            if bad_text:
                problems.append(Problem(lineno, bad_text))
                continue
            splits = tuple(cell.strip() for cell in row[3:])
            for k, value in enumerate(splits, start=1):
                if value not in SPLIT_VALUES:
                    problems.append(Problem(lineno, f"split{k} value {value!r} for {item_id!r} "
                                                    "must be 'train', 'test' or empty"))
            labels = tuple(x.strip() for x in label.split(LABEL_SEPARATOR) if x.strip())
            labels = shared.setdefault(labels, labels)
            splits = shared.setdefault(splits, splits)
            items.append(ManifestItem(item_id, item_path, labels, splits, lineno))
        return cls(items, root, max(len(split_cols), 1), source), problems

    def to_csv(self, relative_to: Path | None = None) -> str:
        """CSV text; with ``relative_to`` relative paths are rewritten relative to that folder
        (absolute paths stay absolute), otherwise they are made absolute so the copy can live
        anywhere."""
        out = io.StringIO()
        writer = csv.writer(out, lineterminator="\n")
        writer.writerow(["id", "path", "label"] + [f"split{k}" for k in
                                                   range(1, (self.n_splits or 1) + 1)])
        for it in self.items:
            path = it.path
            if path:
                absolute = self.resolve_path(it)
                path = (os.path.relpath(absolute, relative_to)
                        if relative_to is not None and not Path(path).is_absolute()
                        else str(absolute))
            splits = list(it.splits) + [""] * ((self.n_splits or 1) - len(it.splits))
            writer.writerow([it.id, path, it.label] + splits)
        return out.getvalue()

    def write(self, path: str | os.PathLike, relative_to: Path | None | str = "parent") -> None:
        """Write the CSV atomically; paths relative to the file's folder unless told otherwise."""
        path = Path(path)
        make_dirs(path.parent)
        base = path.parent.resolve() if relative_to == "parent" else relative_to
        atomic_write_bytes(path, self.to_csv(base).encode("utf-8"))

    # -- checks -----------------------------------------------------------------------------
    def check(self, check_files: bool = True, allow_outside_root: bool = True) -> list[Problem]:
        """Problems beyond the format: no rows at all (:data:`NO_ITEMS`: ``import`` and
        ``extract`` refuse such a manifest too), missing files, unlabeled train rows, paths
        outside root."""
        problems: list[Problem] = [] if self.items else [Problem(2, NO_ITEMS)]
        root = self.root.resolve()
        for it in self.items:
            if any(s == "train" for s in it.splits) and not it.labels:
                problems.append(Problem(it.line, f"{it.id!r} is in a train split but has no "
                                                 "label"))
            if not it.path:
                if check_files:
                    problems.append(Problem(it.line, f"{it.id!r} has an empty path"))
                continue
            absolute = self.resolve_path(it)
            if not allow_outside_root:
                try:
                    absolute.resolve().relative_to(root)
                except ValueError:
                    problems.append(Problem(it.line, f"path {it.path!r} of {it.id!r} is outside "
                                                     f"the manifest folder {root}"))
            if check_files and not absolute.exists():
                problems.append(Problem(it.line, f"file {it.path!r} of {it.id!r} does not "
                                                 "exist" + normalisation_note(absolute)))
        return problems


#: The problem of a manifest whose header is followed by no row.
NO_ITEMS = "no items: the header is not followed by any row (import and extract refuse it)"


def manifest_folder(path: str | os.PathLike) -> Path:
    """The folder a manifest's relative paths start from: the folder of the file itself, a
    symbolic link followed to its target (its paths were written next to the file; a link
    only reaches it from elsewhere), as ``python script.py`` finds a linked script's
    modules."""
    return Path(os.path.realpath(path)).parent


def duplicate_id(item_id: str, first: str, where: str, source: str = "") -> str:
    """The problem of an id (read from ``source``, e.g. `` (from 'a.mp4')``) equal to the
    ``first`` one (at ``where``), exactly or after Unicode normalisation (NFC), where the two
    print the same: their code points say how they differ."""
    if item_id == first:
        return f"duplicate id {item_id!r}{source} (first on {where})"
    return (f"duplicate id {item_id!r}{source}: equal to {first!r} on {where} after Unicode "
            f"normalisation ({_form(item_id)} {ascii(item_id)} here, {_form(first)} "
            f"{ascii(first)} there; they print the same): write one form for both, or "
            "rename one")


def symlink_loop(path: str | os.PathLike) -> str | None:
    """``PATH is a symbolic link that loops (...)`` when a symbolic link on ``path`` points
    back to itself (directly or through others), else None."""
    try:
        os.stat(path)
    except OSError as err:
        if err.errno == errno.ELOOP:
            return f"{path} is a symbolic link that loops ({err.strerror})"
    except ValueError:  # an embedded NUL: no such path
        pass
    return None


#: the words the failure of an item whose file is missing ends with: its manifest row is
#: what to fix (a re-run as it is fails it again): :func:`row_fix`, :func:`needs_row_fix`
ROW_FIX = "fix or remove its row"


def missing_file(path: str | os.PathLike) -> str | None:
    """Why the file at ``path`` cannot be opened when it is missing (it does not exist, a
    symbolic link on it loops; with the twin that differs in Unicode normalisation), or None
    when it exists."""
    if os.path.exists(path):
        return None
    return symlink_loop(path) or f"file {path} does not exist" + normalisation_note(Path(path))


def row_fix(manifest: Manifest | None, item_id: str) -> str:
    """``fix or remove its row in FILE (line N: path 'P')``: what to do about an item whose
    file is missing, naming its row of ``manifest`` (as far as it is known)."""
    try:
        item = manifest[item_id] if manifest is not None else None
    except FeatpipeError:
        item = None
    if item is None:
        return f"{ROW_FIX} in the manifest"
    where = f" in {manifest.source}" if manifest.source else " in the manifest"
    line = f"line {item.line}: " if item.line else ""
    return f"{ROW_FIX}{where} ({line}path {item.path!r})"


def needs_row_fix(error: str) -> bool:
    """Whether an item's recorded failure is a missing file, fixed in its manifest row (so
    re-running the same command as it is cannot finish the stage)."""
    return ROW_FIX in error


def normalisation_twin(path: Path) -> Path | None:
    """The existing path that differs from the missing ``path`` only in the Unicode
    normalisation of its names (``café`` composed, NFC, or decomposed, NFD, as macOS and
    some archives write file names), or ``None``."""
    path = Path(os.path.abspath(path))
    found, changed = Path(path.anchor), False
    for part in path.parts[1:]:
        try:
            if not (found / part).exists():
                key = unicodedata.normalize("NFC", part)
                twins = [e.name for e in os.scandir(found)  # another name, not a link loop
                         if unicodedata.normalize("NFC", e.name) == key and e.name != part]
                if not twins:
                    return None
                part, changed = twins[0], True
        except (OSError, ValueError):  # a name too long, a folder that cannot be listed
            return None
        found = found / part
    return found if changed else None


def _form(text: str) -> str:
    return "NFC" if unicodedata.is_normalized("NFC", text) else \
        "NFD" if unicodedata.is_normalized("NFD", text) else "mixed"


def normalisation_note(path: Path) -> str:
    """``; ...`` saying why a missing ``path`` is missing when it looks present: a symbolic
    link on it loops, or it exists under a name that differs only in its Unicode
    normalisation (the two look identical when printed); or ``""``."""
    loop = symlink_loop(path)
    if loop is not None:
        return f"; {loop}"
    twin = normalisation_twin(path)
    if twin is None:
        return ""
    return (f"; {str(twin)!r} exists, which looks the same but differs in Unicode "
            f"normalisation ({_form(str(path))} here, {_form(str(twin))} on disk): write the "
            "id or path in the file's form, or rename the file")


def _records(reader, problems: list[Problem]) -> Iterator[tuple[int, list[str]]]:
    """CSV records with the line each starts on (a quoted field may span several lines)."""
    while True:
        start = reader.line_num + 1
        try:
            row = next(reader)
        except StopIteration:
            return
        except csv.Error as err:
            problems.append(Problem(start, f"malformed CSV: {err}"))
            return
        yield start, row


def from_rows(rows: Sequence[tuple[str, str, Sequence[str], Sequence[str]]], root: Path,
              n_splits: int | None = None) -> Manifest:
    """Build a manifest from ``(id, path, labels, splits)`` tuples; an id or label that
    :func:`text_problem` refuses (or a path that is not UTF-8) is an error naming the path."""
    items = []
    seen: dict[str, tuple[str, str]] = {}  # NFC form -> (id, path)
    for line, (i, p, ls, ss) in enumerate(rows, start=2):
        where = f" (from {p!r})" if p else ""
        problem = text_problem(f"id {i!r}{where}", i) or text_problem(
            f"path {p!r}", _CONTROL.sub("", p)) or next(
            filter(None, (text_problem(f"label {label!r} of {i!r}", label) for label in ls)),
            None)
        key = unicodedata.normalize("NFC", i)
        if not problem and key in seen:
            first, first_path = seen[key]
            problem = duplicate_id(i, first, f"the row of {first_path!r}" if first_path
                                   else "an earlier row", where)
        seen.setdefault(key, (i, p))
        if problem:
            raise FeatpipeError(problem)
        items.append(ManifestItem(i, p, tuple(ls), tuple(ss), line))
    return Manifest(items, root, n_splits)
