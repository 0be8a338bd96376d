"""Every kind of file a store writes, damaged four ways (issue 39 §5; restic's and SQLite's
corruption tests): a byte flipped, the file cut to half, deleted, replaced by the file of
the same kind from another store (valid there, of the same size).  For each, ``cache
verify`` names it (exit 1), ``cache verify --repair`` exits 0, and running again the
commands that made the store gives every result back bit for bit.

The kinds are those of :data:`featpipe.store.file_kinds.FILE_KINDS`: a store made by every
command holds no file of another kind, holds a file of each kind (but the transient
ones), and :data:`TABLE` has a row for each kind.  A cell is ``NAMED`` (verify names the
damage) or the reason why the damage is harmless and no command can see it (verify then
reports nothing, and the results are still bit-equal after the commands run again).

The store holds batch files (a stage of at least :data:`featpipe.store.batches.MIN_ITEMS` items,
lowered here to 10 so that the 12 imported items commit in one), the index of every stage
that ran, and a view (``encode --method fisher-group`` of stored per-frame grouped Fisher
vectors, on the toy grouped method of ``tests/_cell_groups.py``).
"""

from __future__ import annotations

import functools
import os
import re
import shutil
import time
from pathlib import Path

import cv2
import numpy as np
import pytest

from featpipe.fileio import HOST
from featpipe.store import Store
from featpipe.store.file_kinds import FILE_KINDS, kind_of
from tests._avi import write_avi
from tests.conftest import invoke_cli

NAMED = "named"
EMPTY = "an empty file: nothing to flip or cut"
DAMAGES = ("flip", "truncate", "delete", "swap")
#: kind -> damage -> NAMED or why the damage changes nothing a command could see
TABLE = {
    "stage record": dict.fromkeys(DAMAGES, NAMED),
    "view record": dict.fromkeys(DAMAGES, NAMED),
    "item list": dict.fromkeys(DAMAGES, NAMED),
    "read hashes": dict.fromkeys(DAMAGES, NAMED),
    "item sidecar": dict.fromkeys(DAMAGES, NAMED),
    "item array": dict.fromkeys(DAMAGES, NAMED),
    "ledger": dict.fromkeys(DAMAGES, NAMED),
    "batch file": dict.fromkeys(DAMAGES, NAMED),
    "index record": {"flip": NAMED, "truncate": NAMED, "swap": NAMED,
                     "delete": "a cache of the ledgers: folded again, the next run writes it"},
    "index table": dict.fromkeys(DAMAGES, NAMED),
    "model arrays": dict.fromkeys(DAMAGES, NAMED),
    "model metadata": dict.fromkeys(DAMAGES, NAMED),
    "model checksums": dict.fromkeys(DAMAGES, NAMED),
    "pack index": dict.fromkeys(DAMAGES, NAMED),
    "packed file": dict.fromkeys(DAMAGES, NAMED),
    "name": {"flip": NAMED, "truncate": NAMED, "swap": NAMED,
             "delete": "a name deleted is a name removed (`cache rm`): nothing records it"},
    "unfinished run": {"flip": NAMED, "truncate": NAMED, "swap": NAMED,
                       "delete": "a marker deleted is a run forgotten: its re-run marks it"},
    "content-hash cache": {"flip": NAMED, "truncate": NAMED,
                           "delete": "a cache: the files are hashed again",
                           "swap": "another store's cache holds other files: none is used"},
    "process marker": {"flip": EMPTY, "truncate": EMPTY, "delete": "made again by a run",
                       "swap": "every marker is the same empty file"},
    "lock": {"flip": EMPTY, "truncate": EMPTY, "delete": "made again by a run",
             "swap": "every lock is the same empty file"},
}
#: Kinds a finished store does not hold (written by other commands or while they run).
TRANSIENT = {"task log": "written by `featpipe submit` and SLURM only",
             "temporary": "only while a write runs, or left by a killed one",
             "spill file": "only while an encode or extraction runs, or left by a killed one",
             "planned work": "only while a run computes the stage, or left by a killed one"}
#: Batch files from this many items on (featpipe.store.batches.MIN_ITEMS, 1000): the import of 12.
MIN_ITEMS = 10
#: The toy grouped feature method the view is made from (its options and its name are
#: made when the command line is first imported, which may be before this module sets
#: $FEATPIPE_FEATURES: these steps run through the library, as the commands would).
PLUGIN = "tests._cell_groups"


def _grouped(data: Path, store: Path) -> None:
    """``extract -f cell-groups --every 1 --sample-descriptors 400 -n gsample``, ``fit gmm
    --groups colour,grey --pca-fraction 0.5 -k 2 -n g``, ``extract ... --encode fisher --gmm g
    --per-frame -n fv`` and ``encode -i fv -m fisher-group --gmm g --group grey -n grey``: a
    view of one group's columns of the stored per-frame grouped Fisher vectors."""
    from featpipe import stages
    from featpipe.extract.settings import ExtractSettings
    from featpipe.io.video import Sampling
    from featpipe.manifest import Manifest

    root, manifest = Store(store), Manifest.read(data / "vid.csv")

    def extract(name, **settings):
        stages.extract(root, manifest, "cell-groups", sampling=Sampling(every=1),
                       settings=ExtractSettings(**settings), name=name)

    extract("gsample", sample_descriptors=400)
    stages.fit_gmm(root, "gsample", name="g", groups="colour,grey", pca_fraction=0.5,
                   n_components=2)
    extract("fv", encode="fisher", encode_params={"gmm": "g", "per_frame": True})
    stages.encode(root, "fv", "fisher-group", {"gmm": "g", "group": "grey"}, name="grey")


@pytest.fixture(autouse=True)
def _batches_and_groups(monkeypatch):
    monkeypatch.setattr("featpipe.store.batches.MIN_ITEMS", MIN_ITEMS)
    monkeypatch.setenv("FEATPIPE_FEATURES", PLUGIN)


def _write_data(folder: Path, seed: int) -> None:
    """Twelve (T, 8) float32 sequences and four 24 x 24 images, with their manifests."""
    rng = np.random.default_rng(seed)
    (folder / "npy").mkdir(parents=True)
    (folder / "img").mkdir()
    rows = ["id,path,label,split1"]
    for i in range(12):
        np.save(folder / "npy" / f"v{i:02d}.npy",
                rng.standard_normal((5 + i % 3, 8)).astype(np.float32))
        rows.append(f"v{i:02d},npy/v{i:02d}.npy,c{i % 3},{'train' if i % 2 else 'test'}")
    (folder / "m.csv").write_text("\n".join(rows) + "\n")
    (folder / "part.csv").write_text("\n".join(rows[:4] + ["w99,npy/w99.npy,c0,train"]
                                               + rows[4:6]) + "\n")
    rows = ["id,path,label,split1"]
    for i in range(4):  # sizes differ between items and between the two stores' data
        side = 24 + 8 * ((i + seed) % 2)
        cv2.imwrite(str(folder / "img" / f"i{i}.png"), rng.integers(0, 256, (side, 24, 3),
                                                                    np.uint8))
        rows.append(f"i{i},img/i{i}.png,c{i % 2},{'train' if i < 2 else 'test'}")
    (folder / "im.csv").write_text("\n".join(rows) + "\n")
    rows = ["id,path,label,split1"]
    for k in range(2):  # two 6-frame clips of noise drifting
        base = rng.integers(0, 256, (40, 56, 3), np.uint8)
        write_avi(folder / f"c{k}.avi", [base[t:t + 32, 2 * t:2 * t + 48] for t in range(6)], 10)
        rows.append(f"c{k},c{k}.avi,c{k},train")
    (folder / "vid.csv").write_text("\n".join(rows) + "\n")


def _commands(data: Path, store: Path) -> list[tuple]:
    """The commands that make the store, each with its exit status: every kind of file."""
    return [
        (("import", "--manifest", data / "m.csv", "--from", data / "npy", "-s", store,
          "--name", "feat"), 0),
        (("extract", "-m", data / "im.csv", "-s", store, "-f", "dsift", "--sizes", "4",
          "--step", "8", "-n", "sift"), 0),
        (("fit", "standardize", "-s", store, "--input", "feat", "-n", "z"), 0),
        (("encode", "-s", store, "-i", "feat", "-m", "avg", "-n", "avg"), 0),
        (("cache", "pack", "-s", store, "avg", "--shards", "2"), 0),
        # per-frame grouped Fisher vectors, and a view of one group's columns of them
        (functools.partial(_grouped, data, store), 0),
        # an unfinished run: w99 has no file, the run stops there and keeps its marker
        (("import", "--manifest", data / "part.csv", "--from", data / "npy", "-s", store,
          "--name", "part"), 1),
    ]


def _run(commands) -> None:
    for args, status in commands:
        if callable(args):  # steps run through the library
            args()
            continue
        result = invoke_cli(*args)
        assert result.exit_code == status, (args, result.output)


def _make(folder: Path, seed: int) -> Path:
    _write_data(folder / "data", seed)
    store = folder / "store"
    _run(_commands(folder / "data", store))
    running = Store(store).resolve("feat").path / "running"
    running.mkdir(exist_ok=True)
    (running / f"{HOST}-999999").touch()  # the process marker a killed run leaves
    return store


@pytest.fixture(scope="module")
def stores(tmp_path_factory):
    """The store made by every command, and another one made from other data (the donor of
    the replacements), each with its data folder beside it (same path lengths)."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setattr("featpipe.store.batches.MIN_ITEMS", MIN_ITEMS)
        patch.setenv("FEATPIPE_FEATURES", PLUGIN)
        return (_make(tmp_path_factory.mktemp("main"), 0),
                _make(tmp_path_factory.mktemp("twin"), 1))


def _files(store: Path) -> dict[str, str]:
    """Every file of the store (relative path) and its kind's name."""
    found = {}
    for path in sorted(store.rglob("*")):
        if path.is_file():
            relative = path.relative_to(store).as_posix()
            kind = kind_of(relative)
            found[relative] = kind.name if kind is not None else None
    return found


def results(store: Path) -> dict:
    """What every name gives: its stage folder and each item's (or model's) arrays, bit for
    bit, with the item list; the unfinished run's stage as ``featpipe status`` follows it."""
    from featpipe.stages.base import latest_stage

    found = {}
    root = Store(store)
    for name in ("feat", "sift", "z", "avg", "part", "g", "fv", "grey"):
        stage = latest_stage(root, name)
        entry = {"stage": stage.name, "items": stage.items.to_csv(None)}
        for item_id in sorted(stage.done_ids()):
            array = stage.read_item(item_id)
            entry[item_id] = (array.dtype.str, array.shape, array.tobytes(),
                              {k: v.tobytes() for k, v in sorted(stage.extras_of(item_id)
                                                                 .items())})
        for model in stage.model_names():
            arrays, meta = stage.load_model(model)
            entry[model] = ({k: v.tobytes() for k, v in arrays.items()}, meta)
        found[name] = entry
    found["names"] = root.names()
    return found


def test_a_store_made_by_every_command_holds_every_kind_and_no_other(stores):
    store, _ = stores
    files = _files(store)
    unknown = [path for path, kind in files.items() if kind is None]
    assert not unknown, f"files of no kind in featpipe.store.file_kinds.FILE_KINDS: {unknown}"
    assert {k.name for k in FILE_KINDS} - set(files.values()) == set(TRANSIENT)
    assert set(TABLE) | set(TRANSIENT) == {k.name for k in FILE_KINDS}, \
        "a kind of file without a row in the damage table"
    assert all(set(row) == set(DAMAGES) for row in TABLE.values())
    verify = invoke_cli("cache", "verify", "--store", store)
    assert verify.exit_code == 0 and "0 problem(s)" in verify.output, verify.output
    assert "note:" not in verify.output  # every file of this version has its checksum


def _target(store: Path, kind: str) -> Path:
    """The file of ``kind`` the table damages: the first of its kind by path."""
    return store / next(path for path, k in _files(store).items() if k == kind)


def _donor(twin: Path, store: Path, target: Path) -> Path:
    """The file of the twin store in the target's place: the same kind, from the stage (or
    name) made by the same command; the same size when one of them is."""
    kind = kind_of(target.relative_to(store).as_posix()).name
    relative = target.relative_to(store).parts
    candidates = [twin / p for p, k in _files(twin).items() if k == kind]
    if relative[0] == "stages":  # the twin's stage of the same kind, same place inside it
        same_kind = relative[1].rsplit("-", 1)[0]
        candidates = [c for c in candidates
                      if c.relative_to(twin).parts[1].startswith(same_kind + "-")
                      and len(c.relative_to(twin).parts) == len(relative)]
    else:
        candidates = [c for c in candidates if c.name == target.name] or candidates
    size = target.stat().st_size
    return min(candidates, key=lambda c: (c.stat().st_size != size, str(c)))


def _damage(target: Path, how: str, donor: Path) -> None:
    if how == "flip":
        data = bytearray(target.read_bytes())
        data[len(data) // 2] ^= 0x01
        target.write_bytes(bytes(data))
    elif how == "truncate":
        target.write_bytes(target.read_bytes()[:target.stat().st_size // 2])
    elif how == "delete":
        target.unlink()
    else:
        shutil.copyfile(donor, target)


def _clues(store: Path, target: Path) -> list[str]:
    """What a problem line naming the damage holds: the file's name, or what it is of (an
    item id, a model, a name), or, for a ledger, the items its loss leaves unaccounted for."""
    kind = kind_of(target.relative_to(store).as_posix()).name
    if kind.startswith("item "):
        return [target.name, repr(re.sub(r"-[0-9a-f]{20}(\+\w+)?\.npy$", "", target.name))]
    if kind.startswith("model "):
        return [f"model {target.stem!r}"]
    if kind in ("name", "unfinished run"):
        return [f" {target.name!r}"]
    if kind == "ledger":
        return [target.name, "no ledger line says"]
    return [target.name]


def _age(store: Path) -> None:
    """Everything written an hour ago (a stage folder without stage.json is then broken,
    not being created)."""
    past = time.time() - 3600
    for path in [store, *store.rglob("*")]:
        os.utime(path, (past, past), follow_symlinks=False)


CASES = [(kind, how) for kind, row in TABLE.items() for how, expect in row.items()
         if expect != EMPTY]


@pytest.mark.slow
@pytest.mark.parametrize(("kind", "how"), CASES, ids=[f"{k}-{h}" for k, h in CASES])
def test_damage_is_named_repaired_and_recomputed_bit_for_bit(stores, tmp_path, kind, how):
    pristine, twin = stores
    store = tmp_path / "store"
    shutil.copytree(pristine, store, symlinks=True)
    _age(store)
    before = results(store)
    target = _target(store, kind)
    _damage(target, how, _donor(twin, pristine, _target(pristine, kind)))
    verify = invoke_cli("cache", "verify", "--store", store)
    problems = [line for line in verify.output.splitlines() if line.startswith("problem:")]
    if TABLE[kind][how] == NAMED:
        assert verify.exit_code == 1, verify.output
        assert any(clue in p for p in problems for clue in _clues(store, target)), \
            verify.output
    else:
        assert verify.exit_code == 0 and not problems, verify.output
    repair = invoke_cli("cache", "verify", "--store", store, "--repair")
    assert repair.exit_code == 0, repair.output
    _run(_commands(pristine.parent / "data", store))
    assert results(store) == before
    again = invoke_cli("cache", "verify", "--store", store)
    assert again.exit_code == 0, again.output
