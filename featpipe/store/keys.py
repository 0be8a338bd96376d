"""The stage key: what a stage computed, as 16 hex digits, so that the same work always lands in
the same folder ``<kind>-<key>`` and a changed parameter in a new one.

A key hashes the stage's kind, its canonical parameter record
(:func:`featpipe.parameters.parameter_record`: declared names, defaults filled, values typed
by the declarations; made JSON here by :func:`canonical_params`), the keys of its inputs and
:data:`featpipe.FORMAT_VERSION`: SHA-256 of the canonical JSON (sorted keys, no spaces, ASCII).
A stored dtype other than float32 is a parameter of the key (:func:`key_params`).
"""

from __future__ import annotations

import hashlib
import json
import re
from collections.abc import Iterable, Mapping
from pathlib import Path

import numpy as np

from featpipe import FORMAT_VERSION

#: What a stage kind looks like (the part of a stage folder's name before its key).
STAGE_KIND = re.compile(r"[a-z][a-z0-9-]*")


def stage_key(kind: str, params: Mapping, input_keys: Iterable[str]) -> str:
    """Hash of kind, parameters (canonical JSON), input keys and the artifact-format version."""
    payload = {
        "kind": kind,
        "params": params,
        "inputs": list(input_keys),
        "format": FORMAT_VERSION,
    }
    text = json.dumps(payload, sort_keys=True, separators=(",", ":"), ensure_ascii=True)
    return hashlib.sha256(text.encode("utf-8")).hexdigest()[:16]


def check_kind(kind: str) -> None:
    if not STAGE_KIND.fullmatch(kind):
        raise ValueError(f"stage kind {kind!r} must match [a-z][a-z0-9-]*")


def canonical_params(params: Mapping) -> dict:
    """``params`` as the JSON values they are stored as (numpy scalars and arrays, paths)."""
    return json.loads(json.dumps(dict(params), default=json_default))


def key_params(params: dict, dtype: str) -> dict:
    """The parameters a key covers: a dtype other than float32 is one of them."""
    return dict(params, dtype=dtype) if dtype != "float32" else params


def json_default(value):
    """JSON for what ``json`` does not write itself (parameters, a model's metadata)."""
    if isinstance(value, np.generic):
        return value.item()
    if isinstance(value, np.ndarray):
        return value.tolist()
    if isinstance(value, Path):
        return str(value)
    raise TypeError(f"not JSON serialisable: {type(value).__name__}")
