"""``featpipe fit gmm``: a diagonal GMM by EM on a seeded sample of train descriptors.

The descriptors are the arrays of the input stage's items in split 1 ``train`` (N x D per image
or per frame; (F, n, D) items are flattened).  ``--sample N`` draws N descriptors uniformly
without replacement over all of them (seeded).  ``--pca-dim D`` fits a seeded PCA
(scikit-learn, centred, not whitened) on the same sample first and stores it with the GMM, so
``encode --method fisher`` projects before encoding; ``--pca NAME`` uses a fitted PCA stage
instead (a ``featpipe fit pca`` stage; whitening is folded into the projection).
"""

from __future__ import annotations

import click

from featpipe.cli.common import ClickReporter, open_store, store_option
from featpipe.stages.fitting import fit_gmm as fit_gmm_stage


@click.command("gmm")
@store_option
@click.option("--input", "-i", "input_name", required=True, help="Descriptor stage name.")
@click.option("--name", "-n", required=True, help="Name to give the GMM stage.")
@click.option("--components", "-k", default=256, show_default=True, type=click.IntRange(1),
              help="Number of Gaussians K.")
@click.option("--pca", "pca_name", default=None, metavar="NAME", help="Fitted PCA stage.")
@click.option("--pca-dim", default=None, type=click.IntRange(1),
              help="Fit a PCA to this dimension on the sample first.")
@click.option("--sample", default=200_000, show_default=True, type=click.IntRange(1),
              help="Descriptors sampled from the train items.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--dtype", default="float64", show_default=True,
              type=click.Choice(["float32", "float64"]), help="Precision of EM.")
@click.option("--max-iter", default=100, show_default=True, type=click.IntRange(1))
@click.option("--init", default="kmeans", show_default=True,
              type=click.Choice(["kmeans", "kmeans++"]))
@click.option("--force", is_flag=True, help="Refit even if the model exists.")
def fit_gmm(store_path, input_name, name, components, pca_name, pca_dim, sample, seed, dtype,
            max_iter, init, force):
    """Fit a diagonal GMM (VLFeat conventions) on the train descriptors of a stage."""
    fit_gmm_stage(open_store(store_path), input_name, name=name, components=components,
                  pca=pca_name, pca_dim=pca_dim, sample=sample, seed=seed, dtype=dtype,
                  max_iter=max_iter, init=init, force=force, reporter=ClickReporter())
