"""The documented uses of ``--features torchvision`` run as written (issue 41): the recipes
of docs/extraction.md ("ResNet-50 -> hrp -> chi2+ser", "R(2+1)D clips -> rankpool") on
UCF101-shaped folders, with the stand-ins their ``<!-- docs-test: replace OLD => NEW -->``
comments name (rendered clips, random weights), and the plugin module of docs/python-api.md
(``<!-- docs-test: file NAME -->``: the block is that file's content) with the commands
after it. The pages run once, in the docs runner (tests/_docs_blocks.py); these tests check
what those runs left."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from featpipe.store import Store
from tests import _docs_blocks as docs
from tests.conftest import REPO

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")


def page_folder(page: str, heading: str) -> tuple[str, Path]:
    """The shared docs run of ``page`` (tests/cli/test_docs_run.py runs every block, with its
    ``docs-test`` stand-ins): the stdout of the blocks under ``heading`` and the run's folder."""
    run = docs.page_run(page)
    assert run.failure is None, run.failure
    text = (REPO / page).read_text(encoding="utf-8")
    section = text.split(heading, 1)[1].split("\n## ", 1)[0]
    ran = [r for r in run.runs if r.ran and r.block.text in section]
    assert ran, f"no block of {page} under {heading!r} ran"
    return "".join(r.stdout for r in ran), run.folder


def test_extraction_recipes_run_on_rendered_ucf101_shaped_folders():
    out, folder = page_folder("docs/extraction.md", "### Recipes on UCF101-shaped folders")
    store = Store(folder / "S")
    r50, r21d = store.resolve("r50"), store.resolve("r21d")
    first = sorted(r50.done_ids())[0]
    assert len(r50.done_ids()) == len(r21d.done_ids()) == 8
    assert r50.params["arch"] == "resnet50" and r50.params["preprocess"]["resize"] == [232]
    assert r50.read_item(first).shape == (3, 2048)  # 8 frames at 12 fps: 0, 0.25, 0.42 s
    assert r21d.params["clip"] == 4 and r21d.read_item(first).shape == (2, 512)  # 8 frames
    assert store.resolve("r21d-rp").read_item(first).shape == (1024,)  # both directions
    assert len(re.findall(r"split 1: accuracy [0-9.]+ \(\d+/4\)", out)) == 2, out


def test_the_plugin_network_of_the_python_api_page_runs_as_written():
    out, folder = page_folder("docs/python-api.md", "## A network as a feature (plugin)")
    assert "summary: 4 done" in out, out
    stage = Store(folder / "S").resolve("tiny")
    assert stage.params["width"] == 8 and stage.params["weights"] == "random:0"
    # the module's network by hand: seeded tiny_net(8) on the frames resized (shorter side
    # 72, antialiased bilinear) and centre-cropped (64) by torchvision's functions
    import importlib.util

    from torchvision.transforms import functional as F

    from featpipe.io.video import iter_frames
    from featpipe.manifest import Manifest

    spec = importlib.util.spec_from_file_location("tiny_net", folder / "tiny_net.py")
    tiny_net = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny_net)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = tiny_net.tiny_net(8).eval()
    manifest = Manifest.read(folder / "plugin-clips.csv")
    item = next(iter(manifest))
    frames = [torch.from_numpy(f).permute(2, 0, 1) for _, f in
              iter_frames(manifest.resolve_path(item))]
    batch = torch.stack([F.normalize(F.convert_image_dtype(F.center_crop(
        F.resize(f, [72], antialias=True), [64]), torch.float), [0.485, 0.456, 0.406],
        [0.229, 0.224, 0.225]) for f in frames])
    with torch.no_grad():
        expected = model(batch).numpy()
    got = stage.read_item(item.id)
    assert got.shape == (6, 16)
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-6)
