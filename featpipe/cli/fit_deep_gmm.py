"""``featpipe fit deep-gmm``: learn the GMM with the SVM (deep Fisher kernel, Algorithm 1).

The work is :func:`featpipe.stages.fitting.fit_deep_gmm`.  The result is a model stage usable by
``encode --method fisher --gmm`` (per-class models encode the concatenation of the per-class
FVs).
"""

from __future__ import annotations

import click

from featpipe.cli.common import ClickReporter, open_store, store_option
from featpipe.learn.deep_fisher import MODES
from featpipe.stages.fitting import fit_deep_gmm as fit_deep_gmm_stage


@click.command("deep-gmm")
@store_option
@click.option("--input", "-i", "input_name", required=True, help="Descriptor stage name.")
@click.option("--gmm", "gmm_name", required=True, help="Initial GMM stage (`fit gmm`).")
@click.option("--name", "-n", required=True, help="Name to give the learned GMM stage.")
@click.option("--mode", default="shared", show_default=True, type=click.Choice(MODES),
              help="One multi-task GMM, or one GMM per class (one-vs-rest).")
@click.option("--C", "C", default=1.0, show_default=True, type=float,
              help="SVM cost C in 1/2||w||^2 + (C/n) sum sq. hinge (liblinear -c C/n).")
@click.option("--max-iter", default=20, show_default=True, type=click.IntRange(1))
@click.option("--patience", default=3, show_default=True, type=click.IntRange(1),
              help="Stop after this many iterations without a better validation score.")
@click.option("--posterior-cutoff", default=1e-5, show_default=True, type=float,
              help="Leave pairs with posterior below this out of the gradient (0 = exact).")
@click.option("--subsample", default=0.1, show_default=True, type=float,
              help="Fraction of each item's descriptors used for the gradient.")
@click.option("--val-fraction", default=0.25, show_default=True, type=float,
              help="Fraction of each class's train items held out for validation.")
@click.option("--split", default=1, show_default=True, type=click.IntRange(1))
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]))
@click.option("--dtype", default="float64", show_default=True,
              type=click.Choice(["float64", "float32"]),
              help="Precision of the FVs and gradients during learning.")
@click.option("--force", is_flag=True, help="Refit even if the model exists.")
def fit_deep_gmm(store_path, input_name, gmm_name, name, mode, C, max_iter, patience,
                 posterior_cutoff, subsample, val_fraction, split, seed, device, dtype, force):
    """Learn a GMM end to end with linear SVMs (Sydorov et al. CVPR'14, Algorithm 1)."""
    fit_deep_gmm_stage(open_store(store_path), input_name, gmm_name, name=name, mode=mode, C=C,
                       max_iter=max_iter, patience=patience, posterior_cutoff=posterior_cutoff,
                       subsample=subsample, val_fraction=val_fraction, split=split, seed=seed,
                       device=device, dtype=dtype, force=force, reporter=ClickReporter())
