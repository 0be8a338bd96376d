"""``featpipe extract``: per-frame (VGG-16 fc6) or local (conv5_3, dense SIFT) features.

The work is :func:`featpipe.stages.extraction.extract`; its docstring says what an item holds.
"""

from __future__ import annotations

import click

from featpipe.cli.common import (
    ClickReporter,
    finish,
    item_parallel_options,
    open_store,
    run_options,
    store_option,
)
from featpipe.io.video import Sampling
from featpipe.manifest import Manifest
from featpipe.stages.extraction import FEATURES
from featpipe.stages.extraction import extract as extract_stage


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}",
                                 param_hint="--sizes") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"need positive bin sizes, got {text!r}", param_hint="--sizes")
    return sizes


@click.command("extract")
@click.option("--manifest", "-m", "manifest_path", required=True,
              type=click.Path(dir_okay=False), help="Manifest CSV (id,path,label,split1...).")
@store_option
@click.option("--features", "-f", required=True, type=click.Choice(FEATURES),
              help="vgg16-fc6 (per frame), vgg16-conv5_3 or dsift (local).")
@click.option("--name", "-n", default=None, help="Name to give the stage.")
@click.option("--weights", default=None,
              help="VGG-16: torchvision's vgg16-397923af.pth, or random:SEED (tests/demos).")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]))
@click.option("--fps", type=float, default=None, help="Sample F frames per second.")
@click.option("--every", type=int, default=None, help="Keep every N-th frame.")
@click.option("--frames", "n_frames", type=int, default=None,
              help="Keep N frames evenly spaced over the video.")
@click.option("--batch-size", default=16, show_default=True, type=int,
              help="Frames per VGG-16 forward pass.")
@click.option("--dtype", default="float32", show_default=True,
              type=click.Choice(["float32", "float16"]), help="Stored array type.")
@click.option("--resize", default=256, show_default=True, type=int,
              help="VGG-16: shorter side before the centre crop.")
@click.option("--crop", default=224, show_default=True, type=int,
              help="VGG-16: centre crop size (conv5_3 gives crop/16 cells a side).")
@click.option("--sizes", default="4,6,8,10", show_default=True,
              help="dsift: bin sizes in pixels.")
@click.option("--step", default=2, show_default=True, type=int, help="dsift: grid step.")
@click.option("--magnif", default=6.0, show_default=True, type=float,
              help="dsift: smoothing sigma = size / magnif.")
@click.option("--window-size", default=1.5, show_default=True, type=float,
              help="dsift: flat-window Gaussian sigma in bins.")
@click.option("--contrast-threshold", default=None, type=float,
              help="dsift: low-contrast threshold [0.005; 0 for --engine opencv].")
@click.option("--low-contrast", default="zero", show_default=True,
              type=click.Choice(["zero", "drop"]), help="dsift: zero (VLFeat) or drop them.")
@click.option("--root-sift", is_flag=True, help="dsift: RootSIFT (L1 then square root).")
@click.option("--max-pixels", default=None, type=int,
              help="dsift: rescale larger frames to at most this many pixels.")
@click.option("--engine", default="featpipe", show_default=True,
              type=click.Choice(["featpipe", "opencv"]), help="dsift engine.")
@click.option("--positions/--no-positions", default=True, show_default=True,
              help="dsift: save x, y, size of each descriptor.")
@click.option("--pca", "pca_name", default=None,
              help="Project the features with this fitted pca stage (featpipe fit pca).")
@click.option("--decoder", default="opencv", show_default=True, help="Video decoder.")
@click.option("--decode-timeout", default=600.0, show_default=True, type=float,
              help="Seconds one item may spend decoding before its decoder is killed.")
@item_parallel_options
def extract(manifest_path, store_path, features, name, weights, device, fps, every, n_frames,
            batch_size, dtype, resize, crop, sizes, step, magnif, window_size,
            contrast_threshold, low_contrast, root_sift, max_pixels, engine, positions,
            pca_name, decoder, decode_timeout, **kwargs):
    """Decode each manifest item and store its features."""
    options = run_options(kwargs)
    dsift = {"sizes": _parse_sizes(sizes), "step": step, "magnif": magnif,
             "window_size": window_size, "contrast_threshold": contrast_threshold,
             "low_contrast": low_contrast, "root_sift": root_sift, "max_pixels": max_pixels,
             "engine": engine}
    if features != "dsift":
        dsift = None
    elif weights is not None:
        raise click.UsageError("--weights applies to vgg16-* features only")
    manifest = Manifest.read(manifest_path)
    finish(extract_stage(
        open_store(store_path), manifest, features, name=name,
        sampling=Sampling(fps=fps, every=every, frames=n_frames), weights=weights,
        device=device, batch_size=batch_size, dtype=dtype, resize=resize, crop=crop,
        dsift=dsift, positions=positions, pca=pca_name, decoder=decoder,
        decode_timeout=decode_timeout, options=options, reporter=ClickReporter()))
