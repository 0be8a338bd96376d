"""VGG-16: torchvision's state-dict layout, layer semantics, preprocessing, weight loading."""

from __future__ import annotations

import numpy as np
import pytest

torch = pytest.importorskip("torch")

from featpipe.errors import FeatpipeError  # noqa: E402
from featpipe.extract.vgg import (  # noqa: E402
    VGG16,
    VGG16Features,
    build_vgg16,
    conv5_3_positions,
    load_vgg16,
    normalise_batch,
)

#: torchvision.models.vgg16().state_dict(): names and shapes, in order (written out by hand)
TORCHVISION_VGG16 = [
    ("features.0.weight", (64, 3, 3, 3)), ("features.0.bias", (64,)),
    ("features.2.weight", (64, 64, 3, 3)), ("features.2.bias", (64,)),
    ("features.5.weight", (128, 64, 3, 3)), ("features.5.bias", (128,)),
    ("features.7.weight", (128, 128, 3, 3)), ("features.7.bias", (128,)),
    ("features.10.weight", (256, 128, 3, 3)), ("features.10.bias", (256,)),
    ("features.12.weight", (256, 256, 3, 3)), ("features.12.bias", (256,)),
    ("features.14.weight", (256, 256, 3, 3)), ("features.14.bias", (256,)),
    ("features.17.weight", (512, 256, 3, 3)), ("features.17.bias", (512,)),
    ("features.19.weight", (512, 512, 3, 3)), ("features.19.bias", (512,)),
    ("features.21.weight", (512, 512, 3, 3)), ("features.21.bias", (512,)),
    ("features.24.weight", (512, 512, 3, 3)), ("features.24.bias", (512,)),
    ("features.26.weight", (512, 512, 3, 3)), ("features.26.bias", (512,)),
    ("features.28.weight", (512, 512, 3, 3)), ("features.28.bias", (512,)),
    ("classifier.0.weight", (4096, 25088)), ("classifier.0.bias", (4096,)),
    ("classifier.3.weight", (4096, 4096)), ("classifier.3.bias", (4096,)),
    ("classifier.6.weight", (1000, 4096)), ("classifier.6.bias", (1000,)),
]


@pytest.fixture(scope="module")
def model():
    return load_vgg16("random:0")


@pytest.fixture(scope="module")
def crops():
    """Two small crops from a real photograph (64x64: the layers' semantics hold at any size
    that survives five 2x2 poolings; fc6 uses torchvision's adaptive 7x7 average pool)."""
    from sklearn.datasets import load_sample_images

    image = load_sample_images().images[0]
    return [image[100:164, 200:264], image[250:314, 400:464]]


def test_state_dict_layout_equals_torchvision():
    state = build_vgg16().state_dict()
    assert [(k, tuple(v.shape)) for k, v in state.items()] == TORCHVISION_VGG16


def test_fc6_is_pre_relu_and_consistent_with_conv5_3(model, crops):
    batch = normalise_batch(crops)
    with torch.no_grad():
        fc6 = model.fc6(batch)
        conv = model.conv5_3(batch)
        # independent route: max-pool conv5_3 (pool5), adaptive 7x7 average, flatten, fc6 affine
        pooled = torch.nn.functional.adaptive_avg_pool2d(
            torch.nn.functional.max_pool2d(conv, 2), (7, 7)).flatten(1)
        expected = pooled @ model.classifier[0].weight.T + model.classifier[0].bias
    assert fc6.shape == (2, 4096)
    assert (fc6 < 0).any() and (fc6 > 0).any()  # before the ReLU: negatives kept
    torch.testing.assert_close(fc6, expected, rtol=1e-4, atol=1e-5)
    assert conv.shape == (2, 512, 4, 4) and (conv >= 0).all()  # after the ReLU
    assert (conv == 0).any()


def test_batch_equals_frame_by_frame(model, crops):
    extractor = VGG16Features("fc6", "random:0", batch_size=2)
    extractor.model_ = model
    together = extractor.transform(crops)
    extractor.batch_size = 1
    apart = extractor.transform(crops)
    np.testing.assert_allclose(together, apart, rtol=1e-4, atol=1e-5)
    local = VGG16Features("conv5_3", "random:0", batch_size=2)
    local.model_ = model
    out = local.transform(crops)
    assert out.shape == (2, 16, 512)  # (frames, H*W cells, channels)
    with torch.no_grad():
        direct = model.conv5_3(normalise_batch(crops[:1]))[0]
    # cell 5 of the 4x4 map is row 1, column 1
    np.testing.assert_allclose(out[0, 5], direct[:, 1, 1].numpy(), rtol=1e-4, atol=1e-6)


def test_batches_are_channels_last_and_give_the_contiguous_batchs_features(model, crops):
    """The network gets channels-last batches (the fast path on the CPU); fc6 and conv5_3
    equal those of the same batch in contiguous (NCHW) memory to 1e-5 relative."""
    batch = normalise_batch(crops)
    assert batch.is_contiguous(memory_format=torch.channels_last)
    assert not batch.is_contiguous()
    plain = batch.contiguous()
    with torch.inference_mode():
        for layer in (model.fc6, model.conv5_3):
            fast, expected = layer(batch), layer(plain)
            torch.testing.assert_close(fast, expected, rtol=1e-5,
                                       atol=1e-5 * float(expected.abs().max()))


def test_preprocessing_matches_torchvision_recipe():
    from PIL import Image

    rng = np.random.default_rng(0)
    frame = (rng.random((240, 320, 3)) * 255).astype(np.uint8)
    frame = np.asarray(Image.fromarray(frame).resize((80, 60)).resize((320, 240)))  # smooth
    prep = VGG16().preprocess()
    assert prep.geometry(240, 320) == (256, 341, 256 / 240, 16, 58)
    crop = prep(frame)
    assert crop.shape == (224, 224, 3) and crop.dtype == np.uint8
    # torchvision's PIL path: Resize(256) bilinear (antialiased), CenterCrop(224)
    reference = np.asarray(Image.fromarray(frame).resize((341, 256), Image.BILINEAR))
    reference = reference[16:240, 58:282]
    assert np.abs(crop.astype(int) - reference.astype(int)).mean() < 1.0
    batch = normalise_batch([np.full((4, 4, 3), 255, np.uint8)])
    np.testing.assert_allclose(batch[0, :, 0, 0].numpy(),
                               [(1 - 0.485) / 0.229, (1 - 0.456) / 0.224, (1 - 0.406) / 0.225],
                               rtol=1e-6)


def test_positions_map_cells_to_frame_pixels():
    pos = conv5_3_positions(224, VGG16().preprocess(), (240, 320))
    assert pos.shape == (196, 3)
    # cell (0, 0): centre 7.5 in the crop -> (7.5 + 58) / (256/240) in the frame
    np.testing.assert_allclose(pos[0], [(7.5 + 58) * 240 / 256, (7.5 + 16) * 240 / 256,
                                        16 * 240 / 256], rtol=1e-6)
    np.testing.assert_allclose(pos[1, 0] - pos[0, 0], 15.0, rtol=1e-6)


def test_weights_file_round_trip_and_errors(tmp_path, model, crops):
    path = tmp_path / "vgg16.pth"
    torch.save(model.state_dict(), path)
    loaded = load_vgg16(str(path))
    batch = normalise_batch(crops[:1])
    with torch.no_grad():
        torch.testing.assert_close(loaded.fc6(batch), model.fc6(batch))
    bad = {k: v for k, v in model.state_dict().items() if not k.startswith("classifier.6")}
    torch.save(bad, tmp_path / "bad.pth")
    with pytest.raises(FeatpipeError, match=r"not a torchvision vgg16 checkpoint: missing "
                                            r"\['classifier.6.bias'"):
        load_vgg16(str(tmp_path / "bad.pth"))
    with pytest.raises(FeatpipeError, match="vgg16-397923af.pth"):
        load_vgg16(None)
    with pytest.raises(FeatpipeError, match="no such file"):
        load_vgg16(str(tmp_path / "absent.pth"))
    (tmp_path / "junk.pth").write_bytes(b"junk")
    with pytest.raises(FeatpipeError, match="cannot load it as a torch checkpoint"):
        load_vgg16(str(tmp_path / "junk.pth"))
