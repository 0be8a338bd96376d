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


def test_as_few_train_items_as_the_rows_need_same_from_the_cli_and_a_pipeline(cli, clips,
                                                                            tmp_path):
    store = tmp_path / "s"
    args = ["extract", "-m", clips / "clips.csv", "-s", store, "-f", "idt", "--descriptors",
            "hog", "--sample-descriptors", "50", "--sample-total", "120"]
    dry = cli(*args, "--dry-run", check=True)
    line = next(x for x in dry.stdout.splitlines() if x.startswith("sample: "))
    run = cli(*args, "-n", "samp", check=True)
    assert line in run.stdout  # the run takes the items the dry run printed
    stage = Store(store).resolve("samp")
    manifest = Manifest.read(clips / "clips.csv")
    order = stratified_order(manifest, 1, seed=0)
    chosen = stage.items.ids
    assert sorted(chosen) == sorted(order[:len(chosen)])  # a prefix of the order
    assert len(chosen) < len(order)  # not every train item
    assert all(manifest[i].split(1) == "train" for i in chosen)
    path = tmp_path / "p.toml"
    path.write_text(f'[steps.samp]\nstage = "extract"\nmanifest = "{clips / "clips.csv"}"\n'
                    'features = "idt"\nparams = { descriptors = "hog" }\n'
                    "sample_descriptors = 50\nsample_total = 120\n")
    again = cli("run", path, "--store", store, check=True)
    assert f"stage {stage.name} as 'samp'" in again.stdout
    assert f"summary: 0 done, {len(chosen)} skipped" in again.stdout


def test_sample_total_goes_with_sample_descriptors(cli, clips, tmp_path):
    result = cli("extract", "-m", clips / "clips.csv", "-s", tmp_path / "s", "-f", "idt",
                 "--sample-total", "10")
    assert result.exit_code == 2 and "--sample-total must be >= 1 and goes with " \
        "--sample-descriptors" in result.stderr
