"""The documented uses of ``--features torchvision`` run as written (issue 41): the recipes
of docs/extraction.md ("ResNet-50 -> hrp -> chi2+ser", "R(2+1)D clips -> rankpool") on
UCF101-shaped folders, with the stand-ins their ``<!-- docs-test: replace OLD => NEW -->``
comments name (rendered clips, random weights), and the plugin module of docs/python-api.md
(``<!-- docs-test: file NAME -->``: the block is that file's content) with the commands
after it."""

from __future__ import annotations

import re

import numpy as np
import pytest

from featpipe.store import Store
from tests.cli.test_quickstart import run_block
from tests.conftest import REPO

torch = pytest.importorskip("torch")
pytest.importorskip("torchvision")

BLOCK = re.compile(r"((?:<!-- docs-test: [^\n]*-->\n)*)```(\w+)\n(.*?)```", re.S)


def blocks(page: str, start: str, end: str = "\n## ") -> list[tuple[str, str]]:
    """(language, text) of the fenced blocks of ``page`` from heading ``start`` to the next
    ``end``, each with its ``docs-test`` comments applied: ``replace OLD => NEW`` replaced,
    ``file NAME`` as ("file NAME", text)."""
    text = (REPO / "docs" / page).read_text(encoding="utf-8")
    section = text.split(start, 1)[1].split(end, 1)[0]
    found = []
    for comments, language, body in BLOCK.findall(section):
        for directive in re.findall(r"<!-- docs-test: (.*?) -->", comments):
            kind, _, argument = directive.partition(" ")
            if kind == "replace":
                old, new = argument.split(" => ", 1)
                assert old in body, (old, body)
                body = body.replace(old, new)
            elif kind == "file":
                language = f"file {argument}"
        found.append((language, body))
    return found


def test_extraction_recipes_run_on_rendered_ucf101_shaped_folders(tmp_path):
    found = blocks("extraction.md", "### Recipes on UCF101-shaped folders", "\n## ")
    assert [language for language, _ in found] == ["bash", "bash", "bash"]
    assert "featpipe example clips data/UCF101" in found[0][1]  # the stand-in data
    assert all("random:0" in body for _, body in found[1:])
    out = "".join(run_block(body, tmp_path) for _, body in found)
    store = Store(tmp_path / "S")
    r50, r21d = store.resolve("r50"), store.resolve("r21d")
    first = sorted(r50.done_ids())[0]
    assert len(r50.done_ids()) == len(r21d.done_ids()) == 8
    assert r50.params["arch"] == "resnet50" and r50.params["preprocess"]["resize"] == [232]
    assert r50.read_item(first).shape == (3, 2048)  # 8 frames at 12 fps: 0, 0.25, 0.42 s
    assert r21d.params["clip"] == 4 and r21d.read_item(first).shape == (2, 512)  # 8 frames
    assert store.resolve("r21d-rp").read_item(first).shape == (1024,)  # both directions
    assert len(re.findall(r"split 1: accuracy [0-9.]+ \(\d+/4\)", out)) == 2, out


def test_the_plugin_network_of_the_python_api_page_runs_as_written(tmp_path):
    found = blocks("python-api.md", "## A network as a feature (plugin)")
    assert [language for language, _ in found] == ["file tiny_net.py", "bash"]
    (tmp_path / "tiny_net.py").write_text(found[0][1], encoding="utf-8")
    out = run_block(found[1][1], tmp_path)
    assert "summary: 4 done" in out, out
    stage = Store(tmp_path / "S").resolve("tiny")
    assert stage.params["width"] == 8 and stage.params["weights"] == "random:0"
    # the module's network by hand: seeded tiny_net(8) on the frames resized (shorter side
    # 72, antialiased bilinear) and centre-cropped (64) by torchvision's functions
    import importlib.util

    from torchvision.transforms import functional as F

    from featpipe.io.video import iter_frames
    from featpipe.manifest import Manifest

    spec = importlib.util.spec_from_file_location("tiny_net", tmp_path / "tiny_net.py")
    tiny_net = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(tiny_net)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        model = tiny_net.tiny_net(8).eval()
    manifest = Manifest.read(tmp_path / "plugin-clips.csv")
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
