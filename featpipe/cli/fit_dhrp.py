"""``featpipe fit dhrp``: discriminative hierarchical rank pooling (seed paper section 4.4).

The work is :func:`featpipe.stages.fitting.fit_dhrp`; ``featpipe encode --method dhrp --model NAME``
applies the model.
"""

from __future__ import annotations

import click

from featpipe.cli.common import ClickReporter, open_store, store_option
from featpipe.learn.dhrp import HESSIAN_CHOICES, OPTIMIZER_CHOICES, PSI_CHOICES
from featpipe.stages.fitting import fit_dhrp as fit_dhrp_stage


@click.command("dhrp")
@store_option
@click.option("--input", "-i", "input_name", required=True,
              help="Sequence stage: per-item (T, D) arrays (e.g. encode --method hrp "
                   "--emit-layer L, or a per-frame stage).")
@click.option("--name", "-n", required=True, help="Name to give the fitted model stage.")
@click.option("--split", default=1, show_default=True, type=int,
              help="Manifest split whose train items are used (its test items are scored).")
@click.option("--psi", default="ssr", show_default=True, type=click.Choice(PSI_CHOICES),
              help="Learned non-linearity ψ(W x).")
@click.option("--delta", default=1e-3, show_default=True, type=float,
              help="Smoothing of the square root at 0 for ssr/ser: √(|z|+δ) − √δ.")
@click.option("--C", "C", default=1.0, show_default=True, type=float,
              help="Rank-pooling SVR C (liblinear's convention).")
@click.option("--epsilon", default=0.1, show_default=True, type=float,
              help="Rank-pooling SVR ε.")
@click.option("--hessian", default="exact", show_default=True,
              type=click.Choice(HESSIAN_CHOICES),
              help="Argmin gradient: exact, or the paper's diagonal approximation.")
@click.option("--optimizer", default="adam", show_default=True,
              type=click.Choice(OPTIMIZER_CHOICES), help="sgd (momentum 0.9) or adam.")
@click.option("--lr", default=0.01, show_default=True, type=float,
              help="Initial learning rate (cosine schedule to 0 over --epochs).")
@click.option("--epochs", default=50, show_default=True, type=int)
@click.option("--batch-size", default=16, show_default=True, type=int)
@click.option("--weight-decay", default=1e-4, show_default=True, type=float,
              help="λ in λ/2 (‖W − I‖² + Σ‖w_c‖²).")
@click.option("--val-fraction", default=0.2, show_default=True, type=float,
              help="Train items held out for early stopping (0: none).")
@click.option("--patience", default=10, show_default=True, type=int,
              help="Epochs without a lower validation loss before stopping.")
@click.option("--svm-C", "svm_C", default=1.0, show_default=True, type=float,
              help="C of the linear SVM that initialises the classifier.")
@click.option("--solve-dtype", default="float64", show_default=True,
              type=click.Choice(["float64", "float32"]),
              help="Precision of the Gram matrices handed to the SVR solver.")
@click.option("--seed", default=0, show_default=True, type=int)
@click.option("--device", default=None, type=click.Choice(["cpu", "cuda"]),
              help="Default: cuda when torch sees a GPU, else cpu.")
@click.option("--threads", default=None, type=int,
              help="torch CPU threads (default: torch's; 1 is often faster for these small "
                   "batched solves on a busy machine).")
@click.option("--force", is_flag=True, help="Refit even if the model exists.")
def fit_dhrp(store_path, input_name, name, split, device, threads, force, **hyper):
    """Learn ψ(W x) and a soft-max classifier through rank pooling (DHRP)."""
    fit_dhrp_stage(open_store(store_path), input_name, name=name, split=split, device=device,
                   threads=threads, force=force, reporter=ClickReporter(), **hyper)
