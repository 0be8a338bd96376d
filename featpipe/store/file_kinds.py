"""Every kind of file a store holds: where it is, what checksum covers it, what recovers it.

One entry per kind (a new kind of file is one new entry; ``docs/store.md`` describes where
each checksum is kept and what ``cache verify --repair`` does).
``tests/stages/test_damage_table.py`` damages a file of every kind four ways (a flipped
byte, truncated, deleted, replaced by a valid file of the same kind from another store) and
checks that ``featpipe cache verify`` names it and that ``cache verify --repair`` plus the
commands that made the store give back every result bit for bit; it fails when a store holds
a file of no kind here, or when a kind here has no row in its table.

A path is matched relative to the store folder, ``/`` between its parts (:func:`kind_of`).
A file of no kind is not featpipe's: ``cache gc`` and ``cache verify --repair``, which find
leftovers and strays by listing folders, never remove one (and name it).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

_STAGE = r"stages/[a-z][a-z0-9-]*-[0-9a-f]{16}"
_NAME = r"[A-Za-z0-9][A-Za-z0-9._-]{0,127}"
#: An item's file stem (:func:`featpipe.fileio.safe_stem`): its readable id, its id's digest.
_STEM = r"[A-Za-z0-9_-][A-Za-z0-9._-]{0,79}-[0-9a-f]{20}"


@dataclass(frozen=True)
class FileKind:
    """A kind of file: its ``name``, the ``pattern`` its path (relative to the store)
    matches, where its ``checksum`` is kept (None: a file with nothing to check, said
    why in ``recovery``) and its ``recovery`` when it is damaged."""

    name: str
    pattern: str
    checksum: str | None
    recovery: str

    def matches(self, relative: str) -> bool:
        return re.fullmatch(self.pattern, relative) is not None


FILE_KINDS: tuple[FileKind, ...] = (
    FileKind("stage record", rf"{_STAGE}/stage\.json",
             "sealed: its last member is the CRC of the bytes before it and its place",
             "`verify --repair` removes the stage and the names pointing at it; the re-run "
             "computes it again"),
    FileKind("view record", rf"{_STAGE}/view\.json",
             "sealed (to its stage); and `files` in stage.json (written with it)",
             "part of the stage's own record: `verify --repair` removes the stage and the "
             "names pointing at it; the re-run makes the view again"),
    FileKind("item list", rf"{_STAGE}/items\.csv", "`files` in stage.json",
             "`verify --repair` removes it; the re-run writes it again"),
    FileKind("read hashes", rf"{_STAGE}/read-hashes\.json", "`files` in stage.json",
             "`verify --repair` removes it; the re-run writes it again"),
    FileKind("item sidecar", rf"{_STAGE}/items/[0-9a-f]{{2}}/{_STEM}\+[a-z][a-z0-9_]*\.npy",
             "`sums` of the item's ledger line",
             "`verify --repair` removes the item; the re-run recomputes it"),
    FileKind("item array", rf"{_STAGE}/items/[0-9a-f]{{2}}/{_STEM}\.npy",
             "`sums` of the item's ledger line",
             "`verify --repair` removes the item; the re-run recomputes it"),
    FileKind("ledger", rf"{_STAGE}/ledger/[^/]+-\d+\.jsonl",
             "each line sealed (to its stage)",
             "`verify --repair` rewrites it without its damaged lines and removes the item "
             "files no line accounts for; the re-run recomputes them"),
    FileKind("batch file",
             rf"{_STAGE}/batches/[A-Za-z0-9._-]+-\d+-[0-9a-f]{{12}}\.[0-9a-f]{{8}}\.npz",
             "its name (the CRC of the file); each member's in its item's ledger line (`sums`)",
             "`verify --repair` removes it whole; the re-run recomputes its items"),
    FileKind("index record", rf"{_STAGE}/index\.json",
             "inside: `sum`, the CRC of its canonical JSON; and folding the ledgers again "
             "must give the same",
             "a cache of the ledgers: `verify --repair` removes it (reads fold the ledgers "
             "meanwhile); the next run writes it again"),
    FileKind("index table", rf"{_STAGE}/index-[0-9a-f]{{12}}\.npz",
             "`table_sum` in index.json; and folding the ledgers again must give the same",
             "a cache of the ledgers: `verify --repair` removes the index; the next run "
             "writes it again"),
    FileKind("model arrays", rf"{_STAGE}/models/[^/]+\.npz", "models/NAME.sums",
             "`verify --repair` removes the model; the re-run fits it again"),
    FileKind("model metadata", rf"{_STAGE}/models/[^/]+\.json", "models/NAME.sums",
             "`verify --repair` removes the model; the re-run fits it again"),
    FileKind("model checksums", rf"{_STAGE}/models/[^/]+\.sums",
             "none of its own: a changed sum differs from the files it sums, a missing one "
             "is damage in a stage written with checksums",
             "`verify --repair` removes the model; the re-run fits it again"),
    FileKind("pack index", rf"{_STAGE}/packed/pack\.json", "sealed (to its stage)",
             "`verify --repair` removes the pack; the re-run recomputes its items"),
    FileKind("packed file", rf"{_STAGE}/packed/shard-\d{{4,}}-of-\d{{4,}}\.[0-9a-f]+\.h5",
             "`sums` in pack.json; each dataset's `crc32` attribute",
             "`verify --repair` rewrites it with the items that pass their checksums; the "
             "re-run recomputes the others"),
    FileKind("name", rf"names/{_NAME}", "its second line: the CRC of the name and its stage",
             "`verify --repair` removes it; the re-run of the command that named the stage "
             "names it again"),
    FileKind("unfinished run", rf"names/\.running/{_NAME}",
             "its second line: the CRC of the name and its stage",
             "`verify --repair` removes it; the re-run marks the run again"),
    FileKind("content-hash cache", r"content-hashes\.json", "sealed",
             "`verify --repair` hashes its files again (a cache: a run re-hashes what it "
             "lacks)"),
    FileKind("process marker", rf"{_STAGE}/running/[^/]+-\d+", None,
             "empty: held with flock while its process computes the stage; a lost one is "
             "made again by the next run"),
    FileKind("planned work", rf"{_STAGE}/planned-work/[^/]+-\d+\.json", "sealed (to its stage)",
             "a live run's plan of its items' work, removed when it ends (featpipe.progress): "
             "`featpipe status` ignores a damaged or stale one (it counts items then), the "
             "next run removes it"),
    FileKind("lock", rf"{_STAGE}/locks/[^/]+", None,
             "empty: held with flock while a run computes the stage; a lost one is made "
             "again by the next run"),
    FileKind("task log", r"logs/.+", None,
             "`featpipe submit`'s sbatch script and its tasks' logs: never read back by "
             "featpipe"),
    FileKind("spill file", rf"{_STAGE}/featpipe-spill-[^/]+\.tmp", None,
             "a running encode's or extraction's scratch array (memory-mapped), deleted once "
             "unmapped; a killed process may leave one, never read back"),
    FileKind("temporary", r".*\.tmp\.[^./]+\.\d+(/.*)?", None,
             "a write in progress, or the leftover of a killed one: `cache gc` removes it "
             "once its process is gone"),
)


_ANY_KIND = re.compile("|".join(f"(?:{kind.pattern})" for kind in FILE_KINDS))


def is_known(relative: str) -> bool:
    """Whether ``relative`` is the path of a file featpipe writes (:func:`kind_of` is not
    None; one match of all the patterns at once, for listings of many files)."""
    return _ANY_KIND.fullmatch(relative) is not None


def kind_of(relative: str) -> FileKind | None:
    """The kind of the file at ``relative`` (a path inside a store, ``/`` between its
    parts), or None for a file featpipe does not write."""
    for kind in FILE_KINDS:
        if kind.matches(relative):
            return kind
    return None
