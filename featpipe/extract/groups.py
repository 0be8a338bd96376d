"""Descriptor groups: named column ranges of local-feature rows, modelled one group at a time.

A dense-trajectory row concatenates several descriptors (trajectory shape, HOG, HOF, MBHx,
MBHy: :mod:`featpipe.extract.trajectories`, ``--descriptors``).  The Fisher-vector recipe of
the improved trajectories (Wang & Schmid, ICCV'13 §4; Fernando et al., CVPR'16 §5.6) treats
each descriptor on its own: PCA halves it, a GMM of K = 256 components models it, and each
frame (or video) gets one Fisher vector per descriptor.  ``fit gmm --groups hog,hof,mbh``
fits one PCA and one GMM per group on a sample of raw rows (:func:`stage_columns` finds each
group's columns), ``extract/encode --method fisher`` with that model stage encodes each
group's columns with its own model, normalises each group's FV on its own and concatenates
them in group order, and ``encode --method fisher-group --group hog`` takes one group's part
back (:mod:`featpipe.encode.fisher_groups`).

A group named for modelling is one of the extraction's groups, or ``mbh``: MBHx and MBHy
together (one 192-value descriptor, as Wang & Schmid's experiments use it).
"""

from __future__ import annotations

from featpipe.errors import FeatpipeError, ParameterError

#: the model of a grouped fit stage (``fit pca --groups``, ``fit gmm --groups``) that lists
#: its groups and their columns (written last)
MODEL_NAME = "groups"
#: modelling names that span several of the extraction's groups
COMBINED = {"mbh": ("mbhx", "mbhy")}


def stage_columns(stage) -> dict[str, slice]:
    """The columns of each descriptor group in the raw rows of an ``extract`` stage (its
    feature method's ``groups()`` with the stage's parameters), in row order."""
    from featpipe.extract.features import load_features

    params = stage.params
    method = load_features().get(params.get("features"), None) if stage.kind == "extract" \
        else None
    estimator = None if method is None else method.build(params[method.name])
    if estimator is None or not hasattr(estimator, "groups"):
        raise FeatpipeError(f"stage {stage.name} holds no descriptor groups (groups come from "
                            "an extract stage of dense trajectories: --features dt or idt)")
    if params.get("pca") is not None or params.get("encode") is not None:
        raise FeatpipeError(f"stage {stage.name} holds "
                            + ("projected" if params.get("pca") else "encoded")
                            + " rows; descriptor groups need the raw rows (extract without "
                            "--pca/--encode, e.g. --sample-descriptors N)")
    return dict(estimator.groups())


def parse_groups(spec: str, columns: dict[str, slice]) -> list[tuple[str, slice]]:
    """The modelling groups named by ``spec`` (comma-separated, in the given order) and their
    columns among ``columns``; ``mbh`` spans mbhx and mbhy."""
    names = [name.strip().lower() for name in str(spec).split(",") if name.strip()]
    if not names:
        raise ParameterError("groups", "names no group")
    out = []
    for name in names:
        parts = COMBINED.get(name, (name,))
        missing = [p for p in parts if p not in columns]
        if missing:
            raise ParameterError("groups", f"has {name!r}, which the input does not hold (it "
                                 f"holds {', '.join(columns)})")
        first, last = columns[parts[0]], columns[parts[-1]]
        if any(columns[a].stop != columns[b].start
               for a, b in zip(parts[:-1], parts[1:], strict=True)):
            raise ParameterError("groups", f"{name!r}: its parts are not side by side")
        if name in (n for n, _ in out):
            raise ParameterError("groups", f"names {name!r} twice")
        out.append((name, slice(first.start, last.stop)))
    return out
