"""``featpipe fit gmm``: a diagonal GMM by EM on a seeded sample of train descriptors.

The descriptors are the arrays of the input stage's items in split 1 ``train`` (N x D per image
or per frame; (F, n, D) items are flattened), sampled by
:func:`featpipe.stages.fitting.sample_descriptors`.  ``--pca-dim D`` fits a PCA on the same
sample first and stores it with the GMM, so ``encode --method fisher`` projects before
encoding (``--pca-fraction 0.5`` halves the dimension); ``--pca NAME`` uses a fitted PCA stage
instead (a ``featpipe fit pca`` stage; whitening is folded into the projection).  ``--groups
hog,hof,mbh`` fits one projection and one GMM per descriptor group of a dense-trajectory stage
(:mod:`featpipe.extract.groups`).  The GMM's options come from
:class:`featpipe.encode.fisher.GaussianMixtureModel`.
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
    """The generated options of ``featpipe fit gmm`` (``options.json``)."""
    from featpipe.encode.fisher import GaussianMixtureModel
    from featpipe.parameters import estimator_parameters

    parameters = estimator_parameters(GaussianMixtureModel, exclude=("chunk_size",))
    return parameter_option_specs(parameters, aliases={"n_components": "--components"})


@click.command("gmm")
@store_option
@click.option("--input", "-i", "input_name", required=True, help="Descriptor stage name.")
@click.option("--name", "-n", required=True, help="Name to give the GMM stage.")
@attach_options(table_entry("fit gmm"))
@click.option("--pca", "pca_name", default=None, metavar="NAME", help="Fitted PCA stage.")
@click.option("--pca-dim", default=None, type=int,
              help="Fit a PCA to this dimension on the sample first.")
@click.option("--pca-fraction", default=None, type=float,
              help="Fit a PCA to this fraction of the dimension (0.5 halves it) first.")
@click.option("--groups", default=None, metavar="G1,G2,...",
              help="One PCA and one GMM per descriptor group of a dense-trajectory stage "
              "(e.g. hog,hof,mbh; mbh = mbhx and mbhy).")
@click.option("--sample", default=200_000, show_default=True, type=int,
              help="Descriptors sampled from the train items.")
@click.option("--force", is_flag=True, help="Refit even if the model exists.")
@fit_dry_run_option
def fit_gmm(store_path, input_name, name, pca_name, pca_dim, pca_fraction, groups, sample, force,
            dry_run, **params):
    """Fit a diagonal GMM (VLFeat conventions) on the train descriptors of a stage."""
    from featpipe.stages.fitting import fit_gmm as fit_gmm_stage

    fit_gmm_stage(open_store(store_path), input_name, name=name, pca=pca_name,
                  pca_dim=pca_dim, pca_fraction=pca_fraction, groups=groups, sample=sample,
                  force=force, dry_run=dry_run, reporter=ClickReporter(), **params)
