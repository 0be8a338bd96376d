"""What a run plans as its work (issue 47 item 4): an extraction, each item's rows from its
container (frames x rows a frame); an encode stage, its input's rows.  The run hands the plan
to its progress and records it for ``featpipe status`` while it runs, and removes the record
when it ends."""

from __future__ import annotations

import os

import numpy as np

from featpipe import stages
from featpipe.extract.dsift import DenseSIFT
from featpipe.fileio import HOST
from featpipe.io.video import Sampling
from featpipe.manifest import Manifest, from_rows
from featpipe.progress import WORK_DIR, read_work
from featpipe.stages.base import Progress, Reporter
from featpipe.store import Store
from tests.cli.test_extract_cli import write_manifest
from tests.unit.test_video import write_video


class PlanRecorder(Reporter):
    """Keeps the plan its progress was given, the record on disk (of the store's ``kind``
    stage) when the first unit came, and the units counted per item."""

    def __init__(self, store: Store, kind: str):
        self.store, self.kind = store, kind
        self.plans, self.records, self.units, self.ended = [], [], {}, []

    def progress(self, total, label, unit="items"):
        recorder = self

        class Watch(Progress):
            def plan_work(self, plan):
                recorder.plans.append(plan)

            def advance_item(self, item, n=1):
                if not recorder.records:
                    (stage,) = [s for s in recorder.store.all_stages()
                                if s.kind == recorder.kind]
                    recorder.records = read_work(stage, [f"{HOST}-{os.getpid()}"])
                recorder.units[item] = recorder.units.get(item, 0) + n

            def ended(self, item):
                recorder.ended.append(item)

        return Watch()


def test_an_extraction_plans_each_items_rows_and_records_them_while_it_runs(tmp_path):
    sizes = {"small": (48, 40), "big": (96, 80)}  # 4.6x the descriptors a frame
    for item_id, size in sizes.items():
        write_video(tmp_path / f"{item_id}.mp4", n_frames=12, size=size)
    manifest = Manifest.read(write_manifest(tmp_path, [(i, f"{i}.mp4", "a", "train")
                                                       for i in sizes]))
    store = Store(tmp_path / "s")
    reporter = PlanRecorder(store, "extract")
    params = {"sizes": [8], "step": 4}
    run = stages.extract(store, manifest, "dsift", params=params, sampling=Sampling(every=3),
                         reporter=reporter)
    assert run.ok
    (plan,) = reporter.plans
    count = DenseSIFT(**params).count
    assert plan.work == {i: 4.0 * count(h, w) for i, (w, h) in sizes.items()}  # 4 frames each
    assert plan.unit_work("big") == count(80, 96) and plan.unit == "rows"
    (record,) = reporter.records  # on disk while the items were computed
    assert dict(zip(record.ids, record.work, strict=True)) == plan.work and not record.force
    assert reporter.units == {"small": 4, "big": 4}  # frames, each with its item
    assert sorted(reporter.ended) == ["big", "small"]
    assert not list((run.stage.path / WORK_DIR).iterdir())  # gone when the run ended


def test_an_encode_plans_its_inputs_rows(tmp_path):
    lengths = {"a": 3, "b": 30, "c": 300}
    store = Store(tmp_path / "s")
    source = store.stage("import", {"test": "rows"},
                         items=from_rows([(i, "", ["x"], ["train"]) for i in lengths],
                                         tmp_path))
    for item_id, rows in lengths.items():
        source.write_item(item_id, np.ones((rows, 2), np.float32))
    store.set_name("seq", source)
    reporter = PlanRecorder(store, "encode")
    run = stages.encode(store, "seq", "avg", name="avg", reporter=reporter)
    assert run.ok
    (plan,) = reporter.plans
    assert plan.work == {i: float(n) for i, n in lengths.items()}
    (record,) = reporter.records
    assert dict(zip(record.ids, record.work, strict=True)) == plan.work
    assert not list((run.stage.path / WORK_DIR).iterdir())


def test_a_run_removes_the_records_of_runs_that_are_gone(tmp_path):
    from featpipe.progress import WorkPlan, record_work
    from featpipe.stages.base import mark_running, unmark_running

    store = Store(tmp_path / "s")
    stage = store.stage("encode", {"test": "old"},
                        items=from_rows([("a", "", ["x"], ["train"])], tmp_path))
    folder = stage.path / WORK_DIR
    folder.mkdir()
    dead = folder / f"{HOST}-{2 ** 22 + 7}.json"  # a killed process of this host
    unmarked = folder / "elsewhere-12.json"  # another host's, whose marker is gone
    marked = folder / "elsewhere-13.json"  # another host's, marked: it may still run
    for path in (dead, unmarked, marked):
        path.write_text("{}")
    (stage.path / "running").mkdir()
    (stage.path / "running" / "elsewhere-13").touch()
    mark_running(store, None, stage, WorkPlan(["a"], {"a": 1}))
    try:
        assert sorted(p.name for p in folder.iterdir()) == sorted(
            [f"{HOST}-{os.getpid()}.json", marked.name])
        record_work(stage, WorkPlan(["a"], {"a": 2}))  # a second run of this process
        (record,) = read_work(stage, [f"{HOST}-{os.getpid()}"])
        assert record.work == [2.0]
    finally:
        unmark_running(stage)
    assert [p.name for p in folder.iterdir()] == [marked.name]
