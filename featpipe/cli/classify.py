"""``featpipe classify``: kernels, one-vs-rest SVMs, fusion and metrics on encoded stages.

    featpipe classify --store S --input NAME [--input NAME ...] --kernel K [--kernel K ...]
                      [--fusion average] [--weights W,W] --C 1000 [--C 10,100 --cv 5]
                      --split 1|all [--metric accuracy|map] [--report REPORT.json]
                      [--name NAME]

The work is :func:`featpipe.stages.classification.classify`.  Prints one line per split and a
summary line; exit status 0 on success, 1 on a failure (bad data, missing items), 2 on a
usage error.
"""

from __future__ import annotations

import click

from featpipe.cli.common import (
    ClickReporter,
    check_jobs,
    command_line,
    open_store,
    store_option,
)
from featpipe.cli.options import table_entry
from featpipe.cli.suggest import Choice


def table_source() -> dict[str, list[str]]:
    """The choices of ``--kernel --fusion --fusion-scale --metric --ap --solver``
    (``options.json``)."""
    from featpipe.classify.experiment import METRICS, SOLVERS
    from featpipe.classify.fusion import FUSIONS, SCALES
    from featpipe.classify.kernels import KERNELS
    from featpipe.classify.metrics import AP_MODES

    return {"kernel": list(KERNELS), "fusion": list(FUSIONS), "fusion_scale": list(SCALES),
            "metric": list(METRICS),
            "ap": list(AP_MODES), "solver": list(SOLVERS)}


CHOICES = table_entry("classify")


def _numbers(values, flag: str) -> tuple[float, ...]:
    """Repeated and/or comma-separated numbers: ``--C 1 --C 10,100`` -> (1, 10, 100)."""
    out = []
    for value in values:
        for part in str(value).split(","):
            if part.strip():
                try:
                    out.append(float(part))
                except ValueError:
                    raise click.BadParameter(f"{part!r} is not a number",
                                             param_hint=flag) from None
    return tuple(out)


@click.command("classify")
@store_option
@click.option("--input", "-i", "inputs", multiple=True, required=True, metavar="NAME",
              help="Encoded stage (repeat to fuse several encodings).")
@click.option("--kernel", "-k", "kernels", multiple=True, type=Choice(CHOICES["kernel"]),
              default=("linear",), show_default=True,
              help="Kernel: one for all inputs or one per input, in --input order.")
@click.option("--fusion", default="average", show_default=True,
              type=Choice(CHOICES["fusion"]),
              help="How the per-input kernels are combined.")
@click.option("--fusion-scale", default=CHOICES["fusion_scale"][0], show_default=True,
              type=Choice(CHOICES["fusion_scale"]),
              help="How each fused kernel is scaled before the average: to a mean k(x, x) of 1 "
                   "over the train items, or as computed (docs/classify.md, Fusion).")
@click.option("--weights", default=None, metavar="W,W,...",
              help="Fusion weights, one per input (default: equal).")
@click.option("--C", "C_values", multiple=True, default=("1000",), show_default=True,
              metavar="C[,C...]", help="SVM C (libsvm's: the weight of the summed hinge loss "
                                        "against ½‖w‖²; `fit deep-gmm --C` means the same, "
                                        "with the squared hinge); several values are chosen "
                                        "among by --cv.")
@click.option("--cv", default=None, type=int,
              help="Folds of cross-validation on the train split (used with several --C) "
                   "[default: 5, or the smallest class's train count when fewer, with a "
                   "note].")
@click.option("--split", "split", default="1", show_default=True, metavar="K|all",
              help="Which split of the manifest; 'all' reports mean and std over splits.")
@click.option("--metric", default=None, type=Choice(CHOICES["metric"]),
              help="Headline metric [default: map for multi-label items, else accuracy].")
@click.option("--ap", "ap_mode", default="standard", show_default=True,
              type=Choice(CHOICES["ap"]), help="AP: non-interpolated or VOC2007 11-point.")
@click.option("--solver", default="libsvm", show_default=True,
              type=Choice(CHOICES["solver"]),
              help="libsvm on the precomputed kernel, or liblinear on explicit features "
                   "(linear, ssr, ser, chi2-map).")
@click.option("--gamma", default=None, type=float,
              help="chi2-exp γ [default: 1 / mean train chi-square distance].")
@click.option("--order", default=1, show_default=True, type=int,
              help="chi2-map: order of the homogeneous kernel map.")
@click.option("--normalize", default="l2", show_default=True, type=Choice(["l2", "none"]),
              help="L2-normalise each encoding before its kernel (what every recipe uses: "
                   "rank pooling's u* has no fixed scale), or use it as stored.")
@click.option("--jobs", "-j", default=-1, show_default=True, type=int, callback=check_jobs,
              help="Threads for the chi-square kernels (capped at the cores; -1: all cores).")
@click.option("--report", "report_path", default=None, type=click.Path(dir_okay=False),
              help="Write REPORT.json, a Markdown summary and PNG plots beside it.")
@click.option("--intersect", is_flag=True,
              help="Fuse inputs that hold different items on the items they share, saying "
                   "how many each input loses (default: refuse, naming the missing ids).")
@click.option("--name", "-n", default=None,
              help="Name to give the stage that keeps the result (`cache gc` keeps named "
                   "stages; an unnamed result is collected once it is --min-age old).")
def classify(store_path, inputs, kernels, fusion, fusion_scale, weights, C_values, cv, split,
             metric, ap_mode, solver, gamma, order, normalize, jobs, report_path, intersect,
             name):
    """Train one-vs-rest kernel SVMs on encoded items and report accuracy or mAP."""
    from featpipe.stages.classification import classify as classify_stage

    classify_stage(open_store(store_path), inputs, kernels, fusion=fusion,
                   fusion_scale=fusion_scale,
                   weights=_numbers([weights], "--weights") if weights else None,
                   C=_numbers(C_values, "--C"), cv=cv, split=split, metric=metric,
                   ap_mode=ap_mode, solver=solver, gamma=gamma, order=order,
                   normalize=normalize, jobs=jobs, report=report_path, intersect=intersect,
                   name=name, command=command_line(), reporter=ClickReporter())
