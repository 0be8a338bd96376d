"""``featpipe fit``: fitted models (PCA, GMM, learned encoders), one module per model."""

import click

from featpipe.cli import LazyGroup, short_helps

FIT_COMMANDS = {
    "pca": "featpipe.cli.fit_pca:fit_pca",
    "gmm": "featpipe.cli.fit_gmm:fit_gmm",
    "deep-gmm": "featpipe.cli.fit_deep_gmm:fit_deep_gmm",
    "dhrp": "featpipe.cli.fit_dhrp:fit_dhrp",
    "gmsop": "featpipe.cli.fit_gmsop:fit_gmsop",
    "standardize": "featpipe.cli.fit_standardize:fit_standardize",
}


def table_source() -> dict[str, str]:
    """The short help of each ``fit`` command (``featpipe fit --help``; ``options.json``)."""
    return short_helps(FIT_COMMANDS)


@click.group(cls=LazyGroup, lazy_commands=FIT_COMMANDS, table_key="fit commands")
def fit():
    """Fit a model on the train items of a stage (PCA, GMM, learned encoders)."""
