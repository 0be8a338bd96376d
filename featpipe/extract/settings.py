"""The run settings of the ``extract`` stage besides its feature method and frame sampling:
what each item holds and how the stage runs, one record (:class:`ExtractSettings`).

Each field is declared once (:func:`featpipe.parameters.declared`: type, default, help):
``featpipe extract``'s options and an extract step's keys in a pipeline file are made from
these declarations, as the feature methods' options are made from their estimators.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from featpipe.errors import ParameterError
from featpipe.parameters import declared

#: the encode methods that take local features, offered by ``extract --encode``
LOCAL_ENCODERS = ("fisher", "bilinear", "cov", "cbp-ts", "cbp-rm", "spatial-grid", "gmsop")
#: the longest --decode-timeout, in seconds (11.6 days; an infinite one overflows the waits)
MAX_DECODE_TIMEOUT = 1e6


@dataclass(frozen=True)
class ExtractSettings:
    """What each item holds (part of the stage key): the stored ``dtype``; local features'
    ``positions``; the ``human_boxes`` folder of a method that takes boxes (by content); the
    ``pca`` stage that projects the features first; then the features
    themselves, or their encoding by ``encode`` with ``encode_params`` (``featpipe encode``'s
    parameters of that method), or ``sample_descriptors`` rows drawn with ``sample_seed``
    (of as few train items of ``sample_split`` as give ``sample_total`` rows:
    :mod:`featpipe.stages.sample_rule`; of ``sample_window`` consecutive frames of each at a
    seeded first frame: :func:`featpipe.io.video.window_start`).
    How the stage runs: a network's ``device`` and ``batch_size``, the ``decoder`` (part of
    the key) and its ``decode_timeout``, ``allow_partial`` and ``disk_check``; the steps
    that run in the same pass (``then``) and whether the extraction itself is written
    (``keep``)."""

    device: str = declared(
        "cpu", "Where the network (VGG-16, torchvision) and an --encode method with a device "
        "run.", choices=("cpu", "cuda"))
    batch_size: int = declared(
        16, "Frames (a video model: clips) per forward pass of the network (several items "
        "share one).")
    dtype: str = declared("float32", "Stored array type.", choices=("float32", "float16"))
    positions: bool = declared(True, "Store x, y, scale of each local feature.")
    pca: str | None = declared(
        None, "Project the features with this fitted pca stage (featpipe fit pca).",
        model=("fit pca",))
    encode: str | None = declared(
        None, "Store only this encoding of the local features (as featpipe encode --method; "
        "--help after it lists its options).", choices=LOCAL_ENCODERS)
    encode_params: Mapping | None = None
    sample_descriptors: int | None = declared(
        None, "Store only N rows per item, drawn uniformly (for fit pca / fit gmm).")
    sample_seed: int = declared(0, "Seed of the --sample-* draws (with the item id).")
    sample_total: int | None = declared(
        None, "With --sample-descriptors: only as many train items of --sample-split as give "
        "N rows, stratified by class.")
    sample_split: int = declared(1, "The split whose train items --sample-total draws from.")
    sample_window: int | None = declared(
        None, "With --sample-descriptors: only W consecutive frames of each item, from a "
        "start drawn with --sample-seed.")
    human_boxes: str | None = declared(
        None, "Folder of human boxes per item (DIR/<id>.bb, idt's -H format) left out of "
        "its camera motion.")
    allow_partial: bool = declared(
        False, "Keep truncated or damaged videos' decodable frames, warned.")
    disk_check: bool = declared(
        True, "Refuse a stage bigger than the store's free disk.")
    decoder: str = declared("opencv", "Video decoder.")
    decode_timeout: float = declared(
        600.0, "Seconds a decoding worker may go without a frame before it is killed.")
    #: ``featpipe encode`` steps run on each item in the same pass (:class:`featpipe.chain.
    #: Then`: ``extract --temporal``, the steps ``featpipe run`` fuses), and whether the
    #: extraction's own stage is written then (None: only without steps)
    then: tuple = ()
    keep: bool | None = None

    def check(self, method) -> None:
        """Raise ParameterError for a value or a combination that cannot be made with the
        feature ``method`` (:class:`~featpipe.extract.features.FeatureMethod`)."""
        if self.batch_size < 1:
            raise ParameterError("batch_size", f"must be >= 1, got {self.batch_size}")
        if not 0 < self.decode_timeout <= MAX_DECODE_TIMEOUT:  # inf overflows the waits
            raise ParameterError("decode_timeout", f"must be > 0 and at most "
                                 f"{MAX_DECODE_TIMEOUT:g} seconds, got {self.decode_timeout}")
        if self.encode is None and self.encode_params:
            raise ParameterError(next(iter(self.encode_params)), "applies to --encode only")
        if self.encode is not None and self.sample_descriptors is not None:
            raise ParameterError("sample_descriptors", "cannot be combined with --encode")
        if self.sample_descriptors is not None and self.sample_descriptors < 1:
            raise ParameterError("sample_descriptors",
                                 f"must be >= 1, got {self.sample_descriptors}")
        if self.sample_total is not None and (self.sample_descriptors is None or
                                              self.sample_total < 1):
            raise ParameterError("sample_total", "must be >= 1 and goes with "
                                 f"--sample-descriptors, got {self.sample_total}")
        if self.sample_window is not None:
            if self.sample_descriptors is None or self.sample_window < 1:
                raise ParameterError("sample_window", "must be >= 1 and goes with "
                                     f"--sample-descriptors, got {self.sample_window}")
            if self.human_boxes is not None:
                raise ParameterError("sample_window", "cannot be combined with --human-boxes "
                                     "(boxes are given per video frame from the first)")
        if self.sample_split < 1:
            raise ParameterError("sample_split", f"must be >= 1, got {self.sample_split}")
        if self.encode is not None and self.encode not in LOCAL_ENCODERS:
            raise ParameterError("encode", f"must be one of {LOCAL_ENCODERS} (encoders of "
                                 f"local features), got {self.encode!r}")
        if self.encode is not None and not method.local:
            raise ParameterError("encode", f"applies to local features, not {method.name}; "
                                 "encode its per-frame vectors with `featpipe encode`")
        if self.human_boxes is not None:
            if not getattr(method.estimator, "takes_boxes", False):
                raise ParameterError("human_boxes", f"applies to methods that estimate the "
                                     f"camera motion (idt), not {method.name}")
            if not Path(self.human_boxes).is_dir():
                raise ParameterError("human_boxes", f"{self.human_boxes} is not a folder")
        from featpipe.settings import node_checks_deferred

        if self.device == "cuda" and not node_checks_deferred():  # else on the node
            import torch

            if not torch.cuda.is_available():
                raise ParameterError("device", "is cuda but torch sees no CUDA device; use "
                                     "--device cpu")
