"""``featpipe fit deep-gmm``: learn the GMM with the SVM (deep Fisher kernel, Algorithm 1).

The work is :func:`featpipe.stages.fitting.fit_deep_gmm`; the options come from
:class:`featpipe.learn.deep_fisher.DeepFisherKernel`.  The result is a model stage usable by
``encode --method fisher --gmm`` (per-class models encode the concatenation of the per-class
FVs).
"""

from __future__ import annotations

import click

from featpipe.cli.common import (
    ClickReporter,
    fit_dry_run_option,
    open_store,
    store_option,
)
from featpipe.cli.options import attach_options, parameter_option_specs, table_entry


def table_source() -> list[dict]:
    """The generated options of ``featpipe fit deep-gmm`` (``options.json``)."""
    from featpipe.learn.deep_fisher import DeepFisherKernel
    from featpipe.parameters import estimator_parameters

    return parameter_option_specs(estimator_parameters(DeepFisherKernel, exclude=("xp",)))


@click.command("deep-gmm")
@store_option
@click.option("--input", "-i", "input_name", required=True, help="Descriptor stage name.")
@click.option("--gmm", "gmm_name", required=True, help="Initial GMM stage (`fit gmm`).")
@click.option("--name", "-n", required=True, help="Name to give the learned GMM stage.")
@attach_options(table_entry("fit deep-gmm"))
@click.option("--val-fraction", default=0.25, show_default=True, type=float,
              help="Fraction of each class's train items held out for validation (the "
                   "per-class AP report; 0 learns on all of them, with --selection last).")
@click.option("--split", default=1, show_default=True, type=int)
@click.option("--force", is_flag=True, help="Refit even if the model exists.")
@fit_dry_run_option
def fit_deep_gmm(store_path, input_name, gmm_name, name, val_fraction, split, force, dry_run,
                 **params):
    """Learn a GMM end to end with linear SVMs (Sydorov et al. CVPR'14, Algorithm 1).

    Reports the validation AP of every class and the mAP, from the SVMs of the initial and of
    the learned GMM(s), under the paper's SVM (squared hinge, no bias: its Table 2a) and under
    the SVM `classify` trains (libsvm C-SVC with a bias, linear kernel, the same C): the gain
    under the second is the one that carries over to `classify`.  --C is the C of `classify
    --C` (libsvm's: the weight of the summed loss against ½‖w‖²), here with the squared hinge
    loss; the paper writes (C/n)·Σ over n items, so its C is n times this one.  Kernel transfer
    (Table 2b): `encode --method fisher --gmm NAME`, then `classify`.
    """
    from featpipe.stages.fitting import fit_deep_gmm as fit_deep_gmm_stage

    fit_deep_gmm_stage(open_store(store_path), input_name, gmm_name, name=name,
                       val_fraction=val_fraction, split=split, force=force,
                       dry_run=dry_run, reporter=ClickReporter(), **params)
