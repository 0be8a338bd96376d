"""The ``featpipe extract --features`` registry: feature methods, declared as encoders are.

Each feature module declares ``FEATURE_METHODS``, a list of :class:`FeatureMethod`; the
modules are :data:`FEATURE_MODULES`, then any plugin module named by the
``featpipe.features`` entry point group or by ``$FEATPIPE_FEATURES`` (module names separated
by commas).  A method's parameters are those of its estimator class, declared once
(signature, ``_parameter_constraints``, numpydoc: :func:`featpipe.parameters.
estimator_parameters`); the command line's options and a pipeline step's ``params`` table
come from them, and the stage key holds their canonical record
(:func:`featpipe.parameters.parameter_record`).

Where a method runs:

* ``"worker"``: a local feature computed inside each decoding worker process.  Its
  estimator has ``n_features`` (values per row), ``count(height, width)`` (rows per frame;
  0 when the frame is too small for one), ``compute(rgb_frame)`` returning
  ``.descriptors`` (N, n_features) and ``.positions`` (N, 3: x, y, scale in frame pixels),
  and may have ``minimum_size()`` (words for the smallest frame that gives a row).  A
  stateful method (dense trajectories: a frame's rows depend on the frames before it) has
  ``start(height, width)`` instead of ``compute``: one tracker per video, whose
  ``add(rgb_frame)`` returns the rows that end at that frame (``add(rgb_frame, boxes=...)``
  with ``--human-boxes`` when the estimator's ``takes_boxes`` is true).
* ``"model"``: a network in the parent process fed with crops from the workers (VGG-16,
  :mod:`featpipe.extract.vgg`; any torchvision model, :mod:`featpipe.extract.
  torchvision_features`).  Its estimator has ``n_features`` and ``count(height, width)``
  as above, ``weights`` (a checkpoint path or ``random:SEED``), ``weights_identity()``
  (what the stage key holds of them: :mod:`featpipe.extract.weights`), ``stage_params()``
  (the rest of the key: preprocessing, layer...), ``preprocess()`` (a picklable transform
  run in the decoding workers: RGB uint8 frame -> uint8 crop, with ``shape`` (crop height,
  width) and, for local features, ``positions(frame_shape)``) and ``network(device,
  batch_size)`` (loaded: ``forward_crops(uint8 host tensor) -> numpy``, ``device``,
  ``weights_identity``); optionally ``local`` (local features or not, decided by its
  parameters) and ``clip``/``clip_stride`` (one row per clip of sampled frames).
"""

from __future__ import annotations

import importlib
from dataclasses import dataclass

from featpipe import settings
from featpipe.parameters import Parameter, estimator_parameters

#: Modules that define FEATURE_METHODS.
FEATURE_MODULES: list[str] = ["featpipe.extract.vgg", "featpipe.extract.torchvision_features",
                              "featpipe.extract.dsift", "featpipe.extract.trajectories"]
#: Entry point group of plugin modules; environment variable listing plugin modules.
ENTRY_POINT_GROUP = "featpipe.features"
PLUGIN_VARIABLE = "FEATPIPE_FEATURES"


@dataclass(frozen=True)
class FeatureMethod:
    """One ``--features`` value: ``estimator`` (a class) with the ``fixed`` values it always
    gets (``layer="fc6"``); ``local`` (rows per frame) or one vector per frame; where it
    ``runs``; ``label`` names it in messages; ``default_fps`` is its video sampling when
    none is asked for (None: every frame)."""

    name: str
    summary: str
    estimator: type
    label: str
    local: bool = True
    runs: str = "worker"
    default_fps: float | None = None
    fixed: tuple[tuple[str, object], ...] = ()

    @property
    def parameters(self) -> tuple[Parameter, ...]:
        return estimator_parameters(self.estimator, exclude=dict(self.fixed))

    def build(self, record: dict):
        """The estimator with the parameters of ``record`` (and the fixed ones)."""
        return self.estimator(**record, **dict(self.fixed))


def plugin_modules() -> list[str]:
    """The plugin modules: ``featpipe.features`` entry points, then ``$FEATPIPE_FEATURES``."""
    return settings.plugin_modules(ENTRY_POINT_GROUP, PLUGIN_VARIABLE)


def load_features() -> dict[str, FeatureMethod]:
    """Every registered feature method by name."""
    found = [(name, importlib.import_module(name).FEATURE_METHODS) for name in FEATURE_MODULES]
    found += [(name, settings.plugin_attribute(name, PLUGIN_VARIABLE, "FEATURE_METHODS"))
              for name in plugin_modules()]
    return settings.registry(found, "feature method")
