"""``featpipe extract --features torchvision``: a node of any torchvision network as a feature.

``--arch NAME`` is an image classification model of ``torchvision.models`` (resnet50,
efficientnet_b0, vit_b_16, vgg16, ...: ``torchvision.models.list_models(module=
torchvision.models)``) or a video model of ``torchvision.models.video`` (r3d_18, mc3_18,
r2plus1d_18, s3d, mvit_v1_b, mvit_v2_s, swin3d_t/s/b); ``--layer NODE`` any node that
``torchvision.models.feature_extraction.get_graph_node_names`` lists for the model in eval
mode, or a module's name for its last node (``layer4`` is resnet50's ``layer4.2.relu_2``, as
``create_feature_extractor`` reads it; the key holds the node); a wrong name is refused
with the closest ones.  The node's output is computed by ``create_feature_extractor(model,
{NODE: "out"})``.

The network is what ``torchvision.models.get_model(NAME, weights=ENTRY)`` builds for the
entry ``--transforms ENTRY`` of the model's weights enum (default: ``DEFAULT``), so each
model is configured as torchvision configures it for those weights (ViT's image size,
Inception's input transform...), but nothing is downloaded: the builder's state dict is the
checkpoint file of ``--weights PATH`` (``torch.load(weights_only=True)``; a missing file's
message names the file torchvision keeps for that entry and where), or, with
``--weights random:SEED``, the builder's own initialisation after ``torch.manual_seed(SEED)``
(tests and demos).

Preprocessing is the entry's ``transforms()`` (torchvision's ``ImageClassification`` or
``VideoClassification`` preset), split where featpipe's pipeline splits work
(:class:`ClassificationTransform`): the decoding workers resize and centre-crop each frame
with torchvision's own functions on its uint8 tensor (``resize(size, interpolation,
antialias)``, ``center_crop``); the parent converts to float in [0, 1] and normalises by the
entry's mean and std on the model's device (``convert_image_dtype``, ``normalize``).  These
are the preset's operations in its order, so a frame gets exactly what ``weights.transforms()
(frame)`` gives.

What a frame (or clip) gives:

* by default one vector: the node's output reduced over every axis after the channels
  (``--reduce avg``, torchvision's channels-first maps; ``max``; ``flatten`` keeps all
  values, C·H·W); an output with a single position is taken as it is;
* ``--spatial``: a (C, H, W) map kept as H·W local features of C values (for the
  local-feature encoders: fisher, bilinear, cov, gmsop), each at the centre of its cell's
  share of the crop, mapped to frame pixels (``positions``: x, y, scale = the cell's side);
* video models: one vector per clip of ``--clip T`` consecutive sampled frames, a clip every
  ``--clip-stride S`` sampled frames (default S = T), clips starting at 0, S, 2S, ... while
  they fit; a video with fewer than T sampled frames gives one clip, its last frame repeated
  (with a warning naming the item).  A clip's timestamp is its first frame's.  The item is a
  (clips, D) sequence for the temporal encoders.

The stage key holds the model name, the node, the transforms' entry and parameters (resize,
crop, mean, std, interpolation, antialias), ``spatial``/``reduce``, ``clip``/``clip_stride``,
the weights by content (or ``random:SEED``) and the precision (``--device cuda`` runs under
fp16 autocast, as VGG-16 does).

:class:`FrameNetwork` (normalise, forward, reduce) is the pipeline's model interface for any
torch module; a plugin network that torchvision lacks uses it too (docs/python-api.md).  On
the CPU the node runs as a frozen TorchScript graph where one can be made (batch norms
folded, oneDNN convolutions: :func:`featpipe.extract.cpu_inference.frozen`), whose outputs
equal the module's to float32 rounding.
"""

from __future__ import annotations

import contextlib
import difflib
import functools
import re
import threading
import warnings
from dataclasses import dataclass
from numbers import Integral

import numpy as np

from featpipe.errors import FeatpipeError, ParameterError
from featpipe.extract import weights as weights_module
from featpipe.extract.features import FeatureMethod
from featpipe.parameters import DeclaredEstimator, DeclaredInterval, DeclaredOptions

REDUCTIONS = ("avg", "max", "flatten")
INSTALL_HINT = ("--features torchvision needs torchvision beside a matching torch: "
                "pip install torch==2.14.1 torchvision==0.29.1 (x86_64; aarch64: torch==2.9.1 "
                "torchvision==0.24.1), as bin/test does (README, set-up)")
#: one builder at a time: building swaps torchvision's state-dict loading for ours
_BUILD_LOCK = threading.Lock()


# -- preprocessing ----------------------------------------------------------------------------

@dataclass(frozen=True)
class ClassificationTransform:
    """torchvision's ``ImageClassification`` / ``VideoClassification`` preset, split in two:
    :meth:`__call__` (decoding worker: an RGB uint8 frame -> its uint8 crop) and
    :meth:`normalise` (parent, on the model's device: uint8 crops -> normalised float).

    ``resize`` is ``[S]`` (shorter side to S, the longer ``int(S·long/short)``) or ``[H, W]``;
    ``crop`` (height, width) is taken at the centre (top ``round((h − H)/2)``); ``cells``
    (height, width) is the size of a spatial map, for :meth:`positions`."""

    resize: tuple[int, ...]
    crop: tuple[int, int]
    mean: tuple[float, ...]
    std: tuple[float, ...]
    interpolation: str = "bilinear"
    antialias: bool = True
    video: bool = False
    cells: tuple[int, int] | None = None

    @classmethod
    def of(cls, preset, cells: tuple[int, int] | None = None) -> ClassificationTransform:
        """The parameters of a weights entry's ``transforms()``."""
        from torchvision.transforms._presets import ImageClassification, VideoClassification

        if not isinstance(preset, ImageClassification | VideoClassification):
            raise FeatpipeError(f"torchvision's transforms {type(preset).__name__} are not a "
                                "classification preset")
        video = isinstance(preset, VideoClassification)
        crop = [int(v) for v in preset.crop_size]
        return cls(tuple(int(v) for v in preset.resize_size),
                   (crop[0], crop[-1]), tuple(float(v) for v in preset.mean),
                   tuple(float(v) for v in preset.std), preset.interpolation.value,
                   False if video else bool(preset.antialias), video, cells)

    def params(self) -> dict:
        """The preprocessing as stage parameters."""
        return {"resize": list(self.resize), "crop": list(self.crop), "mean": list(self.mean),
                "std": list(self.std), "interpolation": self.interpolation,
                "antialias": self.antialias}

    @property
    def shape(self) -> tuple[int, int]:
        """(height, width) of a crop."""
        return self.crop

    def __call__(self, frame: np.ndarray) -> np.ndarray:
        import torch
        from torchvision.transforms import InterpolationMode
        from torchvision.transforms import functional as F

        tensor = torch.from_numpy(np.ascontiguousarray(frame, dtype=np.uint8)).permute(2, 0, 1)
        resized = F.resize(tensor, list(self.resize),
                           interpolation=InterpolationMode(self.interpolation),
                           antialias=self.antialias)
        cropped = F.center_crop(resized, list(self.crop))
        return np.ascontiguousarray(cropped.permute(1, 2, 0).numpy())

    def scale_and_normalise(self, crops):
        """(N, H, W, 3) uint8 crops -> (N, 3, H, W) float32, or (N, T, H, W, 3) clips ->
        (N, 3, T, H, W): ``convert_image_dtype`` then ``normalize``, on the crops' device."""
        import torch
        from torchvision.transforms import functional as F

        batch = F.convert_image_dtype(crops.movedim(-1, -3), torch.float)
        batch = F.normalize(batch, mean=list(self.mean), std=list(self.std))
        if self.video:  # (N, T, C, H, W) -> (N, C, T, H, W), as VideoClassification
            batch = batch.permute(0, 2, 1, 3, 4)
        return batch.contiguous()

    def geometry(self, height: int, width: int) -> tuple[int, int, float, float, int, int]:
        """(new_h, new_w, y scale, x scale, top, left) for a frame of that size."""
        if len(self.resize) == 1:
            short, long = (height, width) if height <= width else (width, height)
            new_long = int(self.resize[0] * long / short)
            new_h, new_w = (self.resize[0], new_long) if height <= width else \
                (new_long, self.resize[0])
        else:
            new_h, new_w = self.resize
        top = int(round((new_h - self.crop[0]) / 2.0))
        left = int(round((new_w - self.crop[1]) / 2.0))
        return new_h, new_w, new_h / height, new_w / width, top, left

    def positions(self, frame_shape: tuple[int, int]) -> np.ndarray:
        """(H·W, 3) ``x, y, scale`` of the map's cells, row-major, in frame pixels: the
        centre of each cell's share of the crop, the scale its side."""
        rows, cols = self.cells
        step_y, step_x = self.crop[0] / rows, self.crop[1] / cols
        ys, xs = np.meshgrid(np.arange(rows), np.arange(cols), indexing="ij")
        _, _, scale_y, scale_x, top, left = self.geometry(*frame_shape)
        x = ((xs.ravel() + 0.5) * step_x + left) / scale_x
        y = ((ys.ravel() + 0.5) * step_y + top) / scale_y
        scale = np.full(x.shape, np.sqrt(step_x * step_y / (scale_x * scale_y)))
        return np.stack([x, y, scale], axis=1).astype(np.float32)


# -- the network in the parent ----------------------------------------------------------------

def shape_output(out, spatial: bool, reduce: str | None):
    """A node's (N, C, ...) output as features: (N, H·W, C) local features (``spatial``), or
    (N, D): as it is when 2-D, else the mean (``avg``) or maximum (``max``) over every axis
    after the channels, or all values (``flatten``, or ``None``: a map of one position)."""
    if spatial:
        return out.flatten(2).transpose(1, 2)
    if out.ndim == 2 or reduce in (None, "flatten"):
        return out.flatten(1)
    return out.flatten(2).mean(2) if reduce == "avg" else out.flatten(2).amax(2)


class FrameNetwork:
    """A torch module as the extraction pipeline's model: ``forward_crops`` takes a batch of
    uint8 crops (or clips) on the host, normalises them on ``device`` (``transform``,
    a :class:`ClassificationTransform`), runs ``module`` (fp16 autocast on CUDA) and returns
    :func:`shape_output` of its output as float32 numpy.  ``weights_identity`` says which
    weights ``module`` holds (a stage checks it against its key)."""

    def __init__(self, module, transform: ClassificationTransform, device: str,
                 weights_identity: str, spatial: bool = False, reduce: str | None = "avg"):
        self.module = module
        self.transform = transform
        self.device = device
        self.weights_identity = weights_identity
        self.spatial = spatial
        self.reduce = reduce

    def forward_crops(self, crops) -> np.ndarray:
        import torch

        with torch.inference_mode():
            batch = self.transform.scale_and_normalise(crops.to(self.device, non_blocking=True))
            if self.device == "cuda":
                with torch.autocast("cuda", dtype=torch.float16):
                    out = self.module(batch)
            else:
                out = self.module(batch)
            return shape_output(out.float(), self.spatial, self.reduce).cpu().numpy()


# -- torchvision's models ---------------------------------------------------------------------

def _torchvision():
    try:
        import torchvision
    except Exception as err:  # missing, or built for another torch ("torchvision::nms")
        raise FeatpipeError(f"{INSTALL_HINT} ({type(err).__name__}: "
                            f"{str(err).splitlines()[0][:120]})") from None
    return torchvision


@functools.lru_cache(maxsize=1)
def model_names() -> tuple[tuple[str, ...], tuple[str, ...]]:
    """(image classification models, video models) of torchvision, by name."""
    torchvision = _torchvision()
    from torchvision.models import list_models, video

    return (tuple(list_models(module=torchvision.models)), tuple(list_models(module=video)))


class _OwnInitialisation(dict):
    """The state dict of random weights: the model keeps what its builder initialised."""


@contextlib.contextmanager
def _builder_state(state: dict, check=None):
    """While torchvision's builder runs with ``weights=ENTRY``, ``ENTRY.get_state_dict()``
    gives ``state`` (nothing is downloaded), and a :class:`_OwnInitialisation` state is not
    loaded at all; ``check(state_dict, module)`` sees what the builder loads (after its own
    renames of old checkpoints' keys) before it is loaded."""
    from torch import nn
    from torchvision.models import WeightsEnum

    get_state_dict, load_state_dict = WeightsEnum.get_state_dict, nn.Module.load_state_dict

    def load(module, state_dict, *args, **kwargs):
        if isinstance(state_dict, _OwnInitialisation):
            return None
        if check is not None:
            check(state_dict, module)
        return load_state_dict(module, state_dict, *args, **kwargs)

    with _BUILD_LOCK:
        WeightsEnum.get_state_dict = lambda self, *args, **kwargs: state
        nn.Module.load_state_dict = load
        try:
            yield
        finally:
            WeightsEnum.get_state_dict = get_state_dict
            nn.Module.load_state_dict = load_state_dict


def weights_help(arch: str, entry: str) -> str:
    """Where torchvision keeps ``arch``'s checkpoint for ``entry`` and where to fetch it."""
    import os

    import torch
    from torchvision.models import get_model_weights

    url = get_model_weights(arch)[entry].url
    kept = os.path.join(torch.hub.get_dir(), "checkpoints", url.rsplit("/", 1)[-1])
    return (f"{arch} needs weights: pass --weights PATH to torchvision's checkpoint for "
            f"{entry} ({kept} on a machine where torchvision.models.get_model({arch!r}, "
            f"weights={entry!r}) ran; or download {url}); --weights random:SEED builds seeded "
            "random weights for tests and demos only")


def build_model(arch: str, entry: str, weights: str | None, device: str = "meta"):
    """``get_model(arch, weights=entry)`` in eval mode on ``device`` with the weights of
    ``weights``: a checkpoint file (checked before: :func:`checked_identity`), ``random:SEED``
    (initialised on the CPU after ``torch.manual_seed(SEED)``, whatever the device), or None
    (the builder's initialisation with seed 0; on the ``meta`` device: shapes only); returns
    (model, weights identity)."""
    import torch
    from torchvision.models import get_model, get_model_weights

    enum_entry = get_model_weights(arch)[entry]
    if weights is None or weights_module.random_seed(weights) is not None:
        seed = 0 if weights is None else weights_module.random_seed(weights)
        with torch.random.fork_rng(devices=[]), \
                torch.device("meta" if device == "meta" else "cpu"), \
                _builder_state(_OwnInitialisation()):
            torch.manual_seed(seed)
            model = get_model(arch, weights=enum_entry)
        return model.eval().to(device), f"random:{seed}"
    checked_identity(arch, entry, weights)
    state, identity = weights_module.read_checkpoint(weights, weights_help(arch, entry))
    model = _with_state(arch, entry, weights, state)
    return model.eval().to(device), identity


def checked_identity(arch: str, entry: str, weights: str | None) -> str:
    """The weights' identity in a stage key (:func:`featpipe.extract.weights.
    weights_identity`), a file's only once torchvision's builder of ``arch`` has loaded it
    (on the meta device: its own key fixes and every name and shape, nothing allocated)."""
    import torch

    def check(state: dict) -> None:
        with torch.device("meta"), warnings.catch_warnings():
            warnings.simplefilter("ignore")  # "copying into a meta parameter is a no-op"
            _with_state(arch, entry, weights, state)

    return weights_module.weights_identity(weights, weights_help(arch, entry), check,
                                           f"{arch} {entry}")


def _with_state(arch: str, entry: str, weights: str, state: dict):
    """``get_model(arch, weights=entry)`` built with ``state``; a state it cannot take is a
    one-line error."""
    from torchvision.models import get_model, get_model_weights

    def check(loaded: dict, module) -> None:  # every name and shape, in featpipe's words
        weights_module.check_state_dict(weights, loaded, module.state_dict(),
                                        f"a torchvision {arch} ({entry})")

    try:
        with _builder_state(state, check):
            return get_model(arch, weights=get_model_weights(arch)[entry])
    except FeatpipeError:
        raise
    except Exception as err:
        lines = [line.strip() for line in str(err).splitlines() if line.strip()]
        raise FeatpipeError(f"--weights {weights} is not a torchvision {arch} checkpoint "
                            f"({entry}): {' '.join(lines[:2])[:300]}") from None


@functools.lru_cache(maxsize=4)
def _shapes_model(arch: str, entry: str):
    """The model for names and shapes: on the meta device (no memory, no initialisation),
    or on the CPU for the few builders that cannot build there (regnet)."""
    try:
        return build_model(arch, entry, None, "meta")[0]
    except NotImplementedError:
        return build_model(arch, entry, None, "cpu")[0]


@functools.lru_cache(maxsize=4)
def node_names(arch: str, entry: str) -> tuple[str, ...]:
    """The nodes of ``arch`` in eval mode (``get_graph_node_names``)."""
    from torchvision.models.feature_extraction import get_graph_node_names

    return tuple(get_graph_node_names(_shapes_model(arch, entry))[1])


@functools.lru_cache(maxsize=8)
def output_shape(arch: str, entry: str, layer: str, clip: int | None) -> tuple[int, ...]:
    """The node's output shape for one crop (or one clip of ``clip`` frames), batch axis
    dropped; a ParameterError when the model cannot take that input or the node gives no
    tensor."""
    import torch
    from torchvision.models import get_model_weights
    from torchvision.models.feature_extraction import create_feature_extractor

    model = _shapes_model(arch, entry)
    crop = ClassificationTransform.of(get_model_weights(arch)[entry].transforms()).crop
    shape = (1, 3, *crop) if clip is None else (1, 3, clip, *crop)
    device = next(model.parameters()).device
    try:
        out = create_feature_extractor(model, {layer: "out"})(
            torch.zeros(shape, device=device))["out"]
    except Exception as err:
        text = str(err).splitlines()[0][:200] if str(err) else type(err).__name__
        where = ("clip", f"of {clip} frames") if clip is not None else ("layer", layer)
        raise ParameterError(where[0], f"{where[1]}: {arch} cannot compute node {layer} on "
                             f"{'x'.join(map(str, shape[1:]))} inputs ({text})") from None
    if not isinstance(out, torch.Tensor) or out.ndim < 2:
        raise ParameterError("layer", f"{layer} of {arch} gives "
                             f"{type(out).__name__}, not a (N, C, ...) tensor: pick another node")
    return tuple(out.shape[1:])


@dataclass(frozen=True)
class _Resolved:
    """What a record resolves to: the model's canonical name, video or not, the weights
    entry, the preprocessing, the node's output shape; ``reduce`` (None where it changes
    nothing), ``clip`` and ``clip_stride`` (None for image models)."""

    arch: str
    video: bool
    entry: str
    transform: ClassificationTransform
    layer: str
    shape: tuple[int, ...]
    reduce: str | None
    clip: int | None
    clip_stride: int | None


def _closest(value: str, names, what: str) -> str:
    close = difflib.get_close_matches(value, names, n=5, cutoff=0.5)
    return f" (closest: {', '.join(close)})" if close else f" ({what})"


@functools.lru_cache(maxsize=16)
def resolve(arch, layer, transforms, spatial, reduce, clip, clip_stride) -> _Resolved:
    """Validate a record against torchvision (ParameterError naming the parameter) and
    resolve it (:class:`_Resolved`)."""
    if arch is None:
        raise ParameterError("arch", "is required by --features torchvision: a model of "
                             "torchvision.models (e.g. resnet50) or torchvision.models.video "
                             "(e.g. r2plus1d_18)")
    images, videos = model_names()
    name = arch.lower()
    if name not in images + videos:
        raise ParameterError("arch", f"must be an image classification model of "
                             f"torchvision.models or a video model of torchvision.models.video,"
                             f" got {arch!r}" + _closest(name, images + videos,
                                                         f"{len(images + videos)} models"))
    video = name in videos
    from torchvision.models import get_model_weights

    enum = get_model_weights(name)
    entries = [e.name for e in enum]
    entry = enum.DEFAULT.name if transforms in (None, "DEFAULT") else transforms
    if entry not in entries:
        raise ParameterError("transforms", f"must be DEFAULT or an entry of {name}'s weights "
                             f"({', '.join(entries)}), got {transforms!r}")
    if video and spatial:
        raise ParameterError("spatial", f"applies to image models; {name} is a video model")
    if not video and (clip is not None or clip_stride is not None):
        raise ParameterError("clip" if clip is not None else "clip_stride",
                             f"applies to the video models of torchvision.models.video, not "
                             f"{name}")
    if video and clip is None:
        docs = re.search(r"clip_len=(\d+)", enum.DEFAULT.meta.get("_docs", ""))
        hint = f" ({name}'s weights were evaluated on clips of {docs.group(1)})" if docs else ""
        raise ParameterError("clip", f"is required by the video model {name}: frames per "
                             f"clip{hint}")
    if layer is None:
        raise ParameterError("layer", f"is required by --features torchvision: a node of "
                             f"{name}, e.g. {node_names(name, entry)[-2]}")
    nodes = node_names(name, entry)
    # a module's name stands for its last node, as create_feature_extractor reads it
    matches = [node for node in nodes if node == layer or node.startswith(layer + ".")]
    if not matches:
        raise ParameterError("layer", f"must be a node of {name} in eval mode (or a module: "
                             f"its last node), got {layer!r}"
                             + _closest(layer, nodes, f"{len(nodes)} nodes") + "; "
                             "torchvision.models.feature_extraction.get_graph_node_names lists "
                             "them")
    layer = matches[-1]
    shape = output_shape(name, entry, layer, clip)
    if spatial and len(shape) != 3:
        raise ParameterError("spatial", f"needs a (C, H, W) map; {layer} of {name} gives "
                             f"{tuple(shape)}")
    single = len(shape) == 1 or int(np.prod(shape[1:])) == 1
    cells = tuple(shape[1:]) if spatial else None
    transform = ClassificationTransform.of(enum[entry].transforms(), cells)
    return _Resolved(name, video, entry, transform, layer, shape,
                     None if spatial or single else reduce, clip,
                     None if clip is None else (clip_stride or clip))


class TorchvisionFeatures(DeclaredEstimator):
    """The ``torchvision`` feature method: a node of a torchvision network for each frame (or
    clip), preprocessed by the weights' transforms (module docstring).

    Parameters
    ----------
    arch : str
        torchvision model: an image classification model of torchvision.models (resnet50,
        efficientnet_b0, vit_b_16...) or a video model of torchvision.models.video
        (r2plus1d_18, r3d_18, s3d...).
    layer : str
        Node whose output is the feature, as get_graph_node_names lists it, or a module
        (its last node) (resnet50: avgpool, layer4; r2plus1d_18: avgpool).
    weights : str
        Checkpoint file of the model (torchvision's .pth for the transforms' entry), or
        random:SEED (tests, demos).
    transforms : str
        Entry of the model's weights enum whose transforms() preprocess the frames and whose
        configuration builds the model (DEFAULT, IMAGENET1K_V1...).
    spatial : bool
        Keep the node's (C, H, W) map as H*W local features (image models).
    reduce : {"avg", "max", "flatten"}
        How a map becomes one vector: mean or max over its positions, or all its values.
    clip : int
        Video models: consecutive sampled frames per clip.
    clip_stride : int
        Video models: sampled frames from one clip's start to the next [clip].
    """

    _parameter_constraints = {
        "arch": [str, None],
        "layer": [str, None],
        "weights": [str, None],
        "transforms": [str, None],
        "spatial": ["boolean"],
        "reduce": [DeclaredOptions(set(REDUCTIONS))],
        "clip": [DeclaredInterval(Integral, 1, None, closed="left"), None],
        "clip_stride": [DeclaredInterval(Integral, 1, None, closed="left"), None],
    }

    def __init__(self, arch=None, layer=None, weights=None, transforms="DEFAULT", spatial=False,
                 reduce="avg", clip=None, clip_stride=None):
        self.arch = arch
        self.layer = layer
        self.weights = weights
        self.transforms = transforms
        self.spatial = spatial
        self.reduce = reduce
        self.clip = clip
        self.clip_stride = clip_stride

    @classmethod
    def _check_param_rules(cls, params):
        weights_module.check_seed(params)
        names = ("arch", "layer", "transforms", "spatial", "reduce", "clip", "clip_stride")
        if all(name in params for name in names):
            resolve(*(params[name] for name in names))

    @property
    def resolved(self) -> _Resolved:
        return resolve(self.arch, self.layer, self.transforms, self.spatial, self.reduce,
                       self.clip, self.clip_stride)

    def effective_params(self) -> dict:
        """The record as resolved: the model's canonical name, the weights entry by name, the
        clip stride filled in."""
        r = self.resolved
        return {**self.get_params(), "arch": r.arch, "transforms": r.entry,
                "clip_stride": r.clip_stride}

    @property
    def local(self) -> bool:
        """Local features (``spatial``) or one vector per frame or clip."""
        return bool(self.spatial)

    @property
    def n_features(self) -> int:
        """C for a map kept or reduced to its channels, else every value of the output."""
        r = self.resolved
        return int(r.shape[0]) if self.spatial or r.reduce in ("avg", "max") \
            else int(np.prod(r.shape))

    def count(self, height: int, width: int) -> float:
        """Rows per sampled frame: the map's cells (``spatial``), one, or 1/stride for clips
        (an estimate's rate)."""
        r = self.resolved
        if self.spatial:
            return int(np.prod(r.shape[1:]))
        return 1 if r.clip is None else 1.0 / r.clip_stride

    def preprocess(self) -> ClassificationTransform:
        return self.resolved.transform

    def weights_identity(self) -> str:
        r = self.resolved
        return checked_identity(r.arch, r.entry, self.weights)

    def stage_params(self) -> dict:
        """What the stage key holds besides the weights and the precision."""
        r = self.resolved
        return {"arch": r.arch, "layer": r.layer, "transforms": r.entry,
                "preprocess": r.transform.params(), "spatial": bool(self.spatial),
                "reduce": r.reduce, "clip": r.clip, "clip_stride": r.clip_stride}

    def network(self, device: str = "cpu", batch_size: int = 16) -> FrameNetwork:
        """The network, loaded on ``device`` (``batch_size``: the pipeline's, unused here);
        on the CPU as a frozen graph where one can be made (:func:`_cpu_node`)."""
        r = self.resolved
        identity = self.weights_identity()  # a missing value or an unusable file says what to pass
        if device == "cpu":
            node, loaded = _cpu_node(r, self.weights, identity)
        else:
            node, loaded = _node(r, self.weights, device)
        return FrameNetwork(node, r.transform, device, loaded, bool(self.spatial), r.reduce)


def _node(r: _Resolved, weights: str | None, device: str):
    """The node's output as an eval-mode module on ``device``: (module, weights identity of
    the bytes loaded)."""
    from torchvision.models.feature_extraction import create_feature_extractor

    model, identity = build_model(r.arch, r.entry, weights, device)
    return _node_class()(create_feature_extractor(model, {r.layer: "out"})).eval(), identity


@functools.lru_cache(maxsize=1)
def _cpu_node(r: _Resolved, weights: str | None, identity: str):
    """:func:`_node` on the CPU as a frozen graph where one can be made
    (:func:`featpipe.extract.cpu_inference.frozen`: tracing, freezing and checking it cost
    about four forward passes).  The last one is kept for the next load of the same node with
    the same weights (``identity``: their content now), as a dry run's calibration and then
    the run load it, or the passes of a pipeline."""
    from featpipe.extract.cpu_inference import frozen

    node, loaded = _node(r, weights, "cpu")
    return frozen(node, _example_input(r)), loaded


def _example_input(r: _Resolved):
    """Two normalised inputs of the model's shape (seeded normal values): (2, 3, H, W), or
    (2, 3, T, H, W) clips."""
    import torch

    shape = (2, 3, *r.transform.crop) if r.clip is None else (2, 3, r.clip, *r.transform.crop)
    return torch.randn(shape, generator=torch.Generator().manual_seed(0))


@functools.lru_cache(maxsize=1)
def _node_class():
    from torch import nn

    class Node(nn.Module):
        """A feature extractor's one node as the module's output (a tensor, not a dict)."""

        def __init__(self, extractor):
            super().__init__()
            self.extractor = extractor

        def forward(self, batch):
            return self.extractor(batch)["out"]

    return Node


FEATURE_METHODS = [
    FeatureMethod("torchvision", "a node of any torchvision image or video model (--arch, "
                  "--layer): one vector per frame or clip, or a map (--spatial)",
                  TorchvisionFeatures, "torchvision", local=False, runs="model"),
]
