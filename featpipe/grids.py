"""Grids in pipeline files: one step, several values of its parameters (an ablation).

A step's ``grid`` table lists values to sweep (TOML stays plain: every other key keeps one
value)::

    [steps.hrp]
    stage = "encode"
    input = "frames"
    method = "hrp"
    params = { psi = "ser" }
    grid = { window = [5, 10, 20], depth = [1, 2, 3] }

A key of ``grid`` is a key of the step (``C`` of a classify step, ``method``...) or of its
``params`` table (an encoder's or a feature method's parameter).  The step expands into one
step per combination (the product of the lists, in the order written), named by its values
(``hrp-window5-depth1``), and every later step that reads it expands with it
(``result-window5-depth1`` reads ``hrp-window5-depth1``); a step that reads several expanded
steps takes the combinations whose values agree (those of one grid step are one value).
Steps upstream of a grid are not repeated: a grid of encoders of one extraction computes the
extraction once (its key is one), and the fusion runs the encoders in one pass over each item.
Like Hydra's multirun or scikit-learn's ``GridSearchCV.cv_results_``, the results of a grid are
gathered into one table by ``featpipe results PIPELINE.toml`` (:mod:`featpipe.results`).
"""

from __future__ import annotations

import itertools
import re
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field

#: the key of a step's table of values to sweep
GRID_KEY = "grid"


@dataclass
class Point:
    """One combination a step runs: its name, and the values of every grid it depends on, by
    ``(grid step, key)`` (its own grid's and those of the steps it reads)."""

    name: str
    values: dict[tuple[str, str], object] = field(default_factory=dict)

    def agrees(self, other: Point) -> bool:
        return all(other.values.get(key, value) == value for key, value in self.values.items())


def combinations(grid: Mapping) -> list[dict]:
    """The product of ``grid``'s lists, in the order its keys are written."""
    keys = list(grid)
    return [dict(zip(keys, values, strict=True))
            for values in itertools.product(*(grid[key] for key in keys))]


def token(value) -> str:
    """``value`` in a step name: ``true``, ``0.1``, ``8x16`` (a list), other characters than
    letters, digits, ``.``, ``_`` and ``-`` as ``_``."""
    if isinstance(value, bool):
        text = "true" if value else "false"
    elif isinstance(value, list | tuple):
        text = "x".join(token(v) for v in value)
    else:
        text = str(value)
    return re.sub(r"[^A-Za-z0-9._-]", "_", text)


def suffix(values: Mapping[tuple[str, str], object]) -> str:
    """``window5-depth1``: each key and value of a point, the key with its grid step when two
    grid steps sweep keys of one name."""
    keys = [key for _, key in values]
    return "-".join((f"{step}.{key}" if keys.count(key) > 1 else key) + token(value)
                    for (step, key), value in values.items())


@dataclass
class Expansion:
    """The steps of a file with its grids expanded, and for each gridded step (or a step that
    reads one) the points it became, by its name in the file."""

    steps: list
    points: dict[str, list[Point]] = field(default_factory=dict)

    def grid_lines(self) -> list[str]:
        """What a dry run says of the grids: each step with a grid of its own, its values and
        the steps it expanded into."""
        lines = []
        for name, points in self.points.items():
            own = {key: [] for (step, key) in points[0].values if step == name}
            for point in points:
                for (step, key), value in point.values.items():
                    if step == name and value not in own[key]:
                        own[key].append(value)
            if own:
                sweep = " x ".join(f"{key} {', '.join(map(str, v))}" for key, v in own.items())
                lines.append(f"grid: {name} ({sweep}): {len(points)} step(s), "
                             + ", ".join(p.name for p in points))
            elif len(points) > 1:
                lines.append(f"grid: {name} expands with what it reads: {len(points)} step(s)")
        return lines


def expand(steps: Sequence, reads: Callable[[object], list[str]],
           instantiate: Callable[[object, str, dict, dict], object]) -> Expansion:
    """Expand the grids of ``steps`` (in file order; each has ``name`` and ``arguments``):
    ``reads(step)`` gives the steps it names, ``instantiate(step, name, own values, rename)``
    makes one point of it (its own grid's values set, the steps it reads renamed)."""
    points: dict[str, list[Point]] = {}
    out = []
    for step in steps:
        grid = step.arguments.get(GRID_KEY) or {}
        upstream = [name for name in dict.fromkeys(reads(step)) if name in points]
        if not grid and not upstream:
            out.append(step)
            continue
        made = []
        for chosen in itertools.product(*(points[name] for name in upstream)):
            if not all(a.agrees(b) for a, b in itertools.combinations(chosen, 2)):
                continue
            inherited = {key: value for point in chosen for key, value in point.values.items()}
            for own in combinations(grid) or [{}]:
                values = {**inherited, **{(step.name, key): v for key, v in own.items()}}
                name = f"{step.name}-{suffix(values)}" if values else step.name
                rename = {up: point.name for up, point in zip(upstream, chosen, strict=True)}
                out.append(instantiate(step, name, own, rename))
                made.append(Point(name, values))
        points[step.name] = made
    return Expansion(out, points)
