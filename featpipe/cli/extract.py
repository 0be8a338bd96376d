"""``featpipe extract``: per-frame or per-clip (VGG-16 fc6, torchvision networks) or local
(conv5_3, a torchvision map, dense SIFT, dense trajectories) features, their encoding while
they are computed (``--encode``), or a sample of them (``--sample-descriptors``).

The work is :func:`featpipe.stages.extraction.extract`; its docstring says what an item holds.
Every option is generated (:mod:`featpipe.cli.options`, precomputed): the frame sampling and
the run settings from their records' declarations (:class:`~featpipe.io.video.Sampling`,
:class:`~featpipe.extract.settings.ExtractSettings`), the feature methods' from their
estimators, and the ``--encode`` method's as ``featpipe encode``'s (less ``--device``).
"""

from __future__ import annotations

import click

from featpipe.cli.common import (
    RUN_OPTION_NAMES,
    ClickReporter,
    finish,
    item_parallel_options,
    open_store,
    run_options,
    store_option,
)
from featpipe.cli.method_help import MethodCommand
from featpipe.cli.options import (
    make_option,
    method_option_specs,
    parameter_option_specs,
    table_entry,
)
from featpipe.cli.suggest import Choice

#: the temporal encoders --temporal offers
POOLING = ("avg", "max", "tpyramid", "arp", "rankpool", "hrp", "recursive")
#: the options of --temporal
TEMPORAL_OPTIONS = ("temporal", "temporal_params", "temporal_groups", "keep_frames")

EPILOG = (
    "--dry-run prints each item's frames, rows and bytes at rest, and the CPU time; a stage "
    "too big for the store's disk is refused before it starts. Ctrl-C or SIGTERM stops "
    "cleanly (exit 130/143): finished items are kept; re-run the same command to finish.")


def check_manifest_path(ctx, param, value):
    """``--manifest``: a folder, or a video or image file, is a usage error that says how to
    make a manifest of it (labels and splits are the manifest's, which extract cannot guess;
    ``featpipe manifest build`` makes one in one command)."""
    from pathlib import Path

    path = Path(value)
    if path.is_dir():
        folder, what = path, "is a folder, not a manifest; make one of the videos in it"
    else:
        from featpipe.datasets import IMAGE_EXTENSIONS, VIDEO_EXTENSIONS

        kind = ("video" if path.suffix.lower() in VIDEO_EXTENSIONS else
                "image" if path.suffix.lower() in IMAGE_EXTENSIONS else None)
        if kind is None:
            return value
        folder = path.parent
        what = (f"is {'an' if kind == 'image' else 'a'} {kind} file, not a manifest (a CSV: "
                f"id,path,label,split1...); make one of the {kind}s in its folder")
    name = (folder.resolve().name or "items") + ".csv"
    raise click.BadParameter(f"{value} {what}: featpipe manifest build {folder} -o {name} "
                             "(labels from the parent folders; docs/data.md, Manifests), "
                             f"then extract -m {name}")


def table_source() -> dict:
    """The feature methods; the options of the sampling, the run settings and the feature
    methods; the local-feature encoders' options (``options.json``)."""
    from featpipe.encode.registry import load_methods
    from featpipe.extract.features import load_features
    from featpipe.extract.settings import LOCAL_ENCODERS, ExtractSettings
    from featpipe.io.video import Sampling
    from featpipe.parameters import record_parameters

    features = load_features()
    methods = load_methods()
    specs = method_option_specs({name: methods[name] for name in LOCAL_ENCODERS}, "encode")
    return {"features": [[m.name, m.summary] for m in features.values()],
            "sampling": parameter_option_specs(record_parameters(Sampling)),
            "settings": parameter_option_specs(record_parameters(ExtractSettings)),
            "feature_options": method_option_specs(features, "features"),
            "options": [s for s in specs if s["decls"][-1] != "device"]}


def _make_command() -> click.Command:
    entry = table_entry("extract")
    features = dict(entry["features"])
    groups = {group: [spec["decls"][-1] for spec in entry[group]]
              for group in ("sampling", "settings", "feature_options")}

    headings = (("Input and output", ("manifest_path", "store_path", "features", "name")),
                ("Frame sampling", groups["sampling"]),
                ("Extraction", groups["settings"]),
                ("Pooling over time", TEMPORAL_OPTIONS),
                ("Run", RUN_OPTION_NAMES),
                ("Output and help", ("verbose", "quiet", "log_file", "help")))

    @click.command("extract", cls=MethodCommand, selectors=("features", "encode"),
                   methods=list(features.items()), groups=headings, epilog=EPILOG,
                   methods_note="; with --encode METHOD, the encoder's too",
                   help="Decode each manifest item and store its features (or their "
                   "encoding).")
    @click.option("--manifest", "-m", "manifest_path", required=True, type=click.Path(),
                  callback=check_manifest_path, metavar="FILE",
                  help="Manifest CSV (id,path,label,split1...); `featpipe manifest build` "
                  "makes one.")
    @store_option
    @click.option("--features", "-f", required=True, type=Choice(list(features)),
                  metavar="METHOD",
                  help="Feature method (listed above).")
    @click.option("--name", "-n", default=None,
                  help="The stage's name (--temporal: NAME-GROUP).")
    @click.option("--temporal", "temporal", type=Choice(list(POOLING)), default=None,
                  metavar="METHOD", help="Pool over time in the same pass, as `encode "
                  "--method METHOD`: " + ", ".join(POOLING) + ".")
    @click.option("--temporal-param", "temporal_params", multiple=True, metavar="KEY=VALUE",
                  help="A parameter of the --temporal method (window=20); repeatable.")
    @click.option("--temporal-groups", "temporal_groups", default="all", show_default=True,
                  help="What to pool, comma-separated: 'all' (the whole per-frame vector) "
                  "and descriptor groups of a grouped --encode fisher GMM (hog,hof,mbh).")
    @click.option("--keep-frames", is_flag=True, default=False,
                  help="Write the per-frame stage too (named NAME-frames).")
    @item_parallel_options
    @click.pass_context
    def extract(ctx, manifest_path, store_path, features, name, **kwargs):
        from featpipe.extract.settings import ExtractSettings
        from featpipe.interrupts import Interrupted
        from featpipe.io.video import Sampling
        from featpipe.manifest import Manifest
        from featpipe.stages.extraction import extract as extract_stage

        options = run_options(kwargs)
        temporal, temporal_params, temporal_groups, keep_frames = (
            kwargs.pop(k) for k in ("temporal", "temporal_params", "temporal_groups",
                                    "keep_frames"))
        sampling, settings, params = ({k: kwargs.pop(k) for k in names}
                                      for names in groups.values())
        params = {k: v for k, v in params.items() if v is not None}
        encode_params = {k: v for k, v in kwargs.items() if v not in (None, ())}
        then, keep, own_name = (), None, name
        if temporal is not None:
            from featpipe.chain import parse_value, pooling_steps

            given = {}
            for text in temporal_params:
                key, sep, value = text.partition("=")
                if not sep or not key:
                    raise click.BadParameter(f"expected KEY=VALUE, got {text!r}",
                                             param_hint="--temporal-param")
                given[key.strip().replace("-", "_")] = parse_value(value.strip())
            gmm = encode_params.get("gmm") if settings.get("encode") == "fisher" else None
            then = pooling_steps(temporal, given, [g.strip() for g in temporal_groups.split(",")
                                                   if g.strip()], gmm, name)
            keep, own_name = keep_frames, f"{name}-frames" if name and keep_frames else None
        elif temporal_params or keep_frames or temporal_groups != "all":
            raise click.UsageError("--temporal-param, --temporal-groups and --keep-frames go "
                                   "with --temporal METHOD")
        settings = ExtractSettings(**settings, encode_params=encode_params, then=tuple(then),
                                   keep=keep)
        try:
            run = extract_stage(open_store(store_path), Manifest.read(manifest_path), features,
                                params=params, sampling=Sampling(**sampling), settings=settings,
                                name=own_name, options=options, reporter=ClickReporter())
        except Interrupted as err:
            click.echo(str(err), err=True)
            ctx.exit(err.exit_code)
        finish(run)

    # after --name: the sampling and the settings; after the run options: the methods'
    extract.params[4:4] = [make_option(s) for s in entry["sampling"] + entry["settings"]]
    extract.params.extend(make_option(s) for s in entry["feature_options"] + entry["options"])
    return extract


extract = _make_command()
