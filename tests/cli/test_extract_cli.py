"""``featpipe extract``: stored items and sidecars, stage keys, corrupt inputs, --on-error."""

from __future__ import annotations

import cv2
import numpy as np
import pytest

from featpipe.extract.dsift import DenseSIFT, to_grey
from featpipe.io.video import Sampling, iter_frames
from featpipe.store import Store
from tests.unit.test_video import corrupt_inputs, write_video

DSIFT_FAST = ("--sizes", "8", "--step", "8")


def write_manifest(folder, rows):
    lines = ["id,path,label,split1"] + [f"{i},{p},{lab},{s}" for i, p, lab, s in rows]
    path = folder / "manifest.csv"
    path.write_text("\n".join(lines) + "\n")
    return path


@pytest.fixture
def small_set(tmp_path):
    write_video(tmp_path / "a.mp4", n_frames=12, size=(96, 80))
    rgb = np.zeros((60, 90, 3), np.uint8)
    rgb[:, 45:] = 255
    cv2.imwrite(str(tmp_path / "img.png"), rgb)
    return write_manifest(tmp_path, [("a", "a.mp4", "x", "train"),
                                     ("img", "img.png", "y", "train")])


def test_dsift_items_match_the_library(small_set, tmp_path, cli):
    store = tmp_path / "store"
    result = cli("extract", "-m", small_set, "-s", store, "-f", "dsift", "-n", "ds",
                 "--every", "5", *DSIFT_FAST)
    assert result.exit_code == 0, result.output
    assert "summary: 2 done, 0 skipped (already complete), 0 failed" in result.output
    stage = Store(store).resolve("ds")
    extras = stage.extras_of("a")
    np.testing.assert_allclose(extras["timestamps"], [0.0, 0.5, 1.0], atol=1e-6)
    frames = list(iter_frames(tmp_path / "a.mp4", Sampling(every=5)))
    sift = DenseSIFT(sizes=(8,), step=8)
    expected = [sift.compute(to_grey(f)) for _, f in frames]
    np.testing.assert_allclose(stage.read_item("a"),
                               np.concatenate([r.descriptors for r in expected]), atol=1e-6)
    np.testing.assert_array_equal(extras["positions"],
                                  np.concatenate([r.positions for r in expected]))
    np.testing.assert_array_equal(np.bincount(extras["frame_index"]),
                                  [len(r.descriptors) for r in expected])
    assert stage.extras_of("img")["timestamps"].tolist() == [0.0]

    same = cli("extract", "-m", small_set, "-s", store, "-f", "dsift", "--every", "5",
               *DSIFT_FAST)
    assert "0 done, 2 skipped" in same.output
    changed = cli("extract", "-m", small_set, "-s", store, "-f", "dsift", "--every", "4",
                  *DSIFT_FAST)
    assert "2 done" in changed.output  # a changed parameter is a new stage


def test_manifest_change_gives_a_new_stage(small_set, tmp_path, cli):
    store = tmp_path / "store"
    first = cli("extract", "-m", small_set, "-s", store, "-f", "dsift", *DSIFT_FAST, "-n", "one")
    small_set.write_text(small_set.read_text().replace("img,img.png", "img2,img.png"))
    second = cli("extract", "-m", small_set, "-s", store, "-f", "dsift", *DSIFT_FAST, "-n",
                 "two")
    assert first.exit_code == 0 and second.exit_code == 0
    assert Store(store).resolve("one") != Store(store).resolve("two")


def test_corrupt_inputs_stop_or_are_skipped(tmp_path, cli):
    bad = corrupt_inputs(tmp_path)
    write_video(tmp_path / "ok.mp4", n_frames=6)
    rows = [("ok", "ok.mp4", "x", "train")] + [
        (item_id, path.name, "x", "train") for item_id, (path, _) in bad.items()]
    manifest = write_manifest(tmp_path, rows)
    store = tmp_path / "store"
    stopped = cli("extract", "-m", manifest, "-s", store, "-f", "dsift", *DSIFT_FAST)
    assert stopped.exit_code == 1
    error_lines = [line for line in stopped.output.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1  # the missing file: before any work
    assert error_lines[0].startswith("error: 1 item(s) have no file (first: 'missing': ")
    assert not store.exists()
    without = write_manifest(tmp_path, [row for row in rows if row[0] != "missing"])
    stopped = cli("extract", "-m", without, "-s", store, "-f", "dsift", *DSIFT_FAST)
    assert stopped.exit_code == 1
    error_lines = [line for line in stopped.output.splitlines() if line.startswith("error:")]
    assert len(error_lines) == 1
    assert any(f"error: {item_id}: " in error_lines[0] for item_id in bad)

    manifest = write_manifest(tmp_path, rows)  # the missing one again: skip computes the others
    skipped = cli("extract", "-m", manifest, "-s", store, "-f", "dsift", *DSIFT_FAST,
                  "--on-error", "skip")
    assert skipped.exit_code == 1  # failures are reported by the exit status
    stage = max(Store(store).all_stages(), key=lambda s: len(s.items.ids))  # every row
    assert "ok" in stage.done_ids()
    failed = stage.failed()
    assert set(failed) == set(bad)
    import re

    for item_id, (_, cause) in bad.items():
        assert re.search(cause, failed[item_id]), (item_id, failed[item_id])
        assert f"failed: {item_id}: " in skipped.output


def test_usage_errors(small_set, tmp_path, cli):
    store = tmp_path / "store"
    both = cli("extract", "-m", small_set, "-s", store, "-f", "dsift", "--fps", "1",
               "--every", "2")
    assert both.exit_code == 1 and "mutually exclusive" in both.output
    bad_sizes = cli("extract", "-m", small_set, "-s", store, "-f", "dsift", "--sizes", "4,x")
    assert bad_sizes.exit_code == 2
    assert "'--sizes': expected comma-separated int values, got '4,x'" in bad_sizes.output
    not_encoded = cli("extract", "-m", small_set, "-s", store, "-f", "dsift", "--per-frame")
    assert not_encoded.exit_code == 2 and "--per-frame applies to --encode only" in \
        not_encoded.output
    no_weights = cli("extract", "-m", small_set, "-s", store, "-f", "vgg16-fc6")
    assert no_weights.exit_code == 1 and "vgg16-397923af.pth" in no_weights.output
    torch = pytest.importorskip("torch")
    torch.save({"features.0.weight": torch.zeros(1)}, tmp_path / "bad.pth")
    bad_weights = cli("extract", "-m", small_set, "-s", store, "-f", "vgg16-fc6", "--weights",
                      tmp_path / "bad.pth")
    assert bad_weights.exit_code == 1
    errors = [line for line in bad_weights.output.splitlines() if line.startswith("error:")]
    assert len(errors) == 1 and "not a torchvision vgg16 checkpoint" in errors[0]
    bad_engine = cli("extract", "-m", small_set, "-s", store, "-f", "dsift", "--engine",
                     "opencv", "--contrast-threshold", "0.01")
    assert bad_engine.exit_code == 1 and "no contrast measure" in bad_engine.output


#: every flag `featpipe extract` has had for its sampling and run settings
SETTINGS_FLAGS = ["--fps", "--every", "--frames", "--device", "--batch-size", "--dtype",
                  "--positions", "--no-positions", "--pca", "--encode", "--sample-descriptors",
                  "--sample-seed", "--human-boxes", "--allow-partial", "--disk-check",
                  "--no-disk-check", "--decoder", "--decode-timeout"]


def test_settings_options_are_generated_from_the_declarations():
    from featpipe.cli.extract import extract
    from featpipe.extract.settings import ExtractSettings
    from featpipe.parameters import record_parameters

    options = {p.name: p for p in extract.params}
    declared = record_parameters(Sampling) + record_parameters(ExtractSettings)
    assert [p.name for p in declared] == [
        "fps", "every", "frames", "device", "batch_size", "dtype", "positions", "pca",
        "encode", "sample_descriptors", "sample_seed", "sample_total", "sample_split",
        "sample_window", "human_boxes", "allow_partial", "disk_check", "decoder",
        "decode_timeout"]  # encode_params: the --encode method's own options
    for param in declared:
        option = options[param.name]
        assert (option.default, option.help) == (param.default, param.help)
    assert options["batch_size"].default == 16 and options["decode_timeout"].default == 600.0
    assert sorted(options["encode"].type.choices) == sorted(ExtractSettings.__dataclass_fields__[
        "encode"].metadata["choices"])
    flags = {flag for option in extract.params for flag in option.opts + option.secondary_opts}
    assert set(SETTINGS_FLAGS) <= flags


def test_settings_give_one_key_from_the_cli_a_pipeline_file_and_python(small_set, tmp_path,
                                                                        cli):
    from featpipe import stages
    from featpipe.extract.settings import ExtractSettings
    from featpipe.manifest import Manifest
    from featpipe.stages import RunOptions
    from tests.stages.test_stage_keys import cli_key, pipeline_key, python_key

    store = Store(tmp_path / "store")
    args = ("extract", "-m", small_set, "-s", store.root, "-f", "dsift", *DSIFT_FAST,
            "--dry-run")
    plain = cli_key(cli, *args)
    key = cli_key(cli, *args, "--dtype", "float16", "--no-positions", "--batch-size", "4")
    assert key != plain  # the stored dtype and the positions are part of the key
    step = {"stage": "extract", "manifest": str(small_set), "features": "dsift",
            "params": {"sizes": [8], "step": 8}, "dtype": "float16", "positions": False,
            "batch_size": 4}
    assert pipeline_key(tmp_path, store, step) == key
    run = stages.extract(store, Manifest.read(small_set), "dsift",
                         params={"sizes": [8], "step": 8},
                         settings=ExtractSettings(dtype="float16", positions=False),
                         options=RunOptions(dry_run=True))
    assert python_key(run) == key


def test_vgg_fc6_items_match_the_library(small_set, tmp_path, cli):
    """Seeded random weights, 64-pixel crops (fc6 keeps its meaning through the 7x7 pool)."""
    torch = pytest.importorskip("torch")
    from featpipe.extract.vgg import VGGPreprocess, load_vgg16, normalise_batch

    store = tmp_path / "store"
    result = cli("extract", "-m", small_set, "-s", store, "-f", "vgg16-fc6", "-n", "fc6",
                 "--weights", "random:3", "--frames", "2", "--resize", "72", "--crop", "64",
                 "--batch-size", "3")
    assert result.exit_code == 0, result.output
    stage = Store(store).resolve("fc6")
    assert stage.params["weights"] == "random:3"
    fc6 = stage.read_item("a")
    assert fc6.shape == (2, 4096) and (fc6 < 0).any()
    np.testing.assert_allclose(stage.extras_of("a")["timestamps"], [0.0, 1.1], atol=1e-6)
    prep = VGGPreprocess(72, 64)
    crops = [prep(f) for _, f in iter_frames(tmp_path / "a.mp4", Sampling(frames=2))]
    crops += [prep(f) for _, f in iter_frames(tmp_path / "img.png")]
    with torch.no_grad():
        expected = load_vgg16("random:3").fc6(normalise_batch(crops)).numpy()
    np.testing.assert_allclose(fc6, expected[:2], rtol=1e-3, atol=1e-4)
    np.testing.assert_allclose(stage.read_item("img"), expected[2:], rtol=1e-3, atol=1e-4)


def test_vgg_conv5_3_items_carry_positions_and_frames(tmp_path):
    """conv5_3 through the extraction pipeline (the network built once, with seeded weights)."""
    torch = pytest.importorskip("torch")
    from featpipe.extract.streaming import CropProgram, Extraction, FrameSinks, Network
    from featpipe.extract.vgg import (
        VGG16Features,
        VGGPreprocess,
        conv5_3_positions,
        load_vgg16,
        normalise_batch,
    )
    from featpipe.io.video import DecodePool
    from featpipe.manifest import Manifest, ManifestItem

    path = write_video(tmp_path / "a.mp4", n_frames=12, size=(96, 80))
    prep = VGGPreprocess(72, 64)
    model = load_vgg16("random:5")
    layer = VGG16Features("conv5_3", "random:5", batch_size=2)
    layer.model_ = model
    stage = Store(tmp_path / "store").stage("extract", {"test": "conv5_3"}, items=Manifest(
        [ManifestItem("a", str(path), ("x",), ("train",))], root=tmp_path))
    with DecodePool(1, program=CropProgram(prep)) as pool:
        extraction = Extraction(stage, pool, Sampling(every=5), FrameSinks(str(stage.path)),
                                network=Network(layer, prep, 2))
        assert list(extraction.run([("a", str(path))])) == [("a", None)]
    array, extras = stage.read_item("a"), stage.extras_of("a")
    assert array.shape == (3 * 16, 512)  # 3 frames of 4x4 cells
    np.testing.assert_allclose(extras["timestamps"], [0.0, 0.5, 1.0], atol=1e-6)
    np.testing.assert_array_equal(extras["frame_index"], np.repeat([0, 1, 2], 16))
    np.testing.assert_allclose(extras["positions"],
                               np.tile(conv5_3_positions(64, prep, (80, 96)), (3, 1)))
    np.testing.assert_array_equal(extras["image_size"], [80, 96])
    crops = [prep(f) for _, f in iter_frames(path, Sampling(every=5))]
    with torch.no_grad():
        maps = model.conv5_3(normalise_batch(crops)).flatten(2).transpose(1, 2)
    np.testing.assert_allclose(array, maps.reshape(-1, 512).numpy(), rtol=1e-4, atol=1e-5)


def test_pca_at_extraction_and_float16(small_set, tmp_path, cli):
    from featpipe.extract.pca import load_pca

    store = tmp_path / "store"
    assert cli("extract", "-m", small_set, "-s", store, "-f", "dsift", "-n", "ds",
               *DSIFT_FAST).exit_code == 0
    fitted = cli("fit", "pca", "-s", store, "-i", "ds", "-n", "p8", "--dim", "8")
    assert fitted.exit_code == 0, fitted.output
    projected = cli("extract", "-m", small_set, "-s", store, "-f", "dsift", "-n", "ds8",
                    "--pca", "p8", "--dtype", "float16", *DSIFT_FAST)
    assert projected.exit_code == 0, projected.output
    s = Store(store)
    raw, small = s.resolve("ds"), s.resolve("ds8")
    assert small.input_names == [s.resolve("p8").name]
    expected = load_pca(s.resolve("p8")).transform(raw.read_item("img"))  # the textured item
    assert np.abs(expected).max() > 0.1
    got = small.read_item("img")
    assert got.dtype == np.float16 and got.shape == expected.shape == (len(expected), 8)
    np.testing.assert_allclose(got, expected, rtol=2e-3, atol=2e-3)
    wrong = cli("extract", "-m", small_set, "-s", store, "-f", "dsift", "--pca", "ds",
                *DSIFT_FAST)
    assert wrong.exit_code == 1 and "not a pca stage" in wrong.output


def test_wrong_container_frame_count_is_corrected(small_set, tmp_path, cli):
    write_video(tmp_path / "b.mp4", n_frames=20, size=(96, 80), fps=10.0)
    manifest = write_manifest(tmp_path, [("b", "b.mp4", "x", "train")])
    result = cli("extract", "-m", manifest, "-s", tmp_path / "store", "-f", "dsift", "-n", "d",
                 "--frames", "4", "--decoder", "tests.unit.test_video:WrongCountDecoder",
                 *DSIFT_FAST)
    assert result.exit_code == 0, result.output
    stage = Store(tmp_path / "store").resolve("d")
    np.testing.assert_allclose(stage.extras_of("b")["timestamps"], [0.0, 0.6, 1.3, 1.9],
                               atol=1e-6)
    assert stage.extras_of("b")["frame_index"].max() == 3


def test_no_extraction_function_takes_more_than_eight_parameters():
    """Issue 26: parameters are grouped in the estimators and the settings records.  Allowed
    beyond 8: an estimator's ``__init__`` (its parameters are its declarations), the stage
    function (store, manifest, features, params, sampling, settings, name, options,
    reporter) and numba kernels (``@numba.njit``: compiled code takes its arrays one by one,
    as a C kernel would)."""
    import ast
    from pathlib import Path

    import featpipe

    root = Path(featpipe.__file__).parent
    files = [root / "stages" / "extraction.py", root / "stages" / "extraction_plan.py",
             root / "stages" / "calibration.py", root / "io" / "video.py",
             root / "cli" / "extract.py", *sorted((root / "extract").glob("*.py"))]
    counts = {}
    for path in files:
        tree = ast.parse(path.read_text(encoding="utf-8"))
        estimators = {node.name for node in ast.walk(tree) if isinstance(node, ast.ClassDef)
                      and any(getattr(b, "id", "") in ("BaseEstimator", "DeclaredEstimator")
                              for b in node.bases)}
        for node in ast.walk(tree):
            body = getattr(node, "body", [])
            for func in body if isinstance(body, list) else []:
                if not isinstance(func, ast.FunctionDef) or (
                        func.name == "__init__" and getattr(node, "name", "") in estimators) \
                        or any("njit" in ast.unparse(d) for d in func.decorator_list):
                    continue
                args = func.args
                names = [a.arg for a in args.posonlyargs + args.args + args.kwonlyargs]
                names += [a.arg for a in (args.vararg, args.kwarg) if a is not None]
                counts[f"{path.name}:{func.name}"] = len([n for n in names
                                                          if n not in ("self", "cls")])
    assert counts["extraction.py:extract"] == 9
    assert counts["dsift.py:dsift"] <= 8  # a function of the module (it is counted)
    assert {k: n for k, n in counts.items() if n > 8} == {"extraction.py:extract": 9}
