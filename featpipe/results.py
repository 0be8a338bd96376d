"""One table of classify results: ``featpipe results`` (a pipeline file's, or a whole store's).

Each result is a ``classify`` stage with its stored result (model
:data:`featpipe.stages.classification.RESULT`: the per-split scores and their summary).  Its
row holds the parameters along its chain, found by walking the stage's inputs
(:func:`featpipe.classify.report.stage_chain`, the chain a report records), then classify's
own, then the metric per split and the mean ± (population) std over the splits.  Column names
(:func:`stage_columns`):

- an encode stage's method is the column ``encode`` and its parameters ``METHOD.PARAM``
  (``hrp.window``, ``rankpool.C``); an extraction's features are ``extract`` and their
  parameters ``FEATURES.PARAM`` (``idt.step``); any other stage's ``KIND.PARAM``
  (``gmm.n_components``); a nested record's fields ``KEY.FIELD`` (``sampling.fps``);
- classify's own by their option: ``kernel``, ``C``, ``normalize``, ``fusion``, ``weights``,
  ``cv``, ``split``, ``solver``, ``gamma``, ``order``, ``ap``...;
- a name met twice in one chain (two fused encoders of one method) gets ``#2`` on its second.

A one-element list is shown as its element (``C = [1000.0]`` is ``1000``).  Only the
parameters whose values differ among the results that have them are columns (scikit-learn's
``cv_results_`` keeps one per parameter searched; DVC's ``exp show`` hides the unchanged ones);
``result`` (the stage's name, else its folder) and ``inputs`` (the classify inputs' names,
``+``-joined) always are.  Then ``metric``, ``split1``..., ``mean`` and ``std``.

Rows come sorted by the parameter columns in order (numbers as numbers, a missing value last);
:func:`sort_rows` sorts by the columns asked, the metric columns best first.
:func:`plot` draws the mean metric (± std as error bars) against one parameter, one line per
value of another and of every other parameter that varies (so no two results share a point).
"""

from __future__ import annotations

import csv
import io
import json
import math
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from featpipe.errors import FeatpipeError, ParameterError
from featpipe.reporting import Reporter
from featpipe.store import Stage, Store
from featpipe.suggest import did_you_mean

#: The parameter of a stage kind that names its method: a column of its own (``encode``).
METHOD_KEYS = {"encode": "method", "extract": "features"}
#: classify's record fields -> their column (the option's name); ``metric`` has its own.
CLASSIFY_COLUMNS = {"kernels": "kernel", "ap_mode": "ap"}
#: The columns every table has, before the parameters.
IDENTITY = ("result", "inputs")
#: The columns of the numbers, after the split columns (``split1``...).
SUMMARY = ("mean", "std")


@dataclass
class Result:
    """One classify result: its stage, label (store name, else folder), input names, the
    parameters of its chain (column -> value), metric, score per split, mean and std."""

    stage: Stage
    label: str
    inputs: list[str]
    params: dict[str, object]
    metric: str
    scores: dict[int, float]
    mean: float
    std: float


@dataclass
class Table:
    """The rows (column -> value; a missing value is absent) and the columns: identity,
    parameters, then the numbers."""

    rows: list[dict[str, object]]
    parameters: list[str]
    splits: list[str] = field(default_factory=list)

    @property
    def columns(self) -> list[str]:
        return [*IDENTITY, *self.parameters, "metric", *self.splits, *SUMMARY]

    @property
    def numbers(self) -> list[str]:
        """The columns that hold scores (sorted best first)."""
        return [*self.splits, "mean"]


def _unwrapped(value):
    """A one-element list as its element; a float that is whole stays a float."""
    if isinstance(value, list | tuple) and len(value) == 1:
        return value[0]
    return value


def _flat(prefix: str, value) -> dict[str, object]:
    """A nested record as ``prefix.field`` columns (recursively)."""
    if isinstance(value, Mapping) and value:
        out = {}
        for key, inner in value.items():
            out.update(_flat(f"{prefix}.{key}", inner))
        return out
    return {prefix: _unwrapped(value)}


def stage_columns(kind: str, params: Mapping) -> dict[str, object]:
    """The columns of one stage of a chain (module docstring)."""
    method_key = METHOD_KEYS.get(kind)
    method = params.get(method_key) if method_key else None
    label = method if isinstance(method, str) else kind
    out: dict[str, object] = {}
    if method_key in params:
        out[kind] = method
    for key, value in params.items():
        if key == method_key:
            continue
        if isinstance(value, Mapping) and value:
            out.update(_flat(key, value))
        else:
            out[f"{label}.{key}"] = _unwrapped(value)
    return out


def classify_columns(params: Mapping) -> dict[str, object]:
    """classify's own parameters by their option's name, less the metric."""
    return {CLASSIFY_COLUMNS.get(k, k): _unwrapped(v) for k, v in params.items()
            if k != "metric"}


def _add(into: dict[str, object], columns: Mapping[str, object]) -> None:
    """Add ``columns`` to ``into``; a name already there (another stage of the chain) gets
    ``#2``, ``#3``..."""
    for name, value in columns.items():
        column, n = name, 1
        while column in into:
            n += 1
            column = f"{name}#{n}"
        into[column] = value


def read_result(stage: Stage, names: Mapping[str, list[str]], reporter: Reporter) -> Result:
    """The result row of classify stage ``stage`` (``names``: the store's names of each stage
    folder); a FeatpipeError when it holds no readable result.  A chain that cannot be read
    (an input removed) is a warning: the row has classify's own parameters only."""
    from featpipe.classify.report import stage_chain
    from featpipe.stages.classification import RESULT

    if not stage.has_model(RESULT):
        raise FeatpipeError(f"classify stage {stage.name} holds no result")
    stored = stage.load_model(RESULT)[1]
    summary = stored.get("summary")
    if not isinstance(summary, Mapping) or not isinstance(stored.get("splits"), list) or \
            not {"metric", "mean", "std"} <= set(summary):
        raise FeatpipeError(f"the result of classify stage {stage.name} lacks its splits or "
                            "summary")
    label = (names.get(stage.name) or [stage.name])[0]
    params: dict[str, object] = {}
    try:
        for entry in stage_chain(stage.inputs()):
            _add(params, stage_columns(entry["kind"], entry["params"]))
    except FeatpipeError as err:
        params = {}
        reporter.warn(f"result {label}: its inputs cannot be read ({err}); its row has "
                      "classify's own parameters only")
    _add(params, classify_columns(stage.params))
    return Result(stage=stage, label=label,
                  inputs=[(names.get(f) or [f])[0] for f in stage.input_names],
                  params=params, metric=str(summary["metric"]),
                  scores={int(s["split"]): float(s["score"]) for s in stored["splits"]},
                  mean=float(summary["mean"]), std=float(summary["std"]))


def store_results(store: Store) -> list[Stage]:
    """Every classify stage of ``store`` (folder order)."""
    store.require()
    return [stage for stage in store.all_stages() if stage.kind == "classify"]


def pipeline_results(pipeline, store: Store, reporter: Reporter) -> list[Stage]:
    """The classify stages of ``pipeline``'s classify steps in ``store``, in step order: the
    stage the step's name points to; where that name is no classify stage (a classify stage
    without a name), every classify stage on the step's inputs.  A step without a result
    yet is a warning."""
    from featpipe.pipeline import renamed, resolve_references

    store.require()
    rename = resolve_references(pipeline, store, Reporter())
    names = store.names()
    every = None
    found: list[Stage] = []
    for step in pipeline.steps:
        if step.function != "classify":
            continue
        own = step.arguments.get("name") or step.name
        if names.get(own, "").startswith("classify-"):
            stages = [store.resolve(own)]
        else:
            try:
                folders = [store.resolve(n).name
                           for n in renamed(step, rename).arguments.get("inputs", [])]
            except FeatpipeError:
                folders = None
            if every is None:
                every = store_results(store)
            stages = [s for s in every if folders is not None and s.input_names == folders]
        if not stages:
            reporter.warn(f"step {step.name!r}: no result in store {store.root} yet (featpipe "
                          f"run {pipeline.path} computes it)")
        found += [s for s in stages if s not in found]
    return found


def gather(stages: Sequence[Stage], reporter: Reporter) -> list[Result]:
    """The results of ``stages``; one that cannot be read is a warning, never the end."""
    names: dict[str, list[str]] = {}
    for name, folder in (stages[0].store.names() if stages else {}).items():
        names.setdefault(folder, []).append(name)
    results = []
    for stage in stages:
        try:
            results.append(read_result(stage, names, reporter))
        except FeatpipeError as err:
            reporter.warn(f"skipped: {err}")
    return results


def cell(value) -> str:
    """A value as the table shows it: numbers by ``g`` (1000.0 is 1000), lists comma-joined,
    None as ``none``, records as compact JSON."""
    if value is None:
        return "none"
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, float):
        return f"{value:g}"
    if isinstance(value, list | tuple):
        if any(isinstance(v, Mapping | list | tuple) for v in value):
            return json.dumps(value, sort_keys=True, separators=(",", ":"))
        return ",".join(cell(v) for v in value)
    if isinstance(value, Mapping):
        return json.dumps(value, sort_keys=True, separators=(",", ":"))
    return str(value)


def _sort_value(value, descending: bool = False):
    """A key that orders numbers as numbers, before text (``descending``: numbers by their
    negation, for the metric columns)."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return (1, 0.0, cell(value))
    return (0, -value if descending else value, "")


def _sorted(rows: list[dict], column: str, descending: bool = False,
            reverse: bool = False) -> list[dict]:
    """``rows`` stably sorted by ``column``; rows without it last, whatever the order."""
    present = [r for r in rows if column in r]
    present.sort(key=lambda r: _sort_value(r[column], descending), reverse=reverse)
    return present + [r for r in rows if column not in r]


def make_table(results: Sequence[Result]) -> Table:
    """The table of ``results``: a parameter column for each parameter with two or more
    values among the results that have it, in chain order; rows sorted by those columns."""
    order: dict[str, None] = {}
    values: dict[str, set[str]] = {}
    for result in results:
        for column, value in result.params.items():
            order.setdefault(column)
            values.setdefault(column, set()).add(cell(value))
    parameters = [c for c in order if len(values[c]) > 1]
    splits = sorted({k for r in results for k in r.scores})
    rows = []
    for result in results:
        row: dict[str, object] = {"result": result.label, "inputs": "+".join(result.inputs)}
        row.update({c: result.params[c] for c in parameters if c in result.params})
        row["metric"] = result.metric
        row.update({f"split{k}": v for k, v in result.scores.items()})
        row.update({"mean": result.mean, "std": result.std})
        rows.append(row)
    for column in reversed(parameters):
        rows = _sorted(rows, column)
    return Table(rows, parameters, [f"split{k}" for k in splits])


def check_column(table: Table, column: str, option: str) -> None:
    """A :class:`ParameterError` for ``option`` when ``column`` is none of the table's."""
    if column not in table.columns:
        hint = did_you_mean(column, table.columns)
        raise ParameterError(option, f"{column!r} is not a column of this table"
                             + (f" ({hint})" if hint else "")
                             + f"; columns: {', '.join(table.columns)}")


def sort_rows(table: Table, columns: Sequence[str], reverse: bool = False) -> Table:
    """``table`` sorted by ``columns`` (the first decides, ties by the next...): parameters
    ascending, scores (``split<K>``, ``mean``) best first; ``reverse`` turns every order."""
    for column in columns:
        check_column(table, column, "sort")
    rows = list(table.rows)
    for column in reversed(columns):
        rows = _sorted(rows, column, descending=column in table.numbers, reverse=reverse)
    return Table(rows, table.parameters, table.splits)


def _number(value) -> str:
    return f"{value:.4f}" if isinstance(value, float) and math.isfinite(value) else cell(value)


def markdown(table: Table) -> str:
    """The table in Markdown: scores with 4 decimals, ``mean ± std`` in one column."""
    shown = [*IDENTITY, *table.parameters, "metric", *table.splits]
    lines = ["| " + " | ".join([*shown, "mean ± std"]) + " |",
             "|" + "---|" * (len(shown) + 1)]
    for row in table.rows:
        cells = [(_number(row[c]) if c in table.splits else cell(row[c])) if c in row else ""
                 for c in shown]
        cells.append(f"{row['mean']:.4f} ± {row['std']:.4f}")
        lines.append("| " + " | ".join(text.replace("|", "\\|") for text in cells) + " |")
    return "\n".join(lines) + "\n"


def csv_text(table: Table) -> str:
    """The table as CSV: one column each (``mean`` and ``std`` apart), numbers in full."""
    out = io.StringIO()
    writer = csv.writer(out, lineterminator="\n")
    writer.writerow(table.columns)
    for row in table.rows:
        writer.writerow([repr(row[c]) if isinstance(row.get(c), float) else
                         cell(row[c]) if c in row else "" for c in table.columns])
    return out.getvalue()


#: Output suffix -> the function writing that format.
FORMATS = {".csv": csv_text, ".md": markdown}


def check_output(path: str | Path, option: str = "output") -> None:
    """A :class:`ParameterError` for an output whose suffix is not .csv or .md."""
    if Path(path).suffix.lower() not in FORMATS:
        raise ParameterError(option, f"{str(path)!r}: the suffix picks the format; use .csv "
                             "or .md")


def write_table(table: Table, path: str | Path) -> None:
    """Write ``table`` to ``path`` (atomically) in the format of its suffix."""
    from featpipe.fileio import atomic_write_bytes, make_dirs

    check_output(path)
    path = Path(path)
    make_dirs(path.parent)
    atomic_write_bytes(path, FORMATS[path.suffix.lower()](table).encode("utf-8"))


def plot_path(table_path: str | Path, x: str) -> Path:
    """The PNG beside a table: ``TABLE.<x>.png`` (``results.hrp.window.png``)."""
    path = Path(table_path)
    safe = "".join(ch if ch.isalnum() or ch in "._-" else "_" for ch in x)
    return path.with_name(f"{path.stem}.{safe}.png")


def plot_series(table: Table, x: str, by: str | None = None
                ) -> list[tuple[str, list[tuple[object, float, float]]]]:
    """The lines of :func:`plot`: (label, [(x value, mean, std)...]) for each value of ``by``
    and of every other parameter column whose value varies among the rows that have ``x``
    (the others are left out)."""
    check_column(table, x, "plot")
    if by is not None:
        check_column(table, by, "by")
    rows = [row for row in table.rows if x in row]
    others = [c for c in table.parameters if c not in (x, by)
              and len({cell(row[c]) if c in row else None for row in rows}) > 1]
    keys = ([by] if by is not None else []) + others
    series: dict[tuple, list] = {}
    for row in rows:
        label = tuple((c, cell(row[c])) for c in keys if c in row)
        series.setdefault(label, []).append((row[x], row["mean"], row["std"]))
    return [(", ".join(f"{c}={v}" for c, v in label) or "all", points)
            for label, points in series.items()]


def plot(table: Table, x: str, path: str | Path, by: str | None = None) -> int:
    """Draw the mean metric against parameter ``x`` (error bars: the std over splits), a line
    per value of ``by`` (and of the other parameters), into the PNG ``path`` (matplotlib,
    Agg backend); returns the number of lines."""
    from featpipe.classify.report import _pyplot
    from featpipe.fileio import atomic_write_bytes

    lines = plot_series(table, x, by)
    if not lines:
        raise FeatpipeError(f"no result has a value for {x!r}: nothing to plot")
    numeric = all(isinstance(v, int | float) and not isinstance(v, bool)
                  for _, points in lines for v, _, _ in points)
    ticks = sorted({v if numeric else cell(v) for _, points in lines for v, _, _ in points},
                   key=lambda v: _sort_value(v))
    plt = _pyplot()
    fig, ax = plt.subplots(figsize=(6.4, 4.2))
    for label, points in lines:
        points = sorted(points, key=lambda p: _sort_value(p[0]))
        xs = [p[0] if numeric else ticks.index(cell(p[0])) for p in points]
        ax.errorbar(xs, [p[1] for p in points], yerr=[p[2] for p in points], marker="o",
                    capsize=3, label=label)
    if not numeric:
        ax.set_xticks(range(len(ticks)), ticks)
    metrics = sorted({str(r["metric"]) for r in table.rows})
    ax.set_xlabel(x)
    ax.set_ylabel(f"{'/'.join(metrics)} (mean over splits, bars: std)")
    if len(lines) > 1 or by is not None:
        ax.legend(fontsize=8)
    ax.grid(True, alpha=0.3)
    fig.tight_layout()
    image = io.BytesIO()
    fig.savefig(image, dpi=100, format="png")
    plt.close(fig)
    atomic_write_bytes(path, image.getvalue())
    return len(lines)
