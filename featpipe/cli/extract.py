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
    """The feature methods and their generated options, the local-feature encoders and
    theirs (as ``featpipe encode``'s, less ``--device``, which extract has); list-valued
    parameters (``sizes``) by their defaults (``options.json``)."""
    from featpipe.encode.registry import load_methods
    from featpipe.extract.features import load_features
    from featpipe.stages.extraction import LOCAL_ENCODERS

    features = load_features()
    methods = load_methods()
    specs = method_option_specs({name: methods[name] for name in LOCAL_ENCODERS})
    lists = {p.name: type(p.default[0]).__name__ for m in features.values()
             for p in m.parameters if isinstance(p.default, list | tuple) and p.default}
    return {"features": [[m.name, m.summary] for m in features.values()],
            "feature_options": method_option_specs(features), "lists": lists,
            "encoders": list(LOCAL_ENCODERS),
            "options": [s for s in specs if s["decls"][-1] != "device"]}


TABLE = table_entry("extract")
FEATURE_PARAMS = [spec["decls"][-1] for spec in TABLE["feature_options"]]


def _listed(name: str, text: str) -> list:
    """A list-valued parameter from the command line: ``4,6,8`` -> [4, 6, 8]."""
    kind = {"int": int, "float": float}.get(TABLE["lists"][name], str)
    try:
        return [kind(v) for v in str(text).split(",") if v.strip()]
    except ValueError:
        raise click.BadParameter(f"expected comma-separated {TABLE['lists'][name]} values, got "
                                 f"{text!r}", param_hint=flag_of(name)) from None


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
@click.option("--features", "-f", required=True,
              type=click.Choice([name for name, _ in TABLE["features"]]),
              help="Feature method: " + "; ".join(f"{n}: {s}" for n, s in TABLE["features"])
              + ". Its options follow (each says which methods take it).")
@click.option("--name", "-n", default=None, help="Name to give the stage.")
@click.option("--device", default="cpu", show_default=True, type=click.Choice(["cpu", "cuda"]),
              help="Where VGG-16 (and an --encode method with a device) runs.")
@click.option("--fps", type=float, default=None,
              help="Sample F frames per second [dsift on video: 1, since neighbouring frames "
                   "give nearly the same descriptors; others: all frames].")
@click.option("--every", type=int, default=None, help="Keep every N-th frame (1: all).")
@click.option("--frames", "n_frames", type=int, default=None,
              help="Keep N frames evenly spaced over the video.")
@click.option("--batch-size", default=16, show_default=True, type=int,
              help="Frames per VGG-16 forward pass (frames of several items share one).")
@click.option("--dtype", default="float32", show_default=True,
              type=click.Choice(["float32", "float16"]), help="Stored array type.")
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
def extract(ctx, manifest_path, store_path, features, name, device, fps, every, n_frames,
            batch_size, dtype, positions, pca_name, encode_method, sample, sample_seed,
            allow_partial, disk_check, decoder, decode_timeout, **kwargs):
    """Decode each manifest item and store its features (or their encoding)."""
    options = run_options(kwargs)
    params = {k: kwargs.pop(k) for k in FEATURE_PARAMS if kwargs.get(k) is not None}
    params.update({k: _listed(k, v) for k, v in params.items() if k in TABLE["lists"]})
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
    from featpipe.stages.extraction import extract as extract_stage

    manifest = Manifest.read(manifest_path)
    try:
        run = extract_stage(
            open_store(store_path), manifest, features, name=name, params=params,
            sampling=Sampling(fps=fps, every=every, frames=n_frames), device=device,
            batch_size=batch_size, dtype=dtype, positions=positions, pca=pca_name,
            encode=encode_method,
            encode_params=encode_params, sample=sample, sample_seed=sample_seed,
            allow_partial=allow_partial, disk_check=disk_check, decoder=decoder,
            decode_timeout=decode_timeout, options=options, reporter=ClickReporter())
    except Interrupted as err:
        click.echo(str(err), err=True)
        ctx.exit(err.exit_code)
    finish(run)


extract.params.extend(make_option(spec) for spec in TABLE["feature_options"] + TABLE["options"])
