"""What a stage's items are (its *item kind*), and which kinds each step takes and makes.

featpipe's types, checked when a run is planned (:mod:`featpipe.plan`):

* ``sequence``: rows in time order, T x D, one per sampled frame or clip (``timestamps``):
  VGG-16 fc6 and a torchvision network's vectors of a video, per-frame encodings of a video
  (``fisher --per-frame``, ``spatial-grid``, ``bilinear`` of each frame), imported 2-D items;
* ``descriptors``: a set of local descriptors per frame or per image, with their frame index
  (``frame_index``), in no order within a frame: dense SIFT, dense trajectories, conv5_3 and
  torchvision ``--spatial`` maps, and a sample of them (``--sample-descriptors``);
* ``vector``: one vector per item: a pooled or encoded video or image (avg, rankpool, hrp,
  fisher, ...), a network's vector of an image (a one-frame sequence is one vector), imported
  1-D items.

A stage's kind follows from its record (its kind and parameters, an encode stage's from its
input's kind), so nothing is stored beside it: :func:`item_kind`.  An import's is what its
``item_kind`` says (``featpipe import --item-kind``); without it, it is guessed from the
items' shape (1-D: vectors, 2-D: sequences, or descriptors with a ``frame_index`` sidecar),
and a guess is shown but never refused.  Every encoder declares the kinds it takes and
the kind it makes (:class:`Kinds`, ``EncodeMethod.kinds``; undeclared: a plugin's, not
checked), and every step that reads a stage checks its kind before any stage exists
(:func:`check_input`): a mismatch is a :class:`~featpipe.errors.ParameterError` naming both
sides and the way out.  docs/encoders.md ("Item kinds") has the table of what each encoder
takes.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping
from dataclasses import dataclass

from featpipe.errors import ParameterError

SEQUENCE = "sequence"
DESCRIPTORS = "descriptors"
VECTOR = "vector"
ITEM_KINDS = (SEQUENCE, DESCRIPTORS, VECTOR)

#: what a stage of each kind holds, for messages
HOLDS = {SEQUENCE: "sequences in time order (a row per frame)",
         DESCRIPTORS: "sets of local descriptors (rows with their frame index)",
         VECTOR: "one vector per item"}


@dataclass(frozen=True)
class ItemKind:
    """A stage's item kind; ``what`` names its content for messages (``'dense SIFT'``);
    ``per_image``: every item is an image (one frame), whose per-frame output is one vector."""

    kind: str
    what: str = ""
    per_image: bool = False
    #: guessed from the items' shape (an import without ``item_kind``): shown, not checked
    guessed: bool = False

    @property
    def label(self) -> str:
        """The kind as a plan shows it (``sequence?`` when guessed)."""
        return self.kind + ("?" if self.guessed else "")

    def describe(self) -> str:
        return f"{self.what} {HOLDS[self.kind]}".strip() if self.what else HOLDS[self.kind]


@dataclass(frozen=True)
class Kinds:
    """What an encoder takes and makes: ``takes`` the item kinds it encodes (a function of
    its parameters where they decide it), ``makes(params, taken)`` the kind of its output;
    ``does`` says what it does for messages (``'pools a sequence in time order'``)."""

    takes: tuple[str, ...] | Callable[[Mapping], tuple[str, ...]]
    makes: Callable[[Mapping, str], str]
    does: str

    def taken(self, params: Mapping) -> tuple[str, ...]:
        return self.takes(params) if callable(self.takes) else self.takes


def _vector(params: Mapping, taken: str) -> str:
    return VECTOR


def _same(params: Mapping, taken: str) -> str:
    return taken


def _per_frame_of_descriptors(params: Mapping, taken: str) -> str:
    """An encoder of each frame's descriptors: a sequence of a video's frames (one vector per
    image: :func:`encoded_kind`); the rows of a sequence taken as one set: one vector."""
    return SEQUENCE if taken == DESCRIPTORS else VECTOR


def _layer_or_vector(params: Mapping, taken: str) -> str:
    return SEQUENCE if params.get("emit_layer") else VECTOR


#: the temporal encoders (avg, max, tpyramid, arp, rankpool, hrp, recursive, dhrp)
POOLS_TIME = Kinds((SEQUENCE,), _layer_or_vector, "pools a sequence in time order")
#: Fisher vectors: of a set of descriptors or of a sequence's frames as descriptors; one per
#: frame (``per_frame``) needs each descriptor's frame
FISHER = Kinds(lambda p: (DESCRIPTORS,) if p.get("per_frame") else (DESCRIPTORS, SEQUENCE),
               lambda p, taken: SEQUENCE if p.get("per_frame") else VECTOR,
               "encodes a set of local descriptors (per frame with --per-frame)")
#: one group's columns of Fisher vectors (per item or per frame)
FISHER_GROUP = Kinds((VECTOR, SEQUENCE), _same, "keeps one group's part of Fisher vectors")
#: second-order pooling and GM-SOP: each frame's descriptors, or a sequence's rows as one set
SECOND_ORDER = Kinds((DESCRIPTORS, SEQUENCE), _per_frame_of_descriptors,
                     "pools a set of local descriptors (each frame's)")
#: pooling each frame's descriptors on a spatial grid (their positions)
SPATIAL_GRID = Kinds((DESCRIPTORS,), lambda p, taken: SEQUENCE,
                     "pools each frame's local descriptors on a spatial grid")
#: a per-channel map of any item
ANY_ROWS = Kinds(ITEM_KINDS, _same, "maps every row")


def encoded_kind(method: str, kinds: Kinds | None, params: Mapping,
                 source: ItemKind | None) -> ItemKind | None:
    """The kind of encoder ``method``'s output on ``source`` (None: unknown)."""
    if kinds is None or source is None:
        return None
    made = kinds.makes(params, source.kind)
    if made == SEQUENCE and source.per_image:
        made = VECTOR
    what = f"{method} of {source.what}" if source.what else method
    return ItemKind(made, what, source.per_image, source.guessed)


def check_input(step: str, kinds: Kinds | None, params: Mapping, source: ItemKind | None,
                source_name: str, param: str = "input") -> None:
    """Refuse (a :class:`ParameterError` for ``param``) a ``source`` (named ``source_name``:
    ``"'raw'"``) of a kind that ``step`` (``'hrp'``, ``'classify'``) does not take, naming
    both sides and the way out."""
    if kinds is None or source is None or source.guessed:
        return
    taken = kinds.taken(params)
    if source.kind in taken:
        return
    raise ParameterError(param, f"{source_name} holds {source.describe()}; {step} "
                         f"{kinds.does}: {way_out(source.kind, taken)}")


def way_out(given: str, taken: tuple[str, ...]) -> str:
    """What to do instead, for a step that takes ``taken`` given items of kind ``given``."""
    if given == DESCRIPTORS and SEQUENCE in taken:
        return ("encode each frame first (extract --encode fisher --per-frame, or "
                "spatial-grid), or use a local-descriptor encoder (fisher, bilinear, cov, "
                "cbp-ts, cbp-rm)")
    if given == DESCRIPTORS:
        return "encode the descriptors first (featpipe encode -m fisher, bilinear, ...)"
    if given == VECTOR and SEQUENCE in taken:
        return ("there is no time axis left to pool: pool the per-frame stage it was made "
                "from (e.g. fisher --per-frame), or use the vectors as they are")
    if given == VECTOR:
        return "its items are already one vector each; use it as it is"
    if given == SEQUENCE and taken == (VECTOR,):
        return "pool the frames first (featpipe encode -m avg, rankpool, hrp, ...)"
    if given == SEQUENCE and taken == (DESCRIPTORS,):
        return ("it needs each descriptor's frame (and position): give it the local "
                "features of the extraction")
    return f"it takes {' or '.join(taken)} items"


#: what a classifier takes
CLASSIFY = Kinds((VECTOR,), _vector, "trains on one vector per item")
#: what each fit takes
FITS = {
    "pca": Kinds(ITEM_KINDS, _vector, "fits on rows"),
    "gmm": Kinds((DESCRIPTORS, SEQUENCE), _vector, "fits on rows of descriptors"),
    "deep-gmm": Kinds((DESCRIPTORS, SEQUENCE), _vector, "fits on sets of descriptors"),
    "standardize": Kinds(ITEM_KINDS, _vector, "fits on rows"),
    "dhrp": Kinds((SEQUENCE,), _vector, "learns to pool sequences in time order"),
    "gmsop": Kinds((DESCRIPTORS,), _vector, "learns to pool sets of local descriptors"),
}


_known: dict[str, ItemKind | None] = {}


def remember(stage, kind: ItemKind | None) -> None:
    """Record the kind of a stage planned in this process (its folder name is its key, so the
    kind holds for every stage of that name)."""
    _known[stage.name] = kind


def item_kind(stage) -> ItemKind | None:
    """What ``stage``'s items are, from its record (the module docstring); None for stages
    without items (fits, classify) and where it cannot be told."""
    if stage.name in _known:
        return _known[stage.name]
    kind = _derived(stage)
    _known[stage.name] = kind
    return kind


def _derived(stage) -> ItemKind | None:
    params = stage.params if isinstance(stage.params, dict) else {}
    if stage.kind == "extract":
        return extraction_kind(params)
    if stage.kind == "import":
        return import_kind(stage, params)
    if stage.kind == "encode":
        from featpipe.encode.registry import load_method

        try:
            method = load_method(params.get("method"))
            source = stage.inputs()[0]
        except Exception:  # noqa: BLE001 - an unknown method or input: nothing checked
            return None
        return encoded_kind(method.name, method.kinds, params, item_kind(source))
    return None


def extraction_kind(params: Mapping) -> ItemKind | None:
    """An extraction's kind from its key's record: a sample of descriptors, an ``--encode``
    method's output, or the features' (local or one vector per frame)."""
    from featpipe.extract.features import load_features

    methods = load_features()
    method = methods.get(params.get("features"))
    if method is None:
        return None
    local = bool(params["spatial"]) if "spatial" in params else method.local
    images = "sampling" in params and params["sampling"] is None
    features = ItemKind(DESCRIPTORS if local else (VECTOR if images else SEQUENCE),
                        method.name, images)
    if "sample" in params:
        return ItemKind(DESCRIPTORS, f"a sample of {method.name}", images)
    encode = params.get("encode")
    if isinstance(encode, Mapping):
        from featpipe.encode.registry import load_method

        try:
            chosen = load_method(encode.get("method"))
        except KeyError:
            return None
        return encoded_kind(chosen.name, chosen.kinds, encode, features)
    return features


def import_kind(stage, params: Mapping) -> ItemKind | None:
    """An import's kind: ``item_kind`` of its key, else guessed from its items' shape
    (:func:`shape_kind`), read from one computed item (None before one is)."""
    if params.get("item_kind") in ITEM_KINDS:
        return ItemKind(params["item_kind"], "imported")
    if not stage.exists:
        return None
    for item_id in sorted(stage.done_ids())[:1]:
        array = stage.read_item(item_id, mmap=True)
        framed = stage.read_extra(item_id, "frame_index") is not None
        return shape_kind(array.ndim, framed)
    return None


def shape_kind(ndim: int, framed: bool = False) -> ItemKind:
    """The kind guessed for imported items of ``ndim`` dimensions: 1-D: vectors; 2-D and more:
    sequences, or descriptors when they have a ``frame_index`` sidecar (``framed``)."""
    kind = VECTOR if ndim <= 1 else DESCRIPTORS if framed else SEQUENCE
    return ItemKind(kind, "imported", guessed=True)
