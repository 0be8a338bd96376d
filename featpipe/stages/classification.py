"""The ``classify`` stage: kernels, one-vs-rest SVMs, fusion and metrics on encoded stages.

Labels and splits come from the first input's items (its manifest).  One result per split,
a summary over splits, and optionally a report (JSON, Markdown, plots) beside ``report``.

The result is kept in the store as a ``classify`` stage whose key hashes the run's canonical
record (:func:`classify_record`) and its inputs' keys: its model :data:`RESULT` holds the
per-split results, the summary and when they were computed.  A rerun with the same inputs and
options trains nothing: it prints the stored result and rewrites no report file that is
already as it would write it.  A store that cannot be written still gets its result,
computed and not kept (said on stderr).  With ``name`` the stage is named as any other
(``featpipe cache gc`` keeps it, ``featpipe status NAME`` and ``cache show NAME`` find it);
an unnamed result is collected by ``gc`` once it is ``--min-age`` old.  The report records
the stage folder and its name.
"""

from __future__ import annotations

import datetime as _dt
import json
from collections.abc import Sequence
from dataclasses import replace
from numbers import Integral

from sklearn.utils._param_validation import Interval, StrOptions

from featpipe.classify.experiment import (
    DEFAULT_CV,
    METRICS,
    SOLVERS,
    Settings,
    check_solver,
    fold_count,
    run_split,
    summarise,
)
from featpipe.classify.fusion import FUSIONS, SCALES, normalised_weights
from featpipe.classify.kernels import PrecomputedKernel
from featpipe.classify.metrics import AP_MODES
from featpipe.classify.svm import OneVsRestSVC
from featpipe.errors import FeatpipeError, ParameterError, WriteError
from featpipe.fileio import check_output_path
from featpipe.item_kinds import CLASSIFY, check_input, item_kind
from featpipe.manifest import Manifest
from featpipe.parameters import check_params, typed_value
from featpipe.stages.base import Reporter, check_name, name_stage
from featpipe.store import Stage, Store

#: The model of a classify stage that holds its result (``splits``, ``summary``, ``created``).
RESULT = "result"

#: The experiment's own parameters; C, the kernels, gamma and order are checked by the SVM and
#: kernel estimators that take them.
CONSTRAINTS = {
    "fusion": [StrOptions(set(FUSIONS))],
    "fusion_scale": [StrOptions(set(SCALES))],
    "cv": [Interval(Integral, 2, None, closed="left"), None],
    "metric": [StrOptions(set(METRICS)), None],
    "ap_mode": [StrOptions(set(AP_MODES))],
    "solver": [StrOptions(set(SOLVERS))],
    "normalize": [StrOptions({"none", "l2"})],
    "jobs": [Integral],
}


def split_numbers(text: str, n_splits: int) -> list[int]:
    """``'all'`` -> every split; ``'K'`` -> [K] when the items have split K."""
    if text == "all":
        return list(range(1, n_splits + 1))
    try:
        k = int(text)
    except ValueError:
        raise ParameterError("split", f"must be a split number or 'all', got {text!r}") from None
    if not 1 <= k <= n_splits:
        raise ParameterError("split", f"{k} does not exist: the items have {n_splits} split "
                             "column(s)")
    return [k]


def classify_record(stages: Sequence[Stage], kernels: Sequence[str], fusion: str,
                    weights: Sequence[float] | None, Cs: Sequence[float], folds: Sequence[int],
                    split: str, metric: str, ap_mode: str, solver: str, gamma: float | None,
                    order: int, normalize: str, fusion_scale: str = SCALES[0]) -> dict:
    """What a classify run computes, typed as declared, every default filled: one kernel per
    input, the fusion weights normalised (none given: equal), how fused kernels are scaled
    (only when there are several: one kernel is used as computed, so its record, and key, do
    not depend on it), C and gamma floats, the cross-validation folds used (none with one C),
    the metric chosen (``map`` for multi-label items, else ``accuracy``)."""
    scaled = {"fusion_scale": fusion_scale} if len(stages) > 1 else {}
    return {"kernels": list(kernels), "fusion": fusion, **scaled,
            "weights": [float(w) for w in normalised_weights(len(stages), weights)],
            "C": [float(c) for c in Cs], "cv": sorted(set(folds)) or None,
            "split": str(split), "metric": metric, "ap_mode": ap_mode, "solver": solver,
            "gamma": typed_value(gamma, (float, None)), "order": typed_value(order, (int,)),
            "normalize": normalize}


def per_class_lines(results: Sequence[dict]) -> list[str]:
    """Per-class accuracy (correct/test items, from the confusion matrices) and AP, one line
    per class, summed (accuracy) and averaged (AP) over the splits of ``results``."""
    correct: dict[str, int] = {}
    tested: dict[str, int] = {}
    aps: dict[str, list[float]] = {}
    for result in results:
        confusion = result.get("confusion")
        for c, name in enumerate(result["classes"]):
            if confusion is not None:
                correct[name] = correct.get(name, 0) + confusion[c][c]
                tested[name] = tested.get(name, 0) + sum(confusion[c])
            if result["per_class_ap"][c] is not None:
                aps.setdefault(name, []).append(result["per_class_ap"][c])
    names = list(dict.fromkeys(n for r in results for n in r["classes"]))
    width = max(len("class"), *(len(n) for n in names))
    where = (f"split {results[0]['split']}" if len(results) == 1
             else f"{len(results)} splits: accuracy over all test items, mean AP")
    lines = [f"per class ({where}):",
             f"  {'class':<{width}}  " + ("accuracy         " if tested else "") + "AP"]
    for name in names:
        accuracy = ""
        if tested:
            n = tested.get(name, 0)
            accuracy = (f"{correct[name] / n:.4f} ({correct[name]}/{n})" if n
                        else "-").ljust(17)
        ap = f"{sum(aps[name]) / len(aps[name]):.4f}" if name in aps else "-"
        lines.append(f"  {name:<{width}}  {accuracy}{ap}")
    return lines


#: How many missing ids :func:`common_items` names per input.
SHOWN_IDS = 5


def common_items(inputs: Sequence[str], stages: Sequence[Stage], intersect: bool,
                 reporter: Reporter) -> Manifest:
    """The items to classify: the first input's manifest (labels and splits) when every
    input holds the same items.  Else an error naming, per input, how many and which of the
    others' items it lacks; with ``intersect`` the items all inputs hold, with a warning of
    how many each input loses."""
    first = stages[0].items
    held = [set(stage.items.ids) for stage in stages]
    common = set.intersection(*held)
    if all(len(ids) == len(common) for ids in held):
        return first
    every = list(dict.fromkeys(i for stage in stages for i in stage.items.ids))
    if intersect:
        for name, stage, ids in zip(inputs, stages, held, strict=True):
            if len(ids) > len(common):
                reporter.warn(f"--intersect: {len(ids) - len(common)} of the {len(ids)} items "
                              f"of input {name} ({stage.name}) are not in every input and are "
                              "left out")
        return first.subset(common)
    lacks = []
    for name, stage, ids in zip(inputs, stages, held, strict=True):
        missing = [i for i in every if i not in ids]
        if missing:
            shown = ", ".join(repr(i) for i in missing[:SHOWN_IDS])
            lacks.append(f"input {name} ({stage.name}) lacks {len(missing)} of them ({shown}"
                         + (", ..." if len(missing) > SHOWN_IDS else "") + ")")
    raise FeatpipeError(f"the fused inputs hold different items ({len(every)} in all): "
                        + "; ".join(lacks) + f"; --intersect classifies the {len(common)} "
                        "items they share")


def stored_result(stage: Stage, reporter: Reporter) -> dict | None:
    """The result a classify stage holds (:data:`RESULT`), or None when it holds none or a
    damaged one (named in a warning: it is computed again, never used)."""
    if not stage.exists or not stage.has_model(RESULT):
        return None
    try:
        result = stage.load_model(RESULT)[1]
        if {"splits", "summary", "created"} <= set(result):
            return result
        problem = f"model {RESULT!r} of stage {stage.name} lacks splits, summary or created"
    except FeatpipeError as err:
        problem = str(err)
    reporter.warn(f"{problem}; computing the result again")
    return None


def keep_result(store: Store, record: dict, inputs: Sequence[Stage], result: dict,
                reporter: Reporter) -> Stage | None:
    """Store ``result`` in the classify stage of ``record`` and ``inputs`` and return it; a
    store that cannot be written keeps nothing, with a warning (the result is printed all
    the same), and None is returned."""
    try:
        stage = store.stage("classify", record, inputs=inputs, items=Manifest([]))
        stage.save_model(RESULT, {}, result)
    except (OSError, WriteError) as err:
        reporter.warn(f"the classify result is not kept in store {store.root} "
                      f"({err}); a rerun computes it again")
        return None
    return stage


def name_result(store: Store, name: str | None, stage: Stage | None,
                reporter: Reporter) -> None:
    """Point ``name`` at the classify stage that keeps the result (:func:`name_stage`); a
    result not kept gets no name (said)."""
    if not name:
        return
    if stage is None:
        reporter.warn(f"name {name} not set: the result is not kept in the store")
        return
    try:
        name_stage(store, name, stage, reporter)
    except (OSError, WriteError) as err:
        reporter.warn(f"name {name} not set ({err})")


def check_arguments(inputs: Sequence[str], kernels: Sequence[str] = ("linear",), *,
                    fusion: str = "average", fusion_scale: str = SCALES[0],
                    weights: Sequence[float] | None = None,
                    C: Sequence[float] = (1000.0,), cv: int | None = None,
                    metric: str | None = None, ap_mode: str = "standard",
                    solver: str = "libsvm", gamma: float | None = None, order: int = 1,
                    normalize: str = "l2", jobs: int = -1, intersect: bool = False) -> None:
    """Check :func:`classify`'s values (a :class:`ParameterError` for the first bad one);
    needs no store, so ``featpipe run`` checks a pipeline's classify steps before any step."""
    check_params(CONSTRAINTS, {"fusion": fusion, "fusion_scale": fusion_scale, "cv": cv,
                               "metric": metric,
                               "ap_mode": ap_mode, "solver": solver, "normalize": normalize,
                               "jobs": jobs})
    if not isinstance(intersect, bool):
        raise ParameterError("intersect", f"must be true or false, got {intersect!r}")
    if not C:
        raise ParameterError("C", "needs at least one value")
    for value in C:
        OneVsRestSVC.check_param_values({"C": value})
    for kernel in kernels:
        PrecomputedKernel.check_param_values({"kernel": kernel, "gamma": gamma, "order": order})
    check_solver(solver, kernels)
    if weights:
        normalised_weights(len(inputs), weights)
    if len(kernels) not in (1, len(inputs)):
        raise ParameterError("kernel", f"needs one value for all inputs or one per input, got "
                             f"{len(kernels)} kernels for {len(inputs)} inputs")


def classify(store: Store, inputs: Sequence[str], kernels: Sequence[str] = ("linear",), *,
             fusion: str = "average", fusion_scale: str = SCALES[0],
             weights: Sequence[float] | None = None,
             C: Sequence[float] = (1000.0,), cv: int | None = None, split: str = "1",
             metric: str | None = None, ap_mode: str = "standard", solver: str = "libsvm",
             gamma: float | None = None, order: int = 1, normalize: str = "l2",
             jobs: int = -1, report: str | None = None, intersect: bool = False,
             name: str | None = None, command: str | None = None,
             reporter: Reporter | None = None) -> dict:
    """Train and test on each split; returns ``{"splits": [...], "summary": {...}}``.

    ``kernels`` is one kernel for all inputs or one per input; fused kernels are scaled by
    ``fusion_scale`` (:mod:`featpipe.classify.fusion`) before their weighted average; several
    ``C`` are chosen among
    by ``cv``-fold cross-validation on the train split (default 5, fewer when a class has
    fewer train items: :func:`~featpipe.classify.experiment.fold_count`); ``split`` is a
    number or ``'all'``.  Fused inputs must hold the same items (:func:`common_items`), or
    with ``intersect`` the items they share are classified.  ``normalize``: ``'l2'`` (the
    default) divides each encoding by its norm before its kernel, ``'none'`` uses it as stored.
    ``name`` names the stage that keeps the result (so ``featpipe cache gc`` keeps it).
    Every parameter is checked before any input is read (:class:`ParameterError`).
    ``command`` is the command line recorded in the report (None for a library call).
    The result (and the report) holds the run's canonical record (:func:`classify_record`)
    and its key, the hash of that record and the inputs' keys, printed as ``classify KEY``;
    the report also its stage folder (``classify-KEY``) and name.
    """
    reporter = reporter or Reporter()
    check_name(name)
    check_arguments(inputs, kernels, fusion=fusion, fusion_scale=fusion_scale,
                    weights=weights, C=C, cv=cv,
                    metric=metric, ap_mode=ap_mode, solver=solver, gamma=gamma, order=order,
                    normalize=normalize, jobs=jobs, intersect=intersect)
    kernels = tuple(kernels) * len(inputs) if len(kernels) == 1 else tuple(kernels)
    Cs = tuple(C)
    if report:
        check_output_path(report, "report", store.root)
    stages = [store.resolve(name) for name in inputs]
    for given, source in zip(inputs, stages, strict=True):
        check_input("classify", CLASSIFY, {}, item_kind(source), repr(given))
    manifest = common_items(inputs, stages, intersect, reporter)
    if len(manifest) == 0:
        raise FeatpipeError(f"input {inputs[0]!r} ({stages[0].name}) has no items (labels "
                            "and splits come from the first input's manifest)")
    if metric is None:
        metric = "map" if manifest.is_multilabel else "accuracy"
    splits = split_numbers(split, manifest.n_splits or 1)
    folds = {}
    if len(Cs) > 1:  # before any input is read: the train items' labels decide
        for k in splits:
            folds[k], note = fold_count(manifest, k, cv)
            if note:
                reporter.warn(note)
    record = classify_record(stages, kernels, fusion, weights, Cs, list(folds.values()), split,
                             metric, ap_mode, solver, gamma, order, normalize, fusion_scale)
    stage = store.stage("classify", record, inputs=stages, items=Manifest([]), create=False)
    key = stage.key
    reporter.info(f"classify {key}")

    def split_line(k: int, result: dict) -> str:
        extra = (f" ({result['n_correct']}/{result['n_test']})" if metric == "accuracy"
                 else "")
        chosen = f", C={result['C']:g} by {folds[k]}-fold cv" if len(Cs) > 1 else \
            f", C={result['C']:g}"
        return (f"split {k}: {metric} {result['score']:.4f}{extra}{chosen}, "
                f"{result['n_train']} train / {result['n_test']} test items")

    stored = stored_result(stage, reporter)
    if stored is not None:
        results, summary, created = stored["splits"], stored["summary"], stored["created"]
        reporter.info(f"reused the stored result of stage {stage.name} (computed {created}); "
                      "nothing trained")
        for k, result in zip(splits, results, strict=True):
            reporter.info(split_line(k, result))
        name_result(store, name, stage, reporter)
    else:
        settings = Settings(Cs=Cs, metric=metric, ap_mode=ap_mode, solver=solver,
                            weights=tuple(weights) if weights else None, gamma=gamma,
                            order=order, n_jobs=jobs, normalize=normalize,
                            fusion_scale=fusion_scale)
        results = []
        for k in splits:
            results.append(run_split(stages, kernels, manifest, k,
                                     replace(settings, cv=folds[k]) if k in folds
                                     else settings))
            reporter.info(split_line(k, results[-1]))
        created = _dt.datetime.now(_dt.UTC).isoformat(timespec="seconds")
        kept = json.loads(json.dumps({"splits": results, "summary": summarise(results, metric),
                                      "created": created}, sort_keys=True))
        results, summary = kept["splits"], kept["summary"]  # the form a rerun reads back
        name_result(store, name, keep_result(store, record, stages, kept, reporter), reporter)
    reporter.info(f"{metric}: {summary['mean']:.4f} ± {summary['std']:.4f} over "
                  f"{len(results)} split(s)")
    for line in per_class_lines(results):
        reporter.info(line)
    if report:
        from featpipe.classify.report import build_report, stage_chain, write_report

        used = sorted(set(folds.values())) or [cv or DEFAULT_CV]  # folds per split
        config = {"key": key, "stage": stage.name, "name": name, "params": record,
                  "store": str(store.root),
                  "inputs": list(inputs),
                  "stages": [s.name for s in stages], "kernels": list(kernels),
                  "fusion": fusion, "fusion_scale": fusion_scale if len(stages) > 1 else None,
                  "weights": list(weights) if weights else None,
                  "intersect": intersect, "n_items": len(manifest),
                  "C": list(Cs), "cv": used[0] if len(used) == 1 else used, "split": split,
                  "metric": metric, "ap": ap_mode,
                  "solver": solver, "gamma": gamma, "order": order, "normalize": normalize}
        written = write_report(report, build_report(config, results, summary,
                                                    stage_chain(stages), command, created))
        reporter.info(f"report: {', '.join(str(p) for p in written)}")
    return {"key": key, "params": record, "splits": results, "summary": summary}
