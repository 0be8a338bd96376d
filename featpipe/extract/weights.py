"""Network weights as a feature method takes them: a checkpoint file (``--weights PATH``, a
torch state dict read with ``torch.load(weights_only=True)``: no pickle) or ``random:SEED``
(seeded random weights, for tests and demos).

A stage key holds the weights' identity, never their path: ``random:SEED`` or the file's
SHA-256 (:func:`weights_identity`), so a moved checkpoint keeps its stages and a rewritten
one gets new ones.  :func:`read_checkpoint` hashes exactly the bytes it loads, so a network
can say which weights it holds and a stage can check them against its key.
"""

from __future__ import annotations

import hashlib
import io
from pathlib import Path

from featpipe.errors import FeatpipeError, InputError


def random_seed(weights: str) -> int | None:
    """The seed of ``random:SEED``; None for a path."""
    if not weights.startswith("random:"):
        return None
    try:
        return int(weights.split(":", 1)[1])
    except ValueError:
        raise InputError(f"--weights random:SEED needs an integer seed, got "
                         f"{weights!r}") from None


def weights_identity(weights: str | None, help_text: str) -> str:
    """What identifies the weights in a stage key: ``random:SEED`` or the file's sha256.
    ``help_text`` says where to get them (a missing value or file is an error that says it)."""
    if weights is None:
        raise FeatpipeError(help_text)
    seed = random_seed(weights)
    if seed is not None:
        return f"random:{seed}"
    path = Path(weights)
    if not path.is_file():
        raise FeatpipeError(f"--weights {weights}: no such file. {help_text}")
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 22), b""):
            digest.update(block)
    return f"sha256:{digest.hexdigest()}"


def read_checkpoint(weights: str, help_text: str) -> tuple[dict, str]:
    """(state dict, identity) of a checkpoint file, read once: its bytes are hashed, then
    loaded with ``torch.load(weights_only=True)``; a ``{"state_dict": ...}`` wrapper is
    unwrapped.  A missing file or one that is no torch state dict is a one-line error."""
    import torch

    weights_identity(weights, help_text)  # a missing file says where to get one
    try:
        data = Path(weights).read_bytes()
        identity = f"sha256:{hashlib.sha256(data).hexdigest()}"
        state = torch.load(io.BytesIO(data), map_location="cpu", weights_only=True)
        del data
    except Exception as err:
        raise FeatpipeError(f"--weights {weights}: cannot load it as a torch checkpoint "
                            f"({type(err).__name__}: {str(err).splitlines()[0][:200]})") \
            from None
    if isinstance(state, dict) and isinstance(state.get("state_dict"), dict):
        state = state["state_dict"]
    if not isinstance(state, dict):
        raise FeatpipeError(f"--weights {weights}: expected a state dict, got "
                            f"{type(state).__name__}")
    return state, identity


def check_state_dict(weights: str, state: dict, expected: dict, what: str) -> None:
    """A one-line error unless ``state`` has exactly the names and shapes of ``expected``
    (a model's ``state_dict()``); ``what`` names the model (``a torchvision vgg16``)."""
    shapes = {k: tuple(v.shape) for k, v in expected.items()}
    missing = sorted(set(shapes) - set(state))
    unexpected = sorted(set(state) - set(shapes))
    wrong = sorted(k for k in shapes if k in state
                   and tuple(getattr(state[k], "shape", ())) != shapes[k])
    if missing or unexpected or wrong:
        raise FeatpipeError(f"--weights {weights} is not {what} checkpoint: missing "
                            f"{missing[:3]}, unexpected {unexpected[:3]}, wrong shape "
                            f"{wrong[:3]}")
