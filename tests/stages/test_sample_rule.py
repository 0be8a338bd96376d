"""The sample of a GMM from as few training videos as its rows need (issue 50 §1): a seeded
order stratified by class over the train items of one split, taken until the rows expected
from the calibration reach ``--sample-total``; the same items from the command line and a
pipeline file; test items never decoded."""

from __future__ import annotations

import pytest

from featpipe.manifest import Manifest
from featpipe.stages.sample_rule import stratified_order
from featpipe.store import Store


def manifest_of(rows) -> Manifest:
    from pathlib import Path

    from featpipe.manifest import from_rows

    return from_rows([(i, f"{i}.mp4", [label], [split]) for i, label, split in rows],
                     root=Path("."))


def test_the_order_takes_one_train_item_of_each_class_in_turn_seeded():
    rows = [(f"{c}{k}", c, "train" if k < 3 else "test") for c in "abc" for k in range(5)]
    rows += [("d0", "d", "train")]
    manifest = manifest_of(rows)
    order = stratified_order(manifest, 1, seed=0)
    assert sorted(order) == sorted(i for i, _, split in rows if split == "train")
    assert [i[0] for i in order[:4]] == ["a", "b", "c", "d"]  # one of each class in turn
    assert [i[0] for i in order[4:]] == ["a", "b", "c", "a", "b", "c"]
    assert stratified_order(manifest, 1, seed=0) == order  # seeded
    others = {tuple(stratified_order(manifest, 1, seed=s)) for s in range(1, 6)}
    assert len(others | {tuple(order)}) > 1
    with pytest.raises(Exception, match="split 2 does not exist"):
        stratified_order(manifest, 2, seed=0)


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    from tests.conftest import invoke_cli as cli

    root = tmp_path_factory.mktemp("sample")
    cli("example", "clips", root / "clips", "--per-class", "3", "--frames", "20", check=True)
    cli("manifest", "build", root / "clips", "-o", root / "clips.csv", "--test-fraction",
        "0.34", "--seed", "0", check=True)
    return root


def sample_alike(cli, clips, tmp_path, name: str, **settings):
    """Extract a sample of idt's hog with ``settings`` (--sample-descriptors 50
    --sample-total 120 and these), a dry run first, then from a pipeline file with the same
    keys: the run takes the items the dry run printed, the pipeline's step finds the stage
    complete.  Returns (the stage, the dry run's output, the command's arguments)."""
    settings = {"sample_descriptors": 50, "sample_total": 120, **settings}
    store = tmp_path / "s"
    args = ["extract", "-m", clips / "clips.csv", "-s", store, "-f", "idt", "--descriptors",
            "hog", *(x for key, value in settings.items()
                     for x in ("--" + key.replace("_", "-"), str(value)))]
    dry = cli(*args, "--dry-run", check=True)
    line = next(x for x in dry.stdout.splitlines() if x.startswith("sample: "))
    run = cli(*args, "-n", name, check=True)
    assert line in run.stdout  # the run takes the items the dry run printed
    stage = Store(store).resolve(name)
    path = tmp_path / "p.toml"
    path.write_text(f'[steps.{name}]\nstage = "extract"\nmanifest = "{clips / "clips.csv"}"\n'
                    'features = "idt"\nparams = { descriptors = "hog" }\n'
                    + "".join(f"{key} = {value}\n" for key, value in settings.items()))
    again = cli("run", path, "--store", store, check=True)
    assert f"stage {stage.name} as '{name}'" in again.stdout
    assert f"summary: 0 done, {len(stage.items.ids)} skipped" in again.stdout
    return stage, dry.stdout, args


def test_as_few_train_items_as_the_rows_need_same_from_the_cli_and_a_pipeline(cli, clips,
                                                                            tmp_path):
    stage, _, _ = sample_alike(cli, clips, tmp_path, "samp")
    manifest = Manifest.read(clips / "clips.csv")
    order = stratified_order(manifest, 1, seed=0)
    chosen = stage.items.ids
    assert sorted(chosen) == sorted(order[:len(chosen)])  # a prefix of the order
    assert len(chosen) < len(order)  # not every train item
    assert all(manifest[i].split(1) == "train" for i in chosen)
    assert "window" not in stage.params["sample"]


def test_a_window_sample_is_planned_and_run_alike_from_the_cli_and_a_pipeline(cli, clips,
                                                                              tmp_path):
    """``--sample-window 8`` with the rule: the dry run takes the items the run takes, its
    frames are 8 a clip (not the clips' 20), the pipeline file's ``sample_window`` is the same
    stage; the window goes with --sample-descriptors and every frame, not --every."""
    stage, dry, args = sample_alike(cli, clips, tmp_path, "win", sample_window=8)
    assert f"about {8 * len(stage.items.ids):,} frames" in dry
    assert stage.params["sample"]["window"] == 8
    alone = cli(*args[:7], "--sample-window", "8")
    assert alone.exit_code == 2 and "--sample-window must be >= 1 and goes with " \
        "--sample-descriptors, got 8" in alone.stderr
    every = cli(*args, "--every", "2")
    assert every.exit_code == 2 and "--sample-window takes consecutive frames" in every.stderr
    boxes = cli(*args, "--human-boxes", tmp_path)
    assert boxes.exit_code == 2 and "--sample-window cannot be combined with --human-boxes" \
        in boxes.stderr


def test_sample_total_goes_with_sample_descriptors(cli, clips, tmp_path):
    result = cli("extract", "-m", clips / "clips.csv", "-s", tmp_path / "s", "-f", "idt",
                 "--sample-total", "10")
    assert result.exit_code == 2 and "--sample-total must be >= 1 and goes with " \
        "--sample-descriptors" in result.stderr


#: the train items of ``manifest_of(TWELVE)``'s split 1 and their order at seeds 0 and 7
TWELVE = [(f"{c}{k}", c, "train" if k < 4 else "test") for c in "abc" for k in range(5)]
ORDER_0 = ["a2", "b3", "c1", "a0", "b2", "c2", "a3", "b1", "c3", "a1", "b0", "c0"]
ORDER_7 = ["a2", "b2", "c1", "a1", "b3", "c2", "a3", "b0", "c0", "a0", "b1", "c3"]


def test_the_seeded_order_is_the_one_earlier_versions_took():
    """The items a sample takes are part of its stage's key: the order of a seed must never
    change between versions, or every stored sample would be recomputed under a new key
    (issue 51 §8: the hash of the class name that seeds each class's permutation)."""
    manifest = manifest_of(TWELVE)
    assert stratified_order(manifest, 1, seed=0) == ORDER_0
    assert stratified_order(manifest, 1, seed=7) == ORDER_7


class _Lines:
    def __init__(self):
        self.lines = []

    def info(self, text):
        self.lines.append(text)


@pytest.mark.parametrize("found, cap, total, taken, rows", [
    # rows expected in ORDER_0: 20, 30 (capped), 0 (no frame count), 10 (21 x 0.5 rounds to
    # even), 10...; the total reached exactly by the fifth item, in the second probe batch
    (0.5, 30, 70, 5, 70),
    (0.5, 30, 61, 5, 70),  # one row short of the first four: the fifth is taken too
    (None, 1000, 150, 4, 161),  # no rows found: factor 1 (40, 100, 0, 21)
    ("none", 1000, 150, 4, 161),  # no calibration (an error): factor 1 too
])
def test_items_are_taken_in_order_until_their_expected_rows_reach_the_total(
        monkeypatch, found, cap, total, taken, rows):
    """:func:`sample_items` against its rule worked by hand: item k of the order is expected
    to give min(cap, round(its planned rows x the rows found on the first items)), the order
    taken (across probe batches of 3) until the sum reaches the total, no item after it;
    the first CALIBRATION_ITEMS (here 2) alone are planned, probed and calibrated first, each
    on its own."""
    from types import SimpleNamespace

    from featpipe.extract.estimate import ItemEstimate
    from featpipe.extract.settings import ExtractSettings
    from featpipe.stages import sample_rule
    from featpipe.stages.calibration import Calibration

    planned = dict(zip(ORDER_0, [40, 100, None, 21] + [20] * 8, strict=True))
    probed, calibrated, plans = [], [], []

    def probe(pool, paths, ids):
        probed.append(list(ids))
        return {i: paths[i] for i in ids}

    def plan_of(items):
        plans.append(items.ids)
        return SimpleNamespace(paths={i: f"{i}.mp4" for i in items.ids}, sampling=None,
                               layout=None, todo=None, estimates=None)

    def calibrate(plan, reporter):
        calibrated.append((plan.todo, [e.item_id for e in plan.estimates]))
        return None if found == "none" else Calibration(1.0, found)

    monkeypatch.setattr(sample_rule, "PROBE_BATCH", 3)
    monkeypatch.setattr(sample_rule, "CALIBRATION_ITEMS", 2)
    monkeypatch.setattr(sample_rule, "probe_infos", probe)
    monkeypatch.setattr(sample_rule, "calibrate", calibrate)
    monkeypatch.setattr(sample_rule, "estimate_item",
                        lambda i, info, sampling, layout: ItemEstimate(i, rows=planned[i]))
    settings = ExtractSettings(sample_descriptors=cap, sample_total=total)
    reporter = _Lines()
    chosen = sample_rule.sample_items(plan_of, manifest_of(TWELVE), settings, None, reporter)
    assert sorted(chosen.ids) == sorted(ORDER_0[:taken])  # in the manifest's order
    first = sorted(ORDER_0[:2], key=[i for i, _, split in TWELVE if split == "train"].index)
    assert plans == [first]  # a plan of the two, in the manifest's order
    assert calibrated == [([item], [item]) for item in ORDER_0[:2]]
    assert probed == [ORDER_0[:2], *(ORDER_0[k:k + 3] for k in range(0, taken, 3))]
    said = "no rows planned for them" if found in (None, "none") else \
        f"{found:.2g} to {found:.2g} of the rows planned for them"
    assert reporter.lines == [
        f"sample: {taken} of the 12 train items of split 1 (a seeded order stratified by "
        f"class), about {rows:,} rows for --sample-total {total:,} (at most {cap:,} an item; "
        f"the first 2 calibrated gave {said})"]


def test_each_item_is_expected_the_mean_of_its_capped_rows_at_the_calibrated_ratios(
        monkeypatch):
    """:func:`row_ratios`: each item calibrated on its own, one whose calibration found no
    planned rows (or failed) left out; :func:`expected_rows`: the mean over the ratios of
    min(cap, round(planned x ratio)), not min(cap, planned x the mean ratio), which
    overstates where the cap binds on some items only (the rendered clips' zoom classes keep
    tens of times fewer trajectories than the others); without ratios min(cap, planned)."""
    from types import SimpleNamespace

    from featpipe.stages import sample_rule
    from featpipe.stages.calibration import Calibration

    results = {"a": Calibration(2.0, 0.05), "b": Calibration(2.0, 1.5),
               "c": Calibration(None, None), "d": None, "e": Calibration(1.0, 0.4)}
    seen = []

    def calibrate(plan, reporter):
        seen.append((plan.todo, plan.estimates))
        return results[plan.todo[0]]

    monkeypatch.setattr(sample_rule, "probe_infos", lambda pool, paths, ids: dict.fromkeys(ids))
    monkeypatch.setattr(sample_rule, "estimate_item", lambda item_id, *args: item_id * 2)
    monkeypatch.setattr(sample_rule, "calibrate", calibrate)
    plan = SimpleNamespace(paths={}, sampling=None, layout=None, todo=None, estimates=None)
    ratios = sample_rule.row_ratios(plan, list("abcde"), None)
    assert ratios == [0.05, 1.5, 0.4]
    assert seen == [([item], [item * 2]) for item in "abcde"]
    # planned 1,000 rows, at most 200: 50, 200 (1,500 capped), 200 (400 capped)
    assert sample_rule.expected_rows(1000, ratios, 200) == pytest.approx(450 / 3)
    assert sample_rule.expected_rows(1000, [sum(ratios) / 3], 200) == 200  # what it avoids
    assert sample_rule.expected_rows(30, ratios, 200) == pytest.approx((2 + 45 + 12) / 3)
    assert sample_rule.expected_rows(1000, [], 200) == 200
    assert sample_rule.expected_rows(90, [], 200) == 90
    assert sample_rule.row_ratios(plan, ["c", "d"], None) == []


def test_a_split_without_train_items_is_refused_before_any_probe():
    from featpipe.errors import FeatpipeError
    from featpipe.extract.settings import ExtractSettings
    from featpipe.stages.sample_rule import sample_items

    manifest = manifest_of([("a0", "a", "test"), ("b0", "b", "test")])
    settings = ExtractSettings(sample_descriptors=5, sample_total=10)
    with pytest.raises(FeatpipeError, match="--sample-total: split 1 has no train items"):
        sample_items(None, manifest, settings, None, _Lines())


def test_the_rows_found_scale_every_estimate_and_its_bytes():
    """Calibration.rescaled: rows x the rows found (rounded half to even), bytes recomputed
    from the frames and the new rows; items without rows kept; no rows found: unchanged."""
    from featpipe.extract.estimate import NPY_HEADER_BYTES, ItemEstimate, Layout
    from featpipe.stages.calibration import Calibration

    layout = Layout(lambda height, width: 10, dim=4, local=False)  # 16 bytes a row
    estimates = [ItemEstimate("a", 5, 5, 50, 999), ItemEstimate("b", problem="unreadable"),
                 ItemEstimate("c", 3, 3, 21, 1)]
    assert Calibration(1.0).rescaled(estimates, layout) is estimates
    assert Calibration(None, 0.5).rescaled(estimates, layout) == [
        ItemEstimate("a", 5, 5, 25, 25 * 16 + 5 * 8 + 2 * NPY_HEADER_BYTES), estimates[1],
        ItemEstimate("c", 3, 3, 10, 10 * 16 + 3 * 8 + 2 * NPY_HEADER_BYTES)]
