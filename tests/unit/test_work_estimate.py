"""The time left from the work, not the count (issue 47 item 4): a run plans each item's work
(rows), and its time left is the work left over the work done per second.

Deterministic: a fake clock, and a cost proportional to the work (a fixed number of seconds
a row), so the true time left is known exactly at every moment."""

from __future__ import annotations

import pytest

from featpipe.progress import RateEstimate, WorkEstimate, WorkPlan
from featpipe.progress_line import StatusBoard

#: (id, sampled frames, rows a frame), small items first, as a manifest often orders them
ITEMS = [("tree", 10, 100), ("megamind", 20, 400), ("vtest", 50, 2000)]
SECONDS_A_ROW = 1e-3


class FakeClock:
    def __init__(self):
        self.now = 0.0

    def __call__(self):
        return self.now


def _run(items, checkpoint):
    """Run ``items`` frame by frame on a fake clock; at every frame after the first, call
    ``checkpoint(frame number, true time left, frames display, work display, item rate)``."""
    clock = FakeClock()
    board = StatusBoard(False, -1, interval=1e9, write=lambda text: None, clock=clock)
    total_frames = sum(frames for _, frames, _ in items)
    by_frames = board.open(total_frames, "extract", "frames")
    by_work = board.open(total_frames, "extract", "frames")
    by_work.plan_work(WorkPlan([i for i, _, _ in items],
                               {i: f * r for i, f, r in items}, {i: f for i, f, _ in items}))
    by_items = RateEstimate(clock.now)
    costs = [(item_id, rows * SECONDS_A_ROW) for item_id, frames, rows in items
             for _ in range(frames)]
    for number, (item_id, seconds) in enumerate(costs, start=1):
        clock.now += seconds
        by_frames.advance(1)
        by_work.advance_item(item_id)
        if number == len(costs) or costs[number][0] != item_id:  # the item's last frame
            by_work.ended(item_id)
            by_items.add(1, clock.now)
        left = sum(s for _, s in costs[number:])
        if number < len(costs):
            checkpoint(number, left, clock.now, by_frames, by_work, by_items)


def test_big_items_last_the_count_is_off_3x_the_work_within_1_5x():
    seen = []

    def checkpoint(number, left, now, by_frames, by_work, by_items):
        work_eta = by_work.eta(now)
        assert work_eta is not None
        assert 1 / 1.5 <= work_eta / left <= 1.5, (number, work_eta, left)
        assert work_eta == pytest.approx(left, rel=1e-9)  # a cost proportional to the work
        if number == 30:  # the two small items done, the big one next
            seen.append((left, by_frames.eta(now), by_items.eta(now, len(ITEMS))))

    _run(ITEMS, checkpoint)
    (left, frames_eta, items_eta), = seen
    assert left == pytest.approx(100.0)  # 50 frames of 2,000 rows at 1 ms a row
    assert left / frames_eta >= 3  # frames counted: 50 left at the small items' 3.3/s
    assert left / items_eta >= 3  # items counted (status before): 1 left at 2 per 9 s


def test_an_item_that_ends_early_leaves_no_work_and_one_that_runs_on_costs_none():
    plan = WorkPlan(["a", "b", "c"], {"a": 100.0, "b": 100.0, "c": None},
                    {"a": 10, "b": 10, "c": None})
    assert plan.of("c") == 100.0 and plan.unit_work("c") == 10.0  # unknown: the others' mean
    assert plan.total == 300.0
    estimate = WorkEstimate(plan, 0.0)
    estimate.add(4, "a", 4.0)  # a had 4 frames, not the 10 its container declared
    assert estimate.left == pytest.approx(260.0)
    estimate.end("a")
    assert estimate.left == pytest.approx(200.0)  # its 6 frames never come
    estimate.add(14, "b", 18.0)  # b had 14: the 4 beyond its plan are not taken off twice
    assert estimate.left == pytest.approx(100.0)
    estimate.end("b")
    estimate.end("b")
    assert estimate.left == pytest.approx(100.0)
    assert estimate.eta(18.0) == pytest.approx(100.0 / (180.0 / 18.0))  # 10 units/s done


def test_without_known_work_each_item_is_one_unit():
    plan = WorkPlan(["a", "b"], {})
    assert plan.work == {"a": 1.0, "b": 1.0} and plan.total == 2.0
    estimate = WorkEstimate(plan, 0.0)
    assert estimate.eta(1.0) is None  # no figure before some work is measured
    estimate.add(1, "a", 5.0)
    assert estimate.eta(5.0) == pytest.approx(5.0)
