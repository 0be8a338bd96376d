"""A fit stage's models: ``models/<name>.npz`` (arrays), ``models/<name>.json`` (metadata) and
``models/<name>.sums`` (:data:`MODEL_SUMS`: the checksums of both, written last: the commit
point).  A model follows :mod:`featpipe.models` (``to_arrays``/``from_arrays``); nothing is
pickled, and an object array is refused on load.

A planned stage (a dry run) keeps a stand-in of each model it would fit in memory instead
(``stage.stand_in_models``), which later steps of the dry run are planned on
(:func:`stand_in`).
"""

from __future__ import annotations

import io
import json
import zipfile
import zlib
from collections.abc import Mapping

import numpy as np

from featpipe.checksums import CHECKSUM, ChecksumError, as_text, check
from featpipe.errors import FeatpipeError
from featpipe.fileio import atomic_save_npz, atomic_write_bytes, first_line, make_dirs
from featpipe.store.keys import json_default

#: The file beside a model's ``.npz`` and ``.json`` that holds their checksums.
MODEL_SUMS = ".sums"
#: planned stages given stand-in models by a dry run of this process, by folder
_stand_ins: dict[str, object] = {}


def stand_in(path) -> object | None:
    """The planned stage in folder ``path`` that a dry run gave stand-in models, or None."""
    return _stand_ins.get(str(path))


def save_model(stage, name: str, model, meta: Mapping | None = None) -> None:
    """Save a fitted model of ``stage`` as ``models/<name>.npz`` + ``models/<name>.json``,
    then the checksums of both in ``models/<name>.sums``; ``model`` follows
    :mod:`featpipe.models` (``meta`` is added to its metadata) or is a dict of arrays.  A
    planned stage keeps a stand-in of the model's shapes in memory instead."""
    arrays, own = model.to_arrays() if hasattr(model, "to_arrays") else (model, {})
    meta = {**own, **(meta or {})}
    if not stage.exists:
        arrays = {k: np.asarray(v) for k, v in arrays.items()}
        stage.stand_in_models[name] = (arrays, json.loads(json.dumps(
            dict(meta), default=json_default)))
        _stand_ins[str(stage.path)] = stage
        return
    stage._check_on_disk()
    folder = stage.path / "models"
    make_dirs(folder)
    sums = {".npz": atomic_save_npz(folder / f"{name}.npz", arrays, checksum=True)}
    data = json.dumps(dict(meta), indent=2, sort_keys=True,
                      default=json_default).encode("utf-8")
    atomic_write_bytes(folder / f"{name}.json", data)
    sums[".json"] = as_text(zlib.crc32(data))
    atomic_write_bytes(folder / f"{name}{MODEL_SUMS}", json.dumps(sums).encode("utf-8"))


def model_sums(stage, name: str) -> dict[str, str] | None:
    """The checksums of model ``name``'s files by suffix (``.npz``, ``.json``), or None for a
    model saved before featpipe kept them; damaged sums are an error naming them."""
    path = stage.path / "models" / f"{name}{MODEL_SUMS}"
    try:
        sums = json.loads(path.read_text(encoding="utf-8"))
    except FileNotFoundError:
        if stage.checksummed:
            raise FeatpipeError(f"model {name!r} of stage {stage.name} is damaged: {path} "
                                "is missing, and the stage was written with checksums; "
                                "`featpipe cache verify --repair` removes the model and a "
                                "re-run of the fit recomputes it") from None
        return None
    except (OSError, ValueError) as err:
        raise FeatpipeError(f"model {name!r} of stage {stage.name}: {path} is unreadable "
                            f"({first_line(err)})") from None
    if not isinstance(sums, dict) or set(sums) != {".npz", ".json"} or not all(
            isinstance(v, str) and CHECKSUM.match(v) for v in sums.values()):
        raise FeatpipeError(f"model {name!r} of stage {stage.name}: {path} does not hold the "
                            "checksums of the .npz and .json files")
    return sums


def load_model(stage, name: str, cls=None):
    """``(arrays, meta)`` of model ``name``, or ``cls.from_arrays(arrays, meta)``; a damaged
    model is one error line (an object array is refused, never unpickled)."""
    if not stage.exists:
        if name not in stage.stand_in_models:
            raise FeatpipeError(f"stage {stage.name} has no model {name!r} (not fitted "
                                "yet?)")
        arrays, meta = stage.stand_in_models[name]
        return (dict(arrays), dict(meta)) if cls is None else cls.from_arrays(arrays, meta)
    folder = stage.path / "models"
    path = folder / f"{name}.npz"
    sums = stage.model_sums(name) or {}
    try:
        raw = path.read_bytes()  # read once: summed, then parsed
        check(path, as_text(zlib.crc32(raw)), sums.get(".npz"))
        with np.load(io.BytesIO(raw), allow_pickle=False) as data:
            arrays = {}
            for key in data.files:
                try:
                    arrays[key] = data[key]
                except ValueError as err:
                    reason = ("an object array (featpipe never unpickles)"
                              if "allow_pickle" in str(err) else str(err))
                    raise FeatpipeError(f"model {name!r} of stage {stage.name}: array "
                                        f"{key!r} in {path} is {reason}") from None
        path = folder / f"{name}.json"
        raw = path.read_bytes()
        check(path, as_text(zlib.crc32(raw)), sums.get(".json"))
        meta = json.loads(raw.decode("utf-8"))
    except FileNotFoundError:
        raise FeatpipeError(f"stage {stage.name} has no model {name!r} (not fitted yet?)") \
            from None
    except ChecksumError as err:
        raise FeatpipeError(f"model {name!r} of stage {stage.name} is damaged: {err}; "
                            "`featpipe cache verify --repair` removes it and a re-run of "
                            "the fit recomputes it") from None
    except (OSError, ValueError, EOFError, zipfile.BadZipFile, MemoryError) as err:
        raise FeatpipeError(f"model {name!r} of stage {stage.name}: {path} is unreadable "
                            f"({first_line(err)})") from None
    if not isinstance(meta, dict):
        raise FeatpipeError(f"model {name!r} of stage {stage.name}: {path} is not a JSON "
                            "object")
    return (arrays, meta) if cls is None else cls.from_arrays(arrays, meta)


def model_names(stage) -> list[str]:
    """Names of the models ``stage`` holds, whole or in part (a file of a model missing is
    damage ``verify`` reports); a planned stage's, its stand-ins."""
    if not stage.exists:
        return sorted(stage.stand_in_models)
    folder = stage.path / "models"
    if not folder.is_dir():
        return []
    return sorted({p.name.removesuffix(suffix) for suffix in (".npz", ".json", MODEL_SUMS)
                   for p in folder.glob(f"*{suffix}")})


def has_model(stage, name: str) -> bool:
    """Whether model ``name`` is saved: its ``.npz`` and ``.json`` are in place and, in a
    stage written with checksums, its checksums (written last: the commit point); a planned
    stage's, whether it holds a stand-in."""
    if not stage.exists:
        return name in stage.stand_in_models
    folder = stage.path / "models"
    return (folder / f"{name}.npz").exists() and (folder / f"{name}.json").exists() and \
        (not stage.checksummed or (folder / f"{name}{MODEL_SUMS}").exists())
