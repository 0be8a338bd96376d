"""``featpipe extract``: per-frame (VGG-16 fc6) or local (conv5_3, dense SIFT) features, their
encoding while they are computed (``--encode``), or a sample of them (``--sample-descriptors``).

The work is :func:`featpipe.stages.extraction.extract`; its docstring says what an item holds.
The ``--encode`` method and its options are those of ``featpipe encode``: one registry, the
same generated options (:func:`featpipe.cli.options.method_option_specs`, precomputed), the
same checks (:func:`featpipe.stages.encoding.method_models`).
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
from featpipe.cli.options import make_option, method_option_specs, table_entry
from featpipe.flags import flag_of
from featpipe.interrupts import Interrupted
from featpipe.io.video import Sampling
from featpipe.manifest import Manifest


def table_source() -> dict:
    """The feature kinds, the local-feature encoders and their generated options (as
    ``featpipe encode``'s, less ``--device``, which extract has) (``options.json``)."""
    from featpipe.encode.registry import load_methods
    from featpipe.stages.extraction import DSIFT_FPS, FEATURES, LOCAL_ENCODERS

    methods = load_methods()
    specs = method_option_specs({name: methods[name] for name in LOCAL_ENCODERS})
    return {"features": list(FEATURES), "dsift_fps": DSIFT_FPS,
            "encoders": list(LOCAL_ENCODERS),
            "options": [s for s in specs if s["decls"][-1] != "device"]}


TABLE = table_entry("extract")


def _parse_sizes(text: str) -> list[int]:
    try:
        sizes = [int(s) for s in text.split(",") if s.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated integers, got {text!r}",
                                 param_hint="--sizes") from None
    if not sizes or min(sizes) < 1:
        raise click.BadParameter(f"need positive bin sizes, got {text!r}", param_hint="--sizes")
    return sizes


@click.command("extract", epilog=(
    "Disk: raw local features are large (dense SIFT of one 320x240 frame at step 2 is about "
    "30 MB). --dry-run prints each item's frames, rows and bytes at rest; a stage whose "
    "estimate exceeds the free space of the store's disk is refused before it starts. "
    "--encode METHOD writes only the encoding (the options of `featpipe encode --method "
    "METHOD` apply, e.g. --encode fisher --gmm G --per-frame); --sample-descriptors N keeps "
    "N rows per item for `fit pca` / `fit gmm`. Ctrl-C or SIGTERM stops cleanly (exit "
    "130/143): finished items are kept; re-run the same command to finish."))
@click.option("--manifest", "-m", "manifest_path", required=True,
              type=click.Path(dir_okay=False), help="Manifest CSV (id,path,label,split1...).")
@store_option
@click.option("--features", "-f", required=True, type=click.Choice(TABLE["features"]),
              help="vgg16-fc6 (per frame), vgg16-conv5_3 or dsift (local).")
@click.option("--name", "-n", default=None, help="Name to give the stage.")
@click.option("--weights", default=None,
              help="VGG-16: torchvision's vgg16-397923af.pth, or random:SEED (tests/demos).")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
              help="Where VGG-16 (and an --encode method with a device) runs.")
@click.option("--fps", type=float, default=None,
              help=f"Sample F frames per second [dsift on video: {TABLE['dsift_fps']:g}, since "
                   "neighbouring frames give nearly the same descriptors; others: all frames].")
@click.option("--every", type=int, default=None, help="Keep every N-th frame (1: all).")
@click.option("--frames", "n_frames", type=int, default=None,
              help="Keep N frames evenly spaced over the video.")
@click.option("--batch-size", default=16, show_default=True, type=int,
              help="Frames per VGG-16 forward pass (frames of several items share one).")
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
              help="Store x, y, scale of each local feature.")
@click.option("--pca", "pca_name", default=None,
              help="Project the features with this fitted pca stage (featpipe fit pca).")
@click.option("--encode", "encode_method", default=None, type=click.Choice(TABLE["encoders"]),
              help="Store only this encoding of the local features (as featpipe encode "
                   "--method; its options below).")
@click.option("--sample-descriptors", "sample", default=None, type=int, metavar="N",
              help="Store only N rows per item, drawn uniformly (for fit pca / fit gmm).")
@click.option("--sample-seed", default=0, show_default=True, type=int,
              help="Seed of --sample-descriptors (with the item id).")
@click.option("--allow-partial", is_flag=True,
              help="Keep truncated or damaged videos' decodable frames (warned per item) "
                   "instead of failing them.")
@click.option("--disk-check/--no-disk-check", default=True, show_default=True,
              help="Refuse a stage whose estimated size exceeds the store's free disk.")
@click.option("--decoder", default="opencv", show_default=True, help="Video decoder.")
@click.option("--decode-timeout", default=600.0, show_default=True, type=float,
              help="Seconds a decoding worker may go without a frame before it is killed.")
@item_parallel_options
@click.pass_context
def extract(ctx, manifest_path, store_path, features, name, weights, device, fps, every,
            n_frames, batch_size, dtype, resize, crop, sizes, step, magnif, window_size,
            contrast_threshold, low_contrast, root_sift, max_pixels, engine, positions,
            pca_name, encode_method, sample, sample_seed, allow_partial, disk_check, decoder,
            decode_timeout, **kwargs):
    """Decode each manifest item and store its features (or their encoding)."""
    options = run_options(kwargs)
    given = {k: v for k, v in kwargs.items() if v not in (None, ())}
    encode_params = None
    if encode_method is not None:  # checked as `featpipe encode` checks them
        encode_params = given
        from featpipe.encode.registry import load_methods

        if "device" in load_methods()[encode_method].defaults:
            encode_params["device"] = device
    elif given:
        flags = ", ".join(flag_of(k) for k in given)
        raise click.UsageError(f"{flags} applies to --encode only")
    dsift = {"sizes": _parse_sizes(sizes), "step": step, "magnif": magnif,
             "window_size": window_size, "contrast_threshold": contrast_threshold,
             "low_contrast": low_contrast, "root_sift": root_sift, "max_pixels": max_pixels,
             "engine": engine}
    if features != "dsift":
        dsift = None
    elif weights is not None:
        raise click.UsageError("--weights applies to vgg16-* features only")
    from featpipe.stages.extraction import extract as extract_stage

    manifest = Manifest.read(manifest_path)
    try:
        run = extract_stage(
            open_store(store_path), manifest, features, name=name,
            sampling=Sampling(fps=fps, every=every, frames=n_frames), weights=weights,
            device=device, batch_size=batch_size, dtype=dtype, resize=resize, crop=crop,
            dsift=dsift, positions=positions, pca=pca_name, encode=encode_method,
            encode_params=encode_params, sample=sample, sample_seed=sample_seed,
            allow_partial=allow_partial, disk_check=disk_check, decoder=decoder,
            decode_timeout=decode_timeout, options=options, reporter=ClickReporter())
    except Interrupted as err:
        click.echo(str(err), err=True)
        ctx.exit(err.exit_code)
    finish(run)


extract.params.extend(make_option(spec) for spec in TABLE["options"])
