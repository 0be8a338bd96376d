"""VGG-16 (Simonyan & Zisserman, ICLR'15, configuration D) for fc6 and conv5_3 features.

featpipe defines the network itself, with exactly torchvision's ``vgg16`` state-dict layout
(``features.{0,2,5,7,10,12,14,17,19,21,24,26,28}.weight/bias`` for the 13 convolutions,
``classifier.{0,3,6}`` for fc6, fc7, fc8), so torchvision's ImageNet checkpoint
``vgg16-397923af.pth`` loads unchanged with ``torch.load(weights_only=True)``.

Preprocessing (torchvision's ``IMAGENET1K_V1`` transforms for these weights), owned by the
feature method :class:`VGG16` (``resize`` and ``crop``, declared there once): resize the
shorter side to ``resize`` (bilinear, antialiased, longer side ``int(resize·long/short)``),
centre-crop ``crop``×``crop`` (top-left at ``round((h − crop)/2)``), scale to [0, 1], subtract
the ImageNet mean (0.485, 0.456, 0.406) and divide by the std (0.229, 0.224, 0.225).

Layers:

* ``fc6``: the output of ``classifier.0`` *before* its ReLU (4096 values, negatives kept), on
  the 7×7 adaptive-average-pooled conv5 map (torchvision's ``avgpool``), flattened C·H·W;
* ``conv5_3``: the output of ``features.28`` *after* its ReLU (``features.29``), 512 × 14 × 14
  for the default crop, returned as (H·W, 512) local features with the centre of each cell.
"""

from __future__ import annotations

from dataclasses import dataclass
from numbers import Integral

import numpy as np

from featpipe.errors import FeatpipeError, InputError, ParameterError
from featpipe.extract import weights as weights_module
from featpipe.extract.features import FeatureMethod
from featpipe.parameters import DeclaredEstimator, DeclaredInterval, DeclaredOptions

LAYERS = ("fc6", "conv5_3")
#: channels per conv layer; "M" is a 2x2 max-pool (torchvision's cfg "D")
CONFIG_D = (64, 64, "M", 128, 128, "M", 256, 256, 256, "M", 512, 512, 512, "M",
            512, 512, 512, "M")
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)
CONV5_3_STRIDE = 16
#: index in ``features`` just after the ReLU of conv5_3 (features.28 is conv5_3)
CONV5_3_END = 30
WEIGHTS_HELP = (
    "VGG-16 needs ImageNet weights: pass --weights PATH to torchvision's checkpoint "
    "vgg16-397923af.pth (download https://download.pytorch.org/models/vgg16-397923af.pth, "
    "or find it in ~/.cache/torch/hub/checkpoints/ after torchvision.models.vgg16("
    "weights='IMAGENET1K_V1') on a machine with torchvision); --weights random:SEED builds "
    "seeded random weights for tests and demos only"
)


def build_vgg16(device: str = "cpu"):
    """featpipe's VGG-16 as a torch module with torchvision's parameter names.

    The parameters are allocated but not initialised: load a checkpoint or call
    :func:`random_init_`; on the ``meta`` device nothing is allocated (names and shapes).
    """
    import torch
    from torch import nn

    class VGG16(nn.Module):
        def __init__(self):
            super().__init__()
            layers: list[nn.Module] = []
            channels = 3
            for value in CONFIG_D:
                if value == "M":
                    layers.append(nn.MaxPool2d(kernel_size=2, stride=2))
                else:
                    layers += [nn.Conv2d(channels, value, kernel_size=3, padding=1),
                               nn.ReLU(inplace=True)]
                    channels = value
            self.features = nn.Sequential(*layers)
            self.avgpool = nn.AdaptiveAvgPool2d((7, 7))
            self.classifier = nn.Sequential(
                nn.Linear(512 * 7 * 7, 4096), nn.ReLU(inplace=True), nn.Dropout(),
                nn.Linear(4096, 4096), nn.ReLU(inplace=True), nn.Dropout(),
                nn.Linear(4096, 1000),
            )

        def conv5_3(self, x):
            """conv5_3 after ReLU: (N, 512, H/16, W/16)."""
            return self.features[:CONV5_3_END](x)

        def fc6(self, x):
            """fc6 before ReLU: (N, 4096)."""
            pooled = self.avgpool(self.features(x))
            return self.classifier[0](torch.flatten(pooled, 1))

        def forward(self, x):  # the classifier, for completeness (logits)
            pooled = self.avgpool(self.features(x))
            return self.classifier(torch.flatten(pooled, 1))

    with torch.device("meta"):  # no memory and no default initialisation: weights come next
        model = VGG16()
    return model if device == "meta" else model.to_empty(device=device)


def random_init_(model, seed: int) -> None:
    """Seeded random weights with torchvision's initialisation (kaiming-normal convs, N(0, 0.01)
    linear layers, zero biases)."""
    import torch
    from torch import nn

    generator = torch.Generator().manual_seed(int(seed))
    with torch.no_grad():
        for module in model.modules():
            if isinstance(module, nn.Conv2d):
                fan_out = module.out_channels * module.kernel_size[0] * module.kernel_size[1]
                std = (2.0 / fan_out) ** 0.5
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * std)
                module.bias.zero_()
            elif isinstance(module, nn.Linear):
                module.weight.copy_(torch.randn(module.weight.shape, generator=generator) * 0.01)
                module.bias.zero_()


def weights_identity(weights: str | None) -> str:
    """What identifies VGG-16's weights in a stage key (:func:`featpipe.extract.weights.
    weights_identity`): ``random:SEED`` or the sha256 of a file checked to hold every
    tensor of VGG-16, of its shape (:func:`check_weights`)."""
    return weights_module.weights_identity(weights, WEIGHTS_HELP,
                                           lambda state: check_weights(weights, state),
                                           "vgg16")


def check_weights(weights: str, state: dict) -> None:
    """A one-line error unless ``state`` has exactly VGG-16's names and shapes."""
    weights_module.check_state_dict(weights, state, build_vgg16("meta").state_dict(),
                                    "a torchvision vgg16")


def load_vgg16(weights: str | None, device: str = "cpu"):
    """VGG-16 in eval mode on ``device`` with weights from a torchvision checkpoint file or
    ``random:SEED``; a missing file or a key/shape mismatch is a one-line error.  The file is
    checked and read once (:func:`weights_identity`, then
    :func:`featpipe.extract.weights.read_checkpoint` takes the state it checked), and
    ``model.weights_identity`` is the identity of exactly the bytes loaded (a stage checks it
    against its key)."""
    identity = weights_identity(weights)
    model = build_vgg16()
    if identity.startswith("random:"):
        random_init_(model, int(identity.split(":")[1]))
    else:
        state, identity = weights_module.read_checkpoint(weights, WEIGHTS_HELP)
        check_weights(weights, state)
        model.load_state_dict(state)
    model.eval()
    model.weights_identity = identity
    return model.to(device)


@dataclass(frozen=True)
class VGGPreprocess:
    """Frame transform (runs in the decode worker): RGB uint8 frame -> (crop, crop, 3) uint8.

    Resize the shorter side to ``resize`` (antialiased bilinear, as PIL in torchvision) and take
    the central ``crop`` square.  Also returns the crop's geometry in frame pixels.
    """

    resize: int
    crop: int

    @property
    def shape(self) -> tuple[int, int]:
        """(height, width) of a crop."""
        return self.crop, self.crop

    def positions(self, frame_shape: tuple[int, int]) -> np.ndarray:
        """The conv5_3 cells' ``x, y, scale`` in the pixels of a frame of that size."""
        return conv5_3_positions(self.crop, self, frame_shape)

    def geometry(self, height: int, width: int) -> tuple[int, int, float, int, int]:
        """(new_h, new_w, scale, top, left) for a frame of that size."""
        short, long = (height, width) if height <= width else (width, height)
        new_long = int(self.resize * long / short)
        new_h, new_w = (self.resize, new_long) if height <= width else (new_long, self.resize)
        top = int(round((new_h - self.crop) / 2.0))
        left = int(round((new_w - self.crop) / 2.0))
        return new_h, new_w, self.resize / short, top, left

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        import torch
        import torch.nn.functional as F

        height, width = frame.shape[:2]
        new_h, new_w, _, top, left = self.geometry(height, width)
        if min(new_h, new_w) < self.crop:
            raise ValueError(f"resize {self.resize} is smaller than the crop {self.crop}")
        # torch's uint8 antialiased bilinear path (torchvision v2's): PIL's recipe, rounded
        # once; 0.7-0.9 ms against 5.9-10.3 ms for the float32 path and rounding after
        # (1280 x 720 resized to the default, one thread; benchmarks/results/extraction.md)
        tensor = torch.from_numpy(np.array(frame, dtype=np.uint8)).permute(2, 0, 1)[None]
        resized = F.interpolate(tensor, size=(new_h, new_w), mode="bilinear",
                                align_corners=False, antialias=True)
        cropped = resized[0, :, top:top + self.crop, left:left + self.crop]
        return np.ascontiguousarray(cropped.permute(1, 2, 0).numpy())


def normalise_batch(frames, device: str = "cpu"):
    """(N, H, W, 3) uint8 crops -> (N, 3, H, W) float32 tensor, ImageNet mean/std."""
    import torch

    return normalise_crops(torch.from_numpy(np.ascontiguousarray(np.stack(frames))), device)


def normalise_crops(crops, device: str = "cpu"):
    """A (N, H, W, 3) uint8 host tensor (pinned: copied asynchronously) -> (N, 3, H, W)
    float32 on ``device``, ImageNet mean/std, in channels-last memory (the crops' own
    layout, kept: the convolutions then run oneDNN's channels-last kernels without
    reordering every layer's input and output, 1.2x the contiguous batch's speed on one
    core; the same values to float32 rounding; benchmarks/RESULTS.md, issue 50)."""
    import torch

    batch = crops.to(device, non_blocking=True).permute(0, 3, 1, 2).float().div_(255.0)
    mean = torch.tensor(IMAGENET_MEAN, device=device).view(1, 3, 1, 1)
    std = torch.tensor(IMAGENET_STD, device=device).view(1, 3, 1, 1)
    return ((batch - mean) / std).contiguous(memory_format=torch.channels_last)


def conv5_3_positions(crop: int, preprocess: VGGPreprocess | None = None,
                      frame_shape: tuple[int, int] | None = None) -> np.ndarray:
    """(H·W, 3) ``x, y, scale`` of the conv5_3 cells, row-major: centres 16·j + 7.5 in the crop,
    mapped to frame pixels when the preprocessing and the frame size are given."""
    cells = crop // CONV5_3_STRIDE
    ys, xs = np.meshgrid(np.arange(cells), np.arange(cells), indexing="ij")
    x = CONV5_3_STRIDE * xs.ravel() + (CONV5_3_STRIDE - 1) / 2.0
    y = CONV5_3_STRIDE * ys.ravel() + (CONV5_3_STRIDE - 1) / 2.0
    scale = np.full(x.shape, float(CONV5_3_STRIDE))
    if preprocess is not None and frame_shape is not None:
        _, _, factor, top, left = preprocess.geometry(*frame_shape)
        x, y, scale = (x + left) / factor, (y + top) / factor, scale / factor
    return np.stack([x, y, scale], axis=1).astype(np.float32)


class VGG16Features:
    """Batched VGG-16 features of preprocessed crops, scikit-learn style.

    Parameters
    ----------
    layer : ``'fc6'`` or ``'conv5_3'``.
    weights : path to torchvision's ``vgg16-397923af.pth``, or ``random:SEED``.
    device : ``'cpu'`` or ``'cuda'`` (fp16 autocast on CUDA).
    batch_size : frames per forward pass.
    """

    def __init__(self, layer="fc6", weights=None, device="cpu", batch_size=16):
        self.layer = layer
        self.weights = weights
        self.device = device
        self.batch_size = batch_size

    def fit(self, X=None, y=None):
        """Load the network (validation happens here)."""
        import torch

        if self.layer not in LAYERS:
            raise InputError(f"VGG-16 layer must be one of {LAYERS}, got {self.layer!r}")
        if self.device not in ("cpu", "cuda"):
            raise InputError(f"--device must be cpu or cuda, got {self.device!r}")
        if self.device == "cuda" and not torch.cuda.is_available():
            raise FeatpipeError("--device cuda: torch sees no CUDA device; use --device cpu")
        if int(self.batch_size) < 1:
            raise InputError(f"--batch-size must be >= 1, got {self.batch_size}")
        self.model_ = load_vgg16(self.weights, self.device)
        return self

    def transform(self, crops) -> np.ndarray:
        """(N, H, W, 3) uint8 crops -> (N, 4096) fc6 or (N, H/16·W/16, 512) conv5_3, float32."""
        if not hasattr(self, "model_"):
            self.fit()
        crops = list(crops)
        outputs = []
        for start in range(0, len(crops), int(self.batch_size)):
            outputs.append(self.forward(normalise_batch(crops[start:start + int(
                self.batch_size)], self.device)))
        if not outputs:
            shape = (0, 4096) if self.layer == "fc6" else (0, 0, 512)
            return np.zeros(shape, np.float32)
        return np.concatenate(outputs)

    @property
    def weights_identity(self) -> str:
        """The identity of the weights loaded (:func:`weights_identity`)."""
        return self.model_.weights_identity

    def forward_crops(self, crops) -> np.ndarray:
        """A (N, H, W, 3) uint8 host tensor of crops through the network (the pipeline's
        model interface)."""
        return self.forward(normalise_crops(crops, self.device))

    def forward(self, batch) -> np.ndarray:
        """One normalised (N, 3, H, W) tensor through the network, to numpy float32."""
        import torch

        with torch.inference_mode():
            if self.device == "cuda":
                with torch.autocast("cuda", dtype=torch.float16):
                    out = self._layer(batch)
            else:
                out = self._layer(batch)
            if self.layer == "conv5_3":
                out = out.flatten(2).transpose(1, 2)  # (N, H*W, 512), cells row-major
            return out.float().cpu().numpy()

    def _layer(self, batch):
        return self.model_.fc6(batch) if self.layer == "fc6" else self.model_.conv5_3(batch)


class VGG16(DeclaredEstimator):
    """The VGG-16 feature method: one layer's output for each frame, with the preprocessing
    of torchvision's weights (:class:`VGGPreprocess`, in the decoding workers) and the
    network (:class:`VGG16Features`, in the parent).

    Parameters
    ----------
    weights : str
        torchvision's vgg16-397923af.pth, or random:SEED (tests, demos).
    resize : int
        Shorter side of the frame before the centre crop (the default is torchvision's).
    crop : int
        Side of the centre crop (the default is torchvision's; conv5_3 gives crop/16 cells a
        side).
    layer : {"fc6", "conv5_3"}
        The layer whose output is the feature (fixed by the feature method's name).
    """

    _parameter_constraints = {
        "weights": [str, None],
        "resize": [DeclaredInterval(Integral, 32, None, closed="left")],
        "crop": [DeclaredInterval(Integral, 32, None, closed="left")],
        "layer": [DeclaredOptions(set(LAYERS))],
    }

    def __init__(self, weights=None, resize=256, crop=224, layer="fc6"):
        self.weights = weights
        self.resize = resize
        self.crop = crop
        self.layer = layer

    @classmethod
    def _check_param_rules(cls, params):
        weights_module.check_seed(params)
        if "crop" in params and "resize" in params and params["resize"] < params["crop"]:
            raise ParameterError("crop", f"must be at most resize, got crop {params['crop']}, "
                                 f"resize {params['resize']}")

    @property
    def n_features(self) -> int:
        return 4096 if self.layer == "fc6" else 512

    def count(self, height: int, width: int) -> int:
        """Rows per frame: one fc6 vector, or (crop/16)² conv5_3 cells."""
        return 1 if self.layer == "fc6" else (int(self.crop) // CONV5_3_STRIDE) ** 2

    def preprocess(self) -> VGGPreprocess:
        return VGGPreprocess(int(self.resize), int(self.crop))

    def weights_identity(self) -> str:
        return weights_identity(self.weights)

    def stage_params(self) -> dict:
        """What the stage key holds besides the weights and the precision."""
        return {"resize": self.resize, "crop": self.crop}

    def network(self, device: str = "cpu", batch_size: int = 16) -> VGG16Features:
        """The network, loaded (``device``, frames per forward pass)."""
        return VGG16Features(self.layer, self.weights, device, batch_size).fit()


FEATURE_METHODS = [
    FeatureMethod("vgg16-fc6", "VGG-16 fc6: one 4096-value vector per frame", VGG16,
                  "VGG-16 fc6", local=False, runs="model", fixed=(("layer", "fc6"),)),
    FeatureMethod("vgg16-conv5_3", "VGG-16 conv5_3: (crop/16)² local features of 512 values "
                  "per frame", VGG16, "VGG-16 conv5_3", runs="model",
                  fixed=(("layer", "conv5_3"),)),
]
