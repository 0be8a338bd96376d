"""Fisher vectors per descriptor group, and one group's part of them (``--method fisher-group``).

With a ``fit gmm --groups`` stage (:mod:`featpipe.extract.groups`: for each group g its columns
c_g of the raw rows, its projection P_g and its GMM θ_g), ``encode --method fisher`` (and
``extract --encode fisher``) gives, per frame (``--per-frame``) or per item,

    FV(X) = [FV_θ1(P_1 X[:, c_1]); ...; FV_θG(P_G X[:, c_G])],

each group's FV computed and normalised (improved: signed square root, then L2) on its own,
as the improved-trajectory recipe encodes each descriptor separately (Wang & Schmid, ICCV'13
§4; per frame and then rank pooled: Fernando et al., CVPR'16 §5.6).  Group g takes
2·K_g·d_g values (d_g after its projection), in group order.

``encode --method fisher-group --gmm G --group hog`` keeps group ``hog``'s part of such FVs
(per frame, sidecars kept; or per item), to rank pool or classify one descriptor on its own.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

import numpy as np
from sklearn.base import BaseEstimator

from featpipe.backend import single_threaded_blas
from featpipe.errors import InputError, ParameterError
from featpipe.extract.groups import MODEL_NAME
from featpipe.extract.pca import PCAProjection
from featpipe.item_kinds import FISHER_GROUP
from featpipe.items import (
    Frame,
    LocalFeatures,
    MemorySink,
    PerFrameStream,
    frame_rows,
    stream_item,
)
from featpipe.parallel import ItemOutput
from featpipe.parameters import ValidatedEstimator, estimator_parameters, model_parameter


def is_grouped(stage) -> bool:
    """Whether a GMM stage holds one model per descriptor group."""
    return stage.has_model(MODEL_NAME)


def group_models(stage) -> tuple[list[tuple[str, slice, dict]], dict]:
    """((group, its columns, its GMM arrays with ``pca_mean``/``pca_components``) per group,
    in order; the ``groups`` model's metadata: ``input_groups``, ``input_dim``)."""
    arrays, meta = stage.load_model(MODEL_NAME)
    parts = []
    for group, (start, stop) in zip(meta["groups"], arrays["columns"], strict=True):
        gmm, _ = stage.load_model(f"gmm-{group}")
        if stage.has_model(f"pca-{group}"):
            mean, components = stage.load_model(f"pca-{group}", PCAProjection).projection()
            gmm.update(pca_mean=mean, pca_components=components)
        parts.append((group, slice(int(start), int(stop)), gmm))
    return parts, meta


def group_widths(stage) -> list[tuple[str, int]]:
    """(group, values of its FV: 2·K·d) of a grouped GMM stage, in order."""
    arrays, meta = stage.load_model(MODEL_NAME)
    out = []
    for group in meta["groups"]:
        gmm, _ = stage.load_model(f"gmm-{group}")
        out.append((group, 2 * int(np.asarray(gmm["means"]).size)))
    return out


class GroupedFisherEncoder:
    """An encoder per group on its columns (the module's formula): ``make(arrays)`` gives a
    group's :class:`~featpipe.encode.fisher.FisherItemEncoder` from its GMM arrays, with the
    fisher method's parameters, shared by the groups (``per_frame`` among them)."""

    def __init__(self, stage, make, per_frame: bool = False):
        parts, meta = group_models(stage)
        self.parts = [(group, columns, make(arrays)) for group, columns, arrays in parts]
        self.per_frame = per_frame
        #: what the rows must hold: their width and the extraction's groups
        self.input_dim = int(meta["input_dim"])
        self.input_groups = tuple(meta["input_groups"])

    def _check(self, x: np.ndarray) -> None:
        if x.ndim != 2 or x.shape[1] != self.input_dim:
            raise InputError(f"descriptors of shape {x.shape}: expected (N, {self.input_dim}) "
                             f"rows of the groups {', '.join(self.input_groups)}")

    @property
    def width(self) -> int:
        """Values of one grouped FV: the groups' FVs side by side."""
        return sum(encoder.width for _, _, encoder in self.parts)

    def _encode(self, frames) -> np.ndarray:
        """The grouped FVs of ``frames`` (F, width): each group's columns of all the frames'
        descriptors encoded together (:meth:`FisherItemEncoder.encode_parts`)."""
        for frame in frames:
            self._check(np.asarray(frame.descriptors))
        x, offsets = frame_rows(frames)
        out = np.empty((len(frames), self.width), np.float32)
        start = 0
        with single_threaded_blas():  # one limit for the projections and the GEMMs
            for _, columns, encoder in self.parts:
                encoder.encode_parts(x[:, columns], offsets, out, start)
                start += encoder.width
        return out

    def stream(self, sink):
        """One item frame by frame: per-frame grouped FVs as they come, or the item's."""
        if self.per_frame:
            return PerFrameStream(self._encode, sink, skip_empty=False)
        return _GroupedItemStream(self, sink)

    def _encode_record(self, array, extra):
        array = np.asarray(array)
        if self.per_frame:
            record = LocalFeatures.from_item(array, extra, stacked="frames")
            if record.frame_index is None:
                raise InputError("--per-frame needs a 'frame_index' sidecar (one frame index "
                                 "per descriptor)")
            return stream_item(self, record, self.width)
        image_size = extra.get("image_size")
        sink = MemorySink()
        stream = self.stream(sink)
        stream.add(Frame(array, 0, None, extra.get("positions"),
                         None if image_size is None else tuple(np.ravel(image_size)[:2])))
        stream.finish()
        return sink.output()

    def encode_batch(self, arrays, extras):
        return [self._encode_record(a, e) for a, e in zip(arrays, extras, strict=True)]


class _GroupedItemStream:
    """Each group's item FV accumulated over the frames; concatenated at the end."""

    def __init__(self, encoder: GroupedFisherEncoder, sink):
        self.encoder = encoder
        self.sink = sink
        self.sinks = [MemorySink() for _ in encoder.parts]
        self.streams = [e.stream(s) for (_, _, e), s in zip(encoder.parts, self.sinks,
                                                             strict=True)]

    def add(self, frame) -> None:
        x = np.asarray(frame.descriptors)
        self.encoder._check(x)
        for (_, columns, _), stream in zip(self.encoder.parts, self.streams, strict=True):
            stream.add(dataclasses.replace(frame, descriptors=x[:, columns]))

    def finish(self) -> None:
        for stream in self.streams:
            stream.finish()
        self.sink.write(np.concatenate([s.array for s in self.sinks]))


# -- `featpipe encode --method fisher-group` --------------------------------------------------

class FisherGroup(ValidatedEstimator, BaseEstimator):
    """One descriptor group's part of grouped Fisher vectors.

    Parameters
    ----------
    group : str
        The group to keep (one of the gmm stage's ``--groups``).
    """

    _parameter_constraints = {"group": [str, None]}

    @classmethod
    def _check_param_rules(cls, params):
        if params.get("group", "") is None:
            raise ParameterError("group", "is required: name one group of the gmm stage "
                                 "(fit gmm --groups)")

    def __init__(self, group=None):
        self.group = group


class _GroupSlice:
    def __init__(self, stage, group: str):
        widths = group_widths(stage)
        names = [g for g, _ in widths]
        if group not in names:
            raise ParameterError("group", f"{group!r} is not a group of {stage.name} (its "
                                 f"groups: {', '.join(names)})")
        start = sum(w for _, w in widths[:names.index(group)])
        self.columns = slice(start, start + dict(widths)[group])
        self.total = sum(w for _, w in widths)
        self.stage_name = stage.name

    def encode_batch(self, arrays, extras: list[Mapping]):
        out = []
        for array, extra in zip(arrays, extras, strict=True):
            array = np.asarray(array)
            if array.shape[-1] != self.total or array.ndim not in (1, 2):
                raise InputError(f"expected grouped Fisher vectors of {self.total} values "
                                 f"(gmm {self.stage_name}), per item or per frame, got shape "
                                 f"{array.shape}")
            part = np.ascontiguousarray(array[..., self.columns], dtype=np.float32)
            kept = {k: np.asarray(v) for k, v in extra.items()
                    if k in KEPT_SIDECARS} if array.ndim == 2 else {}
            out.append(ItemOutput(part, kept) if kept else part)
        return out


def _build_slice(params, models):
    return _GroupSlice(models["gmm"], params["group"])


#: the sidecars a group's part of per-frame Fisher vectors keeps
KEPT_SIDECARS = ("frame_index", "timestamps")


def _view(params, models) -> tuple[slice, tuple[str, ...]]:
    """The columns of group ``params['group']`` in grouped Fisher vectors: a stored stage's
    group part is a view of those columns (:meth:`featpipe.store.Stage.make_view`)."""
    return _GroupSlice(models["gmm"], params["group"]).columns, KEPT_SIDECARS


def _encode_methods():
    from featpipe.encode.registry import EncodeMethod

    gmm = model_parameter("gmm", "GMM model stage.", ("fit gmm",))
    return [EncodeMethod("fisher-group", "one descriptor group's part of grouped Fisher "
                         "vectors (fit gmm --groups)", _build_slice,
                         (gmm, *estimator_parameters(FisherGroup)), view=_view,
                         kinds=FISHER_GROUP)]


ENCODE_METHODS = _encode_methods()
