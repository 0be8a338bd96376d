"""The ``encode`` stage: one vector (or sequence) per item of an input stage.

Methods and their parameters come from :mod:`featpipe.encode.registry`; model parameters
(``gmm``, ``model``...) name fitted stages of the same store.
"""

from __future__ import annotations

import difflib
from collections.abc import Mapping, Sequence

from featpipe.encode.registry import EncodeMethod, load_method, load_methods, method_params
from featpipe.errors import FeatpipeError, ItemError, ParameterError, describe_error
from featpipe.item_kinds import check_input, encoded_kind, item_kind, remember
from featpipe.parallel import ItemOutput
from featpipe.stages.base import (
    Reporter,
    RunOptions,
    StageRun,
    Written,
    check_name,
    input_rows,
    run_stage,
    usable_items,
)
from featpipe.store import VIEW_FILE, Stage, Store, view_bytes


class EncodeCompute:
    """Picklable compute for the executor: reads inputs, builds the encoder once per worker."""

    def __init__(self, input_path, method: str, params: Mapping, model_paths: Mapping):
        self.input_path = input_path
        self.method = method
        self.params = dict(params)
        self.model_paths = dict(model_paths)
        self._encoder = None

    def __getstate__(self):
        return {**self.__dict__, "_encoder": None}

    def encoder(self):
        if self._encoder is None:
            self._encoder = self._build(self.params)
        return self._encoder

    def sizing_encoder(self):
        """The encoder on the CPU, for a dry run's sizes: an item's size does not depend on
        the device, and ``--device cuda`` may be checked on another node (``submit``)."""
        if self.params.get("device", "cpu") == "cpu":
            return self.encoder()
        return self._build({**self.params, "device": "cpu"})

    def _build(self, params: Mapping):
        models = {k: Stage.at(p) for k, p in self.model_paths.items()}
        return load_method(self.method).build(params, models)

    def __call__(self, ids: Sequence[str]) -> list:
        from featpipe.backend import SPILL_FOLDER

        token = SPILL_FOLDER.set(str(self.input_path))  # spills stay on the store's disk
        try:
            return self._encode(ids)
        finally:
            SPILL_FOLDER.reset(token)

    def _encode(self, ids: Sequence[str]) -> list:
        source = Stage(self.input_path)
        arrays, extras, results = [], [], []
        for item_id in ids:
            try:
                arrays.append(source.read_item(item_id))
                extras.append(source.extras_of(item_id))
                results.append(None)
            except ItemError as err:
                results.append(ItemError(item_id, f"input not available: {err.cause}"))
        encoder = self.encoder()
        try:
            encoded = encoder.encode_batch(arrays, extras)
        except Exception:  # find the bad item: encode one by one
            encoded = []
            for array, extra in zip(arrays, extras, strict=True):
                try:
                    encoded.append(encoder.encode_batch([array], [extra])[0])
                except Exception as err:
                    encoded.append(err)
        outputs = iter(encoded)
        for i in range(len(ids)):
            if results[i] is None:
                value = next(outputs)
                keep = isinstance(value, BaseException | ItemOutput)  # ItemOutput: sidecars
                results[i] = value if keep else ItemOutput(value)
        return results


def method_record(method: EncodeMethod, given: Mapping) -> dict:
    """``method``'s canonical parameter record, checked (a :class:`ParameterError` naming an
    unknown parameter, with the closest one, or a bad value); needs no store."""
    unknown = sorted(set(given) - set(method.defaults))
    if unknown:
        close = difflib.get_close_matches(unknown[0], list(method.defaults), n=1)
        hint = f" (did you mean {close[0]}?)" if close else ""
        raise ParameterError(unknown[0], f"does not apply to method {method.name}{hint}")
    params = method_params(method, given)
    method.validate(params)
    return params


def method_models(store: Store, method: EncodeMethod, given: Mapping
                  ) -> tuple[dict, dict[str, Stage]]:
    """``method``'s complete parameters, checked (a ParameterError before any stage exists),
    with each model parameter (``gmm``, ``model``...) resolved to its fitted stage (the
    parameter then holds the stage's folder name, so the stage key follows the model), and
    those stages by parameter.  ``encode`` and ``extract --encode`` both go through here."""
    params = method_record(method, given)
    models = {}
    for option in method.model_options:
        if params[option]:
            models[option] = store.resolve(params[option])
            params[option] = models[option].name
    return params, models


def plan_encode(store: Store, source: Stage | str, method: str, params: Mapping | None, *,
                reporter: Reporter, create: bool = True, retried: bool = False,
                view: bool = True, source_label: str | None = None, param: str = "input"):
    """The stage of ``method`` with ``params`` on the items of ``source`` (a stage, or its
    name: resolved after the parameters are checked), planned only with ``create=False``,
    and what computes it: ``(stage, items, compute, batch size)``.

    ``featpipe encode`` and the steps run inside another stage's pass
    (:mod:`featpipe.chain`) both plan here, so a step has one key however it runs.  Items
    that failed in ``source`` are left out and listed in the key (``input_failed``), unless
    ``retried``: the pass that makes ``source`` computes them again (a fused chain is planned
    on its input as it is when every item succeeds).  An input of an item kind the method
    does not take (:mod:`featpipe.item_kinds`) is a ParameterError for ``param`` naming
    ``source_label`` (default: the name given, or its folder).
    """
    try:
        chosen = load_method(method)
    except KeyError:
        raise ParameterError("method", f"must be one of {', '.join(sorted(load_methods()))}, "
                             f"got {method!r}") from None
    params, models = method_models(store, chosen, params or {})
    label = source_label or repr(source if isinstance(source, str) else source.name)
    if isinstance(source, str):
        source = store.resolve(source)
    source_kind = item_kind(source)
    check_input(method, chosen.kinds, params, source_kind, label, param)
    if not source.items.ids:
        raise FeatpipeError(f"input stage {source.name} has no items")
    items, left_out = (source.items, []) if retried else usable_items(source, reporter)
    record = {"method": method, **params, **({"input_failed": left_out} if left_out else {})}
    inputs = [source, *models.values()]
    records = None
    if create and view and chosen.view is not None and source.exists and source.view() is None:
        # a view's record is determined by the key: written with the stage, its checksum in
        # stage.json (:func:`featpipe.store.view_bytes`; :func:`view_of` then finds it)
        planned = store.stage("encode", record, inputs=inputs, items=items, create=False)
        if not planned.exists:
            columns, extras = chosen.view(params, models)
            records = {VIEW_FILE: view_bytes(planned.name, source.name, columns, extras)}
    stage = store.stage("encode", record, inputs=inputs, items=items, create=create,
                        records=records)
    remember(stage, encoded_kind(method, chosen.kinds, params, source_kind))
    compute = EncodeCompute(source.path, method, params, {k: s.path for k, s in models.items()})
    batch = chosen.batch_size(params) if callable(chosen.batch_size) else chosen.batch_size
    return stage, items, compute, batch


def encode(store: Store, input: str, method: str, params: Mapping | None = None, *,
           name: str | None = None, options: RunOptions | None = None,
           reporter: Reporter | None = None) -> StageRun:
    """Encode every item of stage ``input`` with ``method``; returns the run.

    Items that failed in ``input`` (a run with ``on_error='skip'``) are left out and listed
    in the stage's parameters (``input_failed``).

    ``params`` holds the method's parameters (missing ones take the method's defaults); a
    model parameter (``gmm``, ``model``...) names a fitted stage of ``store``.  Every value is
    checked before the stage exists (:class:`~featpipe.errors.ParameterError`).
    """
    check_name(name)
    reporter = reporter or Reporter()
    dry_run = bool(options and options.dry_run)
    stage, items, compute, batch = plan_encode(store, input, method, params, reporter=reporter,
                                               create=not dry_run)
    if not dry_run and view_of(stage, compute):
        return _view_run(store, stage, items.ids, name, options or RunOptions(), reporter)
    run = run_stage(stage, items.ids, compute, store=store, name=name, options=options,
                    reporter=reporter, batch_size=batch,
                    work=lambda todo: input_rows(Stage(compute.input_path), todo))
    if dry_run:
        size = planned_size(stage, store.resolve(input), compute.sizing_encoder, items.ids,
                            reporter)
        run.written = [Written(stage, name, size)]
        run.nodes[0].bytes = size
    return run


def view_of(stage: Stage, compute: EncodeCompute) -> bool:
    """Make ``stage`` a view of its input when its method keeps a column range of it (the
    method's ``view``: fisher-group) and the input is stored; True when it is one."""
    method = load_method(compute.method)
    if method.view is None:
        return False
    source = Stage(compute.input_path)
    if not source.exists or source.view() is not None:
        return False
    models = {k: Stage.at(p) for k, p in compute.model_paths.items()}
    columns, extras = method.view(compute.params, models)
    stage.make_view(source, columns, extras)
    return True


def _view_run(store: Store, stage: Stage, ids, name: str | None, options: RunOptions,
              reporter: Reporter) -> StageRun:
    """A view stage: nothing to compute; its items are those its source has (a missing one
    is said, as the encode of a missing input item would fail)."""
    from featpipe.parallel import RunSummary, parse_shard
    from featpipe.stages.base import announce, settle_name

    announce(stage, name, reporter)
    source, columns, _ = stage.view()
    done = stage.done_ids()
    summary = RunSummary(skipped=len(done))
    for item_id in ids:
        if item_id not in done:
            summary.failed[item_id] = f"input not available: not computed in {source.name}"
    reporter.info(f"stage {stage.name} is a view of columns {columns.start}..{columns.stop - 1} "
                  f"of {source.name}: nothing copied")
    reporter.info(f"summary: {summary.line()}")
    for item_id, error in list(summary.failed.items())[:20]:
        reporter.error(f"failed: {item_id}: {error}")
    if parse_shard(options.shard) is None:
        settle_name(store, name, stage, ids, options.on_error, reporter)
    return StageRun(stage, summary)


def planned_size(stage: Stage, source: Stage, encoder, ids, reporter: Reporter) -> int | None:
    """A dry run's bytes at rest of ``stage`` (the encoder ``encoder()`` builds, on the items
    ``ids`` of ``source``, planned or computed: :mod:`featpipe.stages.dryrun`), said on
    ``reporter``; the planned stage records its items for the steps after it.  None when it
    cannot be sized."""
    from featpipe.extract.estimate import human_bytes
    from featpipe.stages.dryrun import (
        PlannedItems,
        affine_bytes,
        computed_example,
        encoded_example,
        source_lengths,
        total_bytes,
    )

    try:
        if source.planned_items is not None:
            planned = source.planned_items
            example, lengths = planned.example, dict(planned.frames)
        else:
            lengths = source_lengths(source, ids)
            if not lengths:
                reporter.info("dry run: size unknown (no item of the input is computed yet)")
                return None
            example, _ = computed_example(source, next(iter(lengths)))
        encoded = encoded_example(encoder(), example)
        fixed, per_frame = affine_bytes(encoded)
    except Exception as err:  # noqa: BLE001 - the run itself would say it, item by item
        reporter.info(f"dry run: size unknown ({describe_error(err)})")
        return None
    size = total_bytes(fixed, per_frame, lengths, ids)
    stage.planned_items = PlannedItems(encoded, lengths)
    reporter.info(f"dry run: about {human_bytes(size)} at rest")
    return size
