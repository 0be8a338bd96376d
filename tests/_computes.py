"""Test-only stage: deterministic arrays per item id, an optional sleep per item, bad items.

Importable by worker processes (loky, dask, SLURM tasks) because the repository root is on
their ``PYTHONPATH``.  ``python -m tests._computes --store S --items 24 --name NAME ...`` is a
real item-parallel stage command built on :func:`featpipe.stages.base.run_stage`, so it takes
the same ``--jobs --executor --scheduler --shard --on-error`` options as ``featpipe encode``.
"""

from __future__ import annotations

import hashlib
import time
from collections.abc import Sequence

import click
import numpy as np

from featpipe.cli import FeatpipeGroup
from featpipe.cli.common import (
    ClickReporter,
    finish,
    item_parallel_options,
    open_store,
    run_options,
    store_option,
)
from featpipe.errors import ItemError
from featpipe.manifest import from_rows
from featpipe.parallel import ItemOutput
from featpipe.stages.base import run_stage
from featpipe.store import Store


def expected_array(item_id: str) -> np.ndarray:
    """The array the sleepy stage writes for ``item_id`` (a literal, seeded from the id)."""
    seed = int(hashlib.sha256(item_id.encode()).hexdigest()[:8], 16)
    rng = np.random.default_rng(seed)
    return rng.standard_normal((2 + seed % 4, 5)).astype(np.float32)


class SleepyCompute:
    """compute(ids): sleeps ``sleep`` seconds per item; ids in ``bad`` raise an ItemError."""

    def __init__(self, sleep: float = 0.0, bad: Sequence[str] = ()):
        self.sleep = sleep
        self.bad = tuple(bad)

    def __call__(self, ids):
        results = []
        for item_id in ids:
            time.sleep(self.sleep)
            if item_id in self.bad:
                results.append(ItemError(item_id, "bad test item"))
            else:
                array = expected_array(item_id)
                results.append(ItemOutput(array, {"timestamps": np.arange(len(array)) / 2.0}))
        return results


def item_ids(n: int) -> list[str]:
    return [f"video/{i:03d}" for i in range(n)]


def sleepy_stage(store: Store, n: int):
    items = from_rows([(i, f"{i}.avi", ["c"], ["train"]) for i in item_ids(n)], root=store.root)
    return store.stage("sleepy", {"n": n}, items=items)


@click.command("sleepy")
@store_option
@click.option("--items", "n_items", default=24, show_default=True, type=int)
@click.option("--name", "-n", default=None)
@click.option("--sleep", default=0.0, show_default=True, type=float,
              help="Seconds per item (not part of the stage key).")
@click.option("--bad", multiple=True, help="Item ids that fail.")
@click.option("--batch-size", default=1, show_default=True, type=int)
@item_parallel_options
def sleepy(store_path, n_items, name, sleep, bad, batch_size, **kwargs):
    store = open_store(store_path)
    stage = sleepy_stage(store, n_items)
    finish(run_stage(stage, stage.items.ids, SleepyCompute(sleep, bad), store=store, name=name,
                     options=run_options(kwargs), reporter=ClickReporter(),
                     batch_size=batch_size))


@click.group(cls=FeatpipeGroup)
def main():
    """Test stages."""


main.add_command(sleepy)

if __name__ == "__main__":
    main(prog_name="tests._computes")
