"""Network weights as a feature method takes them: a checkpoint file (``--weights PATH``, a
torch state dict read with ``torch.load(weights_only=True)``: no pickle) or ``random:SEED``
(seeded random weights, for tests and demos; SEED from 0 to 2**64 - 1, the range torch's
generators take, a usage error outside it).

A stage key holds the weights' identity, never their path: ``random:SEED`` or the file's
SHA-256 (:func:`weights_identity`), so a moved checkpoint keeps its stages and a rewritten
one gets new ones.  The identity is computed only for weights the network can use: the
file is loaded (tensors only) and checked by the network's own ``check`` (every name and
shape of its architecture) before any stage or run marker exists, so a pickle payload, a
truncated file, another architecture's checkpoint or tensors of the wrong shape are one
line in featpipe's words.  The check is done once per file content and network; the state
it loaded is kept for the model load that follows (:func:`read_checkpoint`), which then
reads nothing again.  :func:`read_checkpoint` gives exactly the state of the bytes it
hashed, so a network can say which weights it holds and a stage can check them against its
key.
"""

from __future__ import annotations

import hashlib
import io
import re
import warnings
from collections.abc import Callable
from pathlib import Path

from featpipe.errors import FeatpipeError, ParameterError

#: the seeds torch's generators take without remapping (``torch.manual_seed``: a negative
#: seed is remapped to 0xffff_ffff_ffff_ffff + seed, so it would be a second name of one)
SEED_RANGE = (0, 2**64 - 1)

#: a check of a loaded state dict: raises FeatpipeError (one line) when the network cannot
#: use it; its ``what`` names the network in the cache of checks done
StateCheck = Callable[[dict], None]

#: (path, device, inode, size, mtime) -> ``sha256:HEX`` of the file: a file is hashed once
#: while it is unchanged
_DIGESTS: dict[tuple, str] = {}
#: (sha256, network, the file as given) -> None (usable) or the error line of the check
_CHECKED: dict[tuple[str, str, str], str | None] = {}
#: the state dict the last check loaded, by its bytes' sha256: the model load takes it
_LOADED: dict[str, dict] = {}


def random_seed(weights: str) -> int | None:
    """The seed of ``random:SEED``; None for a path; a :class:`ParameterError` for a seed
    that is no integer or outside :data:`SEED_RANGE`."""
    if not weights.startswith("random:"):
        return None
    text = weights.split(":", 1)[1].strip()
    try:
        seed = int(text)
    except ValueError:
        raise ParameterError("weights", f"random:SEED needs an integer seed, got "
                             f"{weights!r}") from None
    low, high = SEED_RANGE
    if not low <= seed <= high:
        raise ParameterError("weights", f"random:SEED needs a seed from {low} to 2**64 - 1 "
                             f"(the range torch's generators take), got {text}")
    return seed


def check_seed(params) -> None:
    """A feature method's parameter rule: ``random:SEED`` within :data:`SEED_RANGE`."""
    if isinstance(params.get("weights"), str):
        random_seed(params["weights"])


def weights_identity(weights: str | None, help_text: str, check: StateCheck | None = None,
                     what: str = "") -> str:
    """What identifies the weights in a stage key: ``random:SEED`` or the file's sha256.
    ``help_text`` says where to get them (a missing value or file is an error that says it).
    With ``check`` (the network ``what``'s test of a state dict) the file is loaded and
    checked, once per content and network, and an unusable file is a one-line error."""
    if weights is None:
        raise FeatpipeError(help_text)
    seed = random_seed(weights)
    if seed is not None:
        return f"random:{seed}"
    path = Path(weights)
    if not path.is_file():
        raise FeatpipeError(f"--weights {weights}: no such file. {help_text}")
    if check is None:
        return _digest(path)
    identity = _DIGESTS.get(_stat_key(path))
    if identity is None or (identity, what, weights) not in _CHECKED:
        identity, problem = _checked(weights, help_text, check)
        if identity is None:  # the file could not be read: nothing to remember
            raise FeatpipeError(problem)
        _CHECKED[identity, what, weights] = problem
    problem = _CHECKED[identity, what, weights]
    if problem is not None:
        raise FeatpipeError(problem)
    return identity


def _checked(weights: str, help_text: str, check: StateCheck) -> tuple[str | None, str | None]:
    """(identity of the bytes read, None or why ``check`` refuses them); a usable state is
    held for the model load that follows (one at a time)."""
    try:
        state, identity = read_checkpoint(weights, help_text)
    except FeatpipeError as err:
        return _DIGESTS.get(_stat_key(Path(weights))), str(err)
    try:
        check(state)
    except FeatpipeError as err:
        return identity, str(err)
    _LOADED.clear()
    _LOADED[identity] = state
    return identity, None


def _stat_key(path: Path) -> tuple:
    info = path.stat()
    return (str(path.resolve()), info.st_dev, info.st_ino, info.st_size, info.st_mtime_ns)


def _digest(path: Path) -> str:
    """``sha256:HEX`` of a file, hashed again only when its size, time or inode changed."""
    key = _stat_key(path)
    if key not in _DIGESTS:
        digest = hashlib.sha256()
        with open(path, "rb") as handle:
            for block in iter(lambda: handle.read(1 << 22), b""):
                digest.update(block)
        _DIGESTS[key] = f"sha256:{digest.hexdigest()}"
    return _DIGESTS[key]


def read_checkpoint(weights: str, help_text: str) -> tuple[dict, str]:
    """(state dict, identity) of a checkpoint file: the state a check loaded from these
    bytes (:func:`weights_identity`), else read once: its bytes hashed, then loaded with
    ``torch.load(weights_only=True)``; a ``{"state_dict": ...}`` wrapper is unwrapped.  A
    missing file or one that is no torch state dict is a one-line error."""
    path = Path(weights)
    if not path.is_file():
        raise FeatpipeError(f"--weights {weights}: no such file. {help_text}")
    key = _stat_key(path)
    held = _DIGESTS.get(key)
    if held in _LOADED:
        return _LOADED.pop(held), held
    import torch

    try:
        data = path.read_bytes()
    except OSError as err:
        raise FeatpipeError(f"--weights {weights}: cannot read it ({err.strerror})") from None
    identity = _DIGESTS[key] = f"sha256:{hashlib.sha256(data).hexdigest()}"
    try:
        with warnings.catch_warnings():  # torch's notes on pickle protocols: not the user's
            warnings.simplefilter("ignore")
            state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
    except Exception as err:
        raise FeatpipeError(f"--weights {weights}: cannot load it as a torch checkpoint "
                            f"({_load_refusal(err)})") from None
    finally:
        del data
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise FeatpipeError(f"--weights {weights}: cannot load it as a torch checkpoint "
                            f"(it holds a {type(state).__name__}, not a state dict of "
                            "tensors)")
    return state, identity


def _load_refusal(err: Exception) -> str:
    """Why ``torch.load(weights_only=True)`` refused a file, in featpipe's words (torch's
    own text advises ``weights_only=False``, which would run the file's code)."""
    import pickle

    text = str(err)
    if isinstance(err, pickle.UnpicklingError):
        named = re.search(r"GLOBAL ([\w.]+)", text)
        if named is None:
            return "it is no torch.save file of tensors"
        return (f"it asks to import {named.group(1)}: pickled Python objects, not only "
                "tensors, and featpipe never unpickles a checkpoint; save the model's "
                "state_dict() with torch.save")
    if isinstance(err, EOFError) or "central directory" in text or "zip archive" in text:
        return "truncated or damaged: its archive is incomplete; copy or download it again"
    first = text.strip().splitlines()[0] if text.strip() else type(err).__name__
    return f"{type(err).__name__}: {first[:200]}"


def check_state_dict(weights: str, state: dict, expected: dict, what: str) -> None:
    """A one-line error unless ``state`` has exactly the names and shapes of ``expected``
    (a model's ``state_dict()``, on any device: only shapes are read); ``what`` names the
    model (``a torchvision vgg16``)."""
    shapes = {k: tuple(v.shape) for k, v in expected.items()}
    missing = sorted(set(shapes) - set(state))
    unexpected = sorted(set(state) - set(shapes))
    wrong = sorted(k for k in shapes if k in state
                   and tuple(getattr(state[k], "shape", ())) != shapes[k])
    if missing or unexpected or wrong:
        first = "" if not wrong else (
            f" ({wrong[0]}: {_shape_text(state[wrong[0]])} in the file, "
            f"{list(shapes[wrong[0]])} in the network)")
        raise FeatpipeError(f"--weights {weights} is not {what} checkpoint: missing "
                            f"{missing[:3]}, unexpected {unexpected[:3]}, wrong shape "
                            f"{wrong[:3]}{first}")


def _shape_text(value) -> str:
    shape = getattr(value, "shape", None)
    return f"a {type(value).__name__}" if shape is None else str(list(shape))
