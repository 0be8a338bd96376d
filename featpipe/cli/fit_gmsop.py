"""``featpipe fit gmsop``: train a gated mixture of second-order pooling (NeurIPS'18) on the
conv maps of the train items of one split; ``featpipe encode --method gmsop --model NAME``
then encodes every item with it.
"""

from __future__ import annotations

import click

from featpipe.cli.common import ClickReporter, open_store, store_option
from featpipe.stages.fitting import fit_gmsop as fit_gmsop_stage


@click.command("gmsop")
@store_option
@click.option("--input", "-i", "input_name", required=True,
              help="Stage of conv maps: (N, D) or (H, W, D) per image.")
@click.option("--name", "-n", default=None, help="Name to give the fitted model stage.")
@click.option("--split", default=1, show_default=True, help="Train on the train items of "
              "this split.")
@click.option("--components", default=16, show_default=True, help="Number of components M.")
@click.option("--top-k", default=8, show_default=True, help="Components mixed per image K.")
@click.option("--dim", default=32, show_default=True,
              help="Channels d after each component's projection (codes: d(d+1)/2).")
@click.option("--ns-iters", default=3, show_default=True, help="Newton-Schulz iterations.")
@click.option("--balance-weight", default=100.0, show_default=True,
              help="Weight w of the balance loss w·CV(importance)².")
@click.option("--epochs", default=30, show_default=True)
@click.option("--lr", default=0.01, show_default=True, help="Adam learning rate.")
@click.option("--batch-size", default=32, show_default=True)
@click.option("--weight-decay", default=1e-4, show_default=True)
@click.option("--seed", default=0, show_default=True)
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]))
@click.option("--force", is_flag=True, help="Refit even if this model is already fitted.")
def fit_gmsop(store_path, input_name, name, split, force, device, **params):
    """Fit GM-SOP (gated mixture of parametric second-order pooling) on conv maps."""
    fit_gmsop_stage(open_store(store_path), input_name, name=name, split=split, device=device,
                    force=force, reporter=ClickReporter(), **params)
