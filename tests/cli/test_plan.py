"""A run is one plan, checked whole before any work starts (issue 47 §1, §2, §6; issue 51 §6):
a run whose plan has a problem computes nothing and writes nothing (the store byte for byte
as it was), every problem said once, the dry run exiting 1 too; item kinds refused where a
step cannot take them, from the command line, a pipeline file and Python; the plan's sizes
are the bytes the run stores; a fused pass is one entry of `cache ls`."""

from __future__ import annotations

import os
import signal
import subprocess
import sys

import pytest

from featpipe import stages
from featpipe.errors import ParameterError
from featpipe.io.video import Sampling
from featpipe.manifest import Manifest
from featpipe.pipeline import PipelineError, load_pipeline, plan_pipeline
from featpipe.stages.dryrun import item_bytes
from featpipe.store import Store
from tests._reporter import KeptLines
from tests._stores import first_encoded, write_npy_dataset
from tests.conftest import REPO

TEMPORAL = ("avg", "max", "tpyramid", "arp", "rankpool", "hrp", "recursive")

SIFT = """[steps.sift]
stage = "extract"
manifest = "clips.csv"
features = "dsift"
params = { sizes = [8], step = 8 }
sampling = { every = 2 }
"""
PASS = SIFT + """
[steps.grid]
stage = "encode"
input = "sift"
method = "spatial-grid"
params = { grid = "2x2" }

[steps.hrp]
stage = "encode"
input = "grid"
method = "hrp"
params = { window = 4 }
"""


def tree(folder) -> dict:
    """Every file under ``folder`` with its bytes (None: no such folder)."""
    if not os.path.exists(folder):
        return None
    found = {}
    for root, _, files in os.walk(folder):
        for name in files:
            path = os.path.join(root, name)
            with open(path, "rb") as handle:
                found[os.path.relpath(path, folder)] = handle.read()
    return found


@pytest.fixture(scope="module")
def clips(tmp_path_factory):
    """Eight rendered clips of 12 frames in a manifest (half test), and a store with their
    dense SIFT as ``raw`` (descriptor sets)."""
    from tests.conftest import invoke_cli as cli

    root = tmp_path_factory.mktemp("plan")
    cli("example", "clips", root / "clips", "--per-class", "2", "--frames", "12", check=True)
    cli("manifest", "build", root / "clips", "-o", root / "clips.csv", "--test-fraction", "0.5",
        "--seed", "0", check=True)
    cli("extract", "-m", root / "clips.csv", "-s", root / "s", "-f", "dsift", "--sizes", "8",
        "--step", "8", "--every", "2", "-n", "raw", check=True)
    return root


def test_the_small_recipe_without_its_weights_changes_nothing(cli, tmp_path, monkeypatch):
    """The Table 6 recipe's small variant with the VGG-16 checkpoint missing: the run exits 1
    before its first step, naming the problem once and the way to run the rest; the store is
    byte for byte what it was (a store with a stage in it, and a store not made yet)."""
    monkeypatch.chdir(tmp_path)
    cli("example", "clips", "clips", "--per-class", "1", "--frames", "20", check=True)
    cli("manifest", "build", "clips", "-o", "ucf.csv", "--test-fraction", "0.5", "--seed", "0",
        check=True)
    recipe = cli("example", "pipeline", "trajectories", "--small", check=True).stdout
    (tmp_path / "r.toml").write_text(recipe.replace('"random:0"', '"vgg16-397923af.pth"'))
    stages.import_features(Store(tmp_path / "store"), [str(tmp_path / "npy")],
                           str(write_npy_dataset(tmp_path)), name="earlier")
    before = tree(tmp_path / "store")
    run = cli("run", "r.toml")
    assert run.exit_code == 1, run.output
    assert tree(tmp_path / "store") == before
    assert "step 1/" not in run.stdout and "stage " not in run.stdout
    assert run.stderr.count("vgg16-397923af.pth: no such file") == 1, run.stderr
    assert "problem: step 'cnn': --weights vgg16-397923af.pth: no such file" in run.stderr
    assert "nothing was computed or written" in run.stderr
    assert "run with: featpipe run r.toml --skip-blocked" in run.stderr
    fresh = cli("run", "r.toml", "--store", "new")
    assert fresh.exit_code == 1 and not (tmp_path / "new").exists()
    dry = cli("run", "r.toml", "--dry-run", "--store", "new")
    assert dry.exit_code == 1 and not (tmp_path / "new").exists()
    assert dry.stderr.count("vgg16-397923af.pth: no such file") == 1, dry.stderr


def test_a_wrong_item_kind_at_the_last_step_stops_the_run_before_it_starts(cli, clips, tmp_path,
                                                                          monkeypatch):
    """hrp on the dense SIFT descriptor sets, the last step of a pipeline whose first pass
    would take minutes on a dataset: refused before anything runs, with the way out; then
    `--skip-blocked` runs the rest, and `cache ls` shows the pass as one entry."""
    monkeypatch.chdir(clips)
    path = tmp_path / "p.toml"
    path.write_text(PASS + '\n[steps.bad]\nstage = "encode"\ninput = "sift"\nmethod = "hrp"\n')
    store = tmp_path / "s"
    run = cli("run", path, "--store", store)
    assert run.exit_code == 1 and not store.exists(), run.output
    assert ("problem: step 'bad': the extraction holds dsift sets of local descriptors (rows "
            "with their frame index); hrp pools a sequence in time order: encode each frame "
            "first") in run.stderr
    assert "the steps no problem blocks (sift, grid, hrp) run with" in run.stderr
    ran = cli("run", path, "--store", store, "--skip-blocked")
    assert ran.exit_code == 0, ran.output
    assert "not run (--skip-blocked): bad" in ran.stderr
    found = Store(store)
    assert found.resolve("hrp").is_complete() and "bad" not in found.names()
    listing = cli("cache", "ls", "-s", store, check=True).stdout
    rows = [line.split()[1] for line in listing.splitlines()[1:] if not line.startswith("pass")]
    sift, grid = (s for s in found.all_stages() if s.name != found.resolve("hrp").name)
    assert rows == [found.resolve("hrp").name]  # the pass's unwritten stages: not rows
    passes = [line for line in listing.splitlines() if line.startswith("pass ")]
    assert len(passes) == 1
    assert passes[0].startswith(f"pass {sift.name if sift.kind == 'extract' else grid.name}: "
                                f"wrote {found.resolve('hrp').name} (hrp); ran inside it "
                                "without being written: ")
    assert sift.name in passes[0] and grid.name in passes[0]


@pytest.mark.parametrize("method", TEMPORAL)
def test_every_temporal_encoder_is_refused_on_descriptor_sets(cli, clips, tmp_path, method):
    """From the command line (encode, extract --temporal), a pipeline file and Python: a
    usage error before any stage exists, naming both sides and the way out."""
    store = Store(clips / "s")
    before = sorted(p.name for p in store.stages_dir.iterdir())
    encode = cli("encode", "-s", store.root, "-i", "raw", "-m", method, "-n", "x")
    assert encode.exit_code == 2, encode.output
    assert (f"error: --input 'raw' holds dsift sets of local descriptors (rows with their frame "
            f"index); {method} pools a sequence in time order: encode each frame first "
            "(extract --encode fisher --per-frame, or spatial-grid), or use a local-descriptor "
            "encoder") in encode.stderr
    fused = cli("extract", "-m", clips / "clips.csv", "-s", store.root, "-f", "dsift", "--sizes",
                "8", "--step", "8", "--every", "2", "--temporal", method, "-n", "y")
    assert fused.exit_code == 2 and "--temporal the extraction holds dsift sets" in \
        fused.stderr, fused.output
    with pytest.raises(ParameterError, match=f"{method} pools a sequence in time order"):
        stages.encode(store, "raw", method)
    path = tmp_path / "p.toml"
    path.write_text(f'[steps.x]\nstage = "encode"\ninput = "@raw"\nmethod = "{method}"\n')
    run = cli("run", path, "--store", store.root)
    assert run.exit_code == 1 and "problem: step 'x': input '@raw' holds dsift" in run.stderr
    assert sorted(p.name for p in store.stages_dir.iterdir()) == before
    assert "x" not in store.names() and "y" not in store.names()


def test_the_meaningful_combinations_run(cli, clips):
    """A Fisher vector of each frame's descriptors then rank pooling; a spatial grid then hrp;
    second-order pooling of each frame then avg; fisher over a whole item (a vector)."""
    store = clips / "s"
    cli("fit", "gmm", "-s", store, "-i", "raw", "-n", "g", "--n-components", "2", "--max-iter",
        "3", check=True)
    cli("encode", "-s", store, "-i", "raw", "-m", "fisher", "--gmm", "g", "--per-frame", "-n",
        "fv", check=True)
    cli("encode", "-s", store, "-i", "fv", "-m", "rankpool", "-n", "rp", check=True)
    cli("encode", "-s", store, "-i", "raw", "-m", "spatial-grid", "--grid", "2x2", "-n", "grid",
        check=True)
    cli("encode", "-s", store, "-i", "grid", "-m", "hrp", "--window", "3", "-n", "hrp",
        check=True)
    cli("encode", "-s", store, "-i", "raw", "-m", "cbp-ts", "--dim", "64", "-n", "sop",
        check=True)
    cli("encode", "-s", store, "-i", "sop", "-m", "avg", "-n", "sop-avg", check=True)
    cli("encode", "-s", store, "-i", "raw", "-m", "fisher", "--gmm", "g", "-n", "fv1",
        check=True)
    found = Store(store)
    first = found.resolve("raw").items.ids[0]
    assert found.resolve("fv").read_item(first).ndim == 2  # a sequence of per-frame FVs
    for name in ("rp", "hrp", "sop-avg", "fv1"):
        assert found.resolve(name).read_item(first).ndim == 1, name
    refused = cli("encode", "-s", store, "-i", "fv1", "-m", "rankpool")
    assert refused.exit_code == 2 and "there is no time axis left to pool" in refused.stderr
    result = cli("classify", "-s", store, "-i", "raw")
    assert result.exit_code == 2, result.output
    assert ("'raw' holds dsift sets of local descriptors (rows with their frame index); "
            "classify trains on one vector per item: encode the descriptors first") in \
        result.stderr


def kinds_table() -> dict[str, dict[str, str]]:
    """docs/encoders.md's item-kind table: method -> {input kind: what it makes, or '-'}."""
    text = (REPO / "docs" / "encoders.md").read_text(encoding="utf-8")
    section = text.split("## Item kinds")[1]
    lines = [line for line in section.splitlines() if line.startswith("|")]
    header = [cell.strip() for cell in lines[0].strip("|").split("|")]
    table = {}
    for line in lines[2:]:
        cells = [cell.strip().strip("`") for cell in line.strip("|").split("|")]
        table[cells[0]] = dict(zip(header[1:], cells[1:], strict=True))
    return table


def test_the_docs_table_says_what_every_encoder_takes_and_makes():
    """Every cell of docs/encoders.md's table is what the encoder declares (issue 47 §2)."""
    from featpipe.encode.registry import load_methods
    from featpipe.item_kinds import ITEM_KINDS, ItemKind, encoded_kind

    table = kinds_table()
    methods = load_methods()
    assert set(table) == {name for name in methods} | {"fisher --per-frame"}
    for row, cells in table.items():
        name, _, flag = row.partition(" ")
        kinds = methods[name].kinds
        params = {"per_frame": True} if flag else {}
        for kind in ITEM_KINDS:
            taken = kind in kinds.taken(params)
            made = encoded_kind(name, kinds, params, ItemKind(kind)) if taken else None
            assert cells[kind] == (made.kind if made else "-"), (row, kind, cells[kind])


def test_the_dry_run_sizes_each_stage_as_the_run_stores_it(cli, clips, tmp_path, monkeypatch):
    """Issue 51 §8 (the dry run's sizing): every written stage of a pass (the extraction kept,
    a per-frame encoding kept, the pooled vectors, a Fisher vector) is planned at the bytes
    its items take once computed (arrays and sidecars with their headers), to the byte."""
    monkeypatch.chdir(clips)
    path = tmp_path / "p.toml"
    path.write_text(PASS.replace("[steps.grid]", "[steps.grid]\nkeep = true")
                    .replace("[steps.sift]", "[steps.sift]\nkeep = true") +
                    '\n[steps.fv]\nstage = "encode"\ninput = "sift"\nmethod = "fisher"\n'
                    'params = { gmm = "@g" }\n')
    store = Store(tmp_path / "s")
    stages.extract(store, Manifest.read(clips / "clips.csv"), "dsift",
                   params={"sizes": [8], "step": 8}, sampling=Sampling(every=3), name="other")
    stages.fit_gmm(store, "other", name="g", n_components=2, max_iter=3)
    plan = plan_pipeline(load_pipeline(path), store)
    assert not plan.problems, plan.problems
    planned = {node.stage: node.bytes for node in plan.nodes if node.written}
    cli("run", path, "--store", store.root, check=True)
    assert len(planned) == 4, planned  # sift, grid, hrp, fv
    for folder, size in planned.items():
        stage = store.stage_by_folder(folder)
        stored = sum(item_bytes(stage.read_item(i), stage.extras_of(i)) for i in stage.items.ids)
        assert size == stored, (folder, size, stored)


def test_one_key_planned_by_two_steps_is_one_node(cli, clips, tmp_path, monkeypatch):
    monkeypatch.chdir(clips)
    path = tmp_path / "p.toml"
    path.write_text(SIFT + SIFT.replace("[steps.sift]", "[steps.again]"))
    dry = cli("run", path, "--store", tmp_path / "s", "--dry-run")
    assert dry.exit_code == 0, dry.output
    assert "dry run: total 1 stages (1 written)" in dry.stdout


def test_names_and_keep_are_checked_when_the_file_is_read(tmp_path):
    path = tmp_path / "p.toml"
    path.write_text(SIFT + '\n[steps.avg]\nstage = "encode"\ninput = "sift"\nmethod = "avg"\n'
                    'name = "no/slash"\n')
    with pytest.raises(PipelineError, match="step 'avg' .encode.: name must be letters"):
        load_pipeline(path)
    path.write_text(SIFT + '\n[steps.avg]\nstage = "encode"\ninput = "sift"\nmethod = "avg"\n'
                    'keep = "false"\n')
    with pytest.raises(PipelineError, match="keep must be true or false .a TOML boolean"):
        load_pipeline(path)


def test_sigterm_stops_a_pipeline_like_every_command(tmp_path):
    """SIGTERM while a step computes: one `interrupted` line and exit 143 (not 1), the items
    done kept."""
    manifest = write_npy_dataset(tmp_path)
    path = tmp_path / "p.toml"
    path.write_text(f'[steps.frames]\nstage = "import_features"\nsources = ["{tmp_path / "npy"}"]'
                    f'\nmanifest_path = "{manifest}"\n\n[steps.mean]\nstage = "encode"\n'
                    'input = "frames"\nmethod = "slow-mean"\n')
    env = dict(os.environ, PYTHONPATH=str(REPO), FEATPIPE_ENCODERS="tests._slow_mean")
    proc = subprocess.Popen([sys.executable, "-m", "featpipe", "run", str(path), "--store",
                             str(tmp_path / "s")], env=env, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    stage = first_encoded(Store(tmp_path / "s"), proc)
    proc.send_signal(signal.SIGTERM)
    out, err = proc.communicate(timeout=60)
    assert proc.returncode == 143, (out, err)
    assert [line for line in err.splitlines() if line.startswith("interrupted")], err
    assert "error:" not in err
    assert stage.done_ids()



def test_cpu_text_switches_units_at_a_minute_and_an_hour():
    from featpipe.plan import cpu_text

    assert cpu_text(59.4) == "59 s"
    assert cpu_text(60) == "1.0 min" and cpu_text(3599) == "60.0 min"
    assert cpu_text(3600) == "1.0 h" and cpu_text(90, "hours", "minutes") == "1.5 minutes"
    assert cpu_text(36_000_000, "hours", "minutes") == "10,000.0 hours"


def test_one_stage_planned_twice_is_one_node_written_if_either_writes_it():
    """Plan.add (issue 51 §6, the dry run counting one stage twice): the same stage from a
    second step is the first node, written (with the second's name) when the second writes
    it; classify results (no key before they run) are never merged."""
    from featpipe.plan import Node, Plan

    plan = Plan()
    plan.add(Node("sift", "extract-aa", "extract", written=False, bytes=5))
    plan.add(Node("again", "extract-aa", "extract", name="kept", bytes=5))
    plan.add(Node("enc", "encode-bb", "encode", name="e", bytes=7))
    plan.add(Node("twin", "encode-bb", "encode", name="other", written=False))
    plan.add(Node("unnamed", "encode-bb", "encode", bytes=7))
    plan.add(Node("c1", "classify", "classify"))
    plan.add(Node("c2", "classify", "classify"))
    assert [(n.step, n.written, n.name) for n in plan.nodes] == [
        ("sift", True, "kept"), ("enc", True, "e"), ("c1", True, None), ("c2", True, None)]
    plan = Plan()
    plan.add(Node("sift", "extract-aa", "extract", name="raw", written=False))
    plan.add(Node("again", "extract-aa", "extract"))  # written, without a name of its own
    assert [(n.written, n.name) for n in plan.nodes] == [(True, "raw")]
    assert plan.at_rest() == (0, 1) and plan.cpu() == 0.0


def test_each_problem_is_said_once_and_blocks_every_step_that_reads_its_step(tmp_path,
                                                                            monkeypatch):
    """Problems: one per (step, text); the steps blocked, through readers listed before the
    steps they read; the disk's problem at what the plan writes against the free space, a
    store that cannot be written in featpipe's words."""
    from types import SimpleNamespace

    from featpipe import plan as plan_module
    from featpipe.errors import FeatpipeError
    from featpipe.plan import Node, Plan, Problem

    plan = Plan(steps=["d", "c", "b", "a", "e"], reads={"d": {"c"}, "c": {"b"}, "b": {"a"}})
    for step, text in [("a", "no file"), ("a", "no file"), ("a", "bad"), ("e", "no file"),
                       ("", "disk")]:
        plan.problem(step, text)
    assert [str(p) for p in plan.problems] == ["step 'a': no file", "step 'a': bad",
                                               "step 'e': no file", "disk"]
    assert str(Problem("", "the store is read-only")) == "the store is read-only"
    assert plan.blocked_steps() == {"a": "a", "e": "e", "b": "a", "c": "a", "d": "a"}
    plan = Plan()
    plan.add(Node("x", "extract-aa", "extract", bytes=600))
    plan.add(Node("y", "encode-bb", "encode", bytes=400))
    plan.add(Node("z", "encode-cc", "encode", bytes=10**9, written=False))
    monkeypatch.setattr(plan_module, "free_bytes", lambda root: 1000)
    plan.check_disk(SimpleNamespace(root=tmp_path))  # exactly what is free: it fits
    assert plan.problems == [] and plan.at_rest() == (1000, 0)
    monkeypatch.setattr(plan_module, "free_bytes", lambda root: 999)
    plan.check_disk(SimpleNamespace(root=tmp_path))
    assert [str(p) for p in plan.problems] == [
        "the plan needs about 1.0 kB at rest but the store's disk has 999 B free: sample fewer "
        "frames (--fps/--every/--frames), encode while extracting, keep fewer stages, or free "
        "space"]

    def read_only():
        raise FeatpipeError("store s is read-only")

    plan.check_writable(SimpleNamespace(check_writable=lambda: None))
    assert len(plan.problems) == 1
    plan.check_writable(SimpleNamespace(check_writable=read_only))
    assert str(plan.problems[-1]) == "store s is read-only"


def test_the_printed_plan_puts_a_pass_under_its_heading_and_says_what_waits():
    """print_plan: a line per node (a pass's nodes indented under its heading, said again
    when the pass resumes after other nodes; 'not written', '?' unsized, '-' no items or
    kind), the steps planned later, those a problem blocks, the totals, each problem."""
    from featpipe.plan import Node, Plan, print_plan

    plan = Plan(steps=["sift", "hrp", "result", "bad", "after", "later"],
                reads={"hrp": {"sift"}, "result": {"hrp"}, "after": {"bad"}},
                unplanned={"later": "it reads a model that step 'hrp' fits"})
    plan.add(Node("sift", "extract-aa", "extract", item_kind="descriptors", items=8,
                  cpu=4000.0, written=False, pass_step="sift"))
    plan.add(Node("hrp", "encode-bb", "encode", name="pooled", item_kind="vector", items=8,
                  bytes=2048, pass_step="sift"))
    plan.add(Node("result", "classify", "classify", name="scores", items="-"))
    plan.add(Node("", "import-cc", "import"))
    plan.add(Node("grid", "encode-dd", "encode", name="grid", item_kind="sequence", items=8,
                  bytes=1_500_000, cpu=30.0, pass_step="sift"))
    plan.problem("bad", "--weights w.pth: no such file")
    plan.problem("", "the store is read-only")
    reporter = KeptLines()
    print_plan(plan, reporter, "dry run of p.toml")
    heading = ("  pass of step 'sift' (one decode of each item; stages marked 'not written' "
               "are computed in memory):")
    assert reporter.lines == [
        ("info", "dry run of p.toml (bytes at rest; CPU of the extractions, calibrated on "
                 "their first item)"),
        ("info", "  step              stage                         items  item kind        "
                 "at rest  CPU"),
        ("info", heading),
        ("info", "    sift            extract-aa                        8  descriptors  "
                 "not written  1.1 h"),
        ("info", "    hrp -> pooled   encode-bb                         8  vector            "
                 "2.0 kB"),
        ("info", "  result -> scores  classify                          -  -                "
                 "      ?"),
        ("info", "  import            import-cc                         -  -                "
                 "      ?"),
        ("info", heading),
        ("info", "    grid            encode-dd                         8  sequence          "
                 "1.5 MB  30 s"),
        ("info", "  later: planned when it runs (it reads a model that step 'hrp' fits)"),
        ("info", "  after: not planned, blocked by the problem of step 'bad'"),
        ("info", "dry run: total 5 stages (4 written, 1 fused pass(es)), 1.5 MB at rest (2 not "
                 "sized), about 1.1 h of CPU for the extractions; 2 problem(s)"),
        ("warn", "problem: step 'bad': --weights w.pth: no such file"),
        ("warn", "problem: the store is read-only")]
    inside = Plan()  # the longest label in a pass: the columns still line up
    inside.add(Node("x", "extract-aa", "extract", pass_step="x"))
    inside.add(Node("a-long-step", "encode-bb", "encode", name="its-name", pass_step="x"))
    inside.add(Node("y", "encode-cc", "encode"))
    lines = KeptLines()
    print_plan(inside, lines)
    header, *rows = [text for _, text in lines.lines[1:6] if "pass of step" not in text]
    assert [row.index(stage) for row, stage in zip(
        rows, ("extract-aa", "encode-bb", "encode-cc"), strict=True)] == \
        [header.index("stage")] * 3, rows
    empty = KeptLines()
    print_plan(Plan(), empty)
    assert empty.lines[1] == ("info", "  step  stage                         items  item kind  "
                                      "      at rest  CPU")
    assert empty.lines[2:] == [("info", "dry run: total 0 stages (0 written), 0 B at rest; 0 "
                                        "problem(s)")]


def test_item_kinds_name_their_content_and_what_an_encoder_makes_of_them():
    """ItemKind's label and description; encoded_kind: unknown sides give None, a per-frame
    output of an image is one vector, the name and the guess carried."""
    from featpipe.item_kinds import (
        FISHER,
        POOLS_TIME,
        SECOND_ORDER,
        SPATIAL_GRID,
        ItemKind,
        encoded_kind,
        shape_kind,
    )

    assert ItemKind("sequence").label == "sequence"
    assert ItemKind("sequence", guessed=True).label == "sequence?"
    assert ItemKind("descriptors", "dense SIFT").describe() == \
        "dense SIFT sets of local descriptors (rows with their frame index)"
    assert ItemKind("vector").describe() == "one vector per item"
    frames, sift = ItemKind("sequence", "fc6"), ItemKind("descriptors", "dsift")
    images = ItemKind("descriptors", "dsift", per_image=True)
    assert encoded_kind("hrp", None, {}, frames) is None
    assert encoded_kind("hrp", POOLS_TIME, {}, None) is None
    assert encoded_kind("hrp", POOLS_TIME, {}, frames) == ItemKind("vector", "hrp of fc6")
    assert encoded_kind("hrp", POOLS_TIME, {"emit_layer": 1}, frames).kind == "sequence"
    assert encoded_kind("cov", SECOND_ORDER, {}, sift) == ItemKind("sequence", "cov of dsift")
    assert encoded_kind("cov", SECOND_ORDER, {}, frames).kind == "vector"  # rows as one set
    assert encoded_kind("cov", SECOND_ORDER, {}, images) == ItemKind("vector", "cov of dsift",
                                                                     per_image=True)
    assert encoded_kind("grid", SPATIAL_GRID, {}, ItemKind("descriptors")) == \
        ItemKind("sequence", "grid")
    assert encoded_kind("avg", POOLS_TIME, {}, shape_kind(2)) == \
        ItemKind("vector", "avg of imported", guessed=True)
    assert FISHER.taken({"per_frame": True}) == ("descriptors",)
    assert FISHER.taken({}) == ("descriptors", "sequence")
    assert encoded_kind("fisher", FISHER, {"per_frame": True}, sift).kind == "sequence"
    assert encoded_kind("fisher", FISHER, {}, sift).kind == "vector"
    assert [shape_kind(n, framed) for n, framed in [(0, False), (1, False), (1, True),
                                                    (2, False), (2, True), (3, False)]] == [
        ItemKind(kind, "imported", guessed=True) for kind in
        ("vector", "vector", "vector", "sequence", "descriptors", "sequence")]


def test_an_item_kind_is_a_frozen_value_and_an_import_is_guessed_unframed():
    """One ItemKind is remembered per stage name and handed to every step that reads a stage
    of that name, and the encoders' Kinds are module constants: neither can be changed in
    place, and equal kinds are one value (hashable).  shape_kind without ``framed``: 2-D
    items without a frame_index are sequences."""
    import dataclasses

    from featpipe.item_kinds import FISHER, POOLS_TIME, ItemKind, shape_kind

    kind = ItemKind("sequence", "fc6")
    with pytest.raises(dataclasses.FrozenInstanceError):
        kind.kind = "vector"
    with pytest.raises(dataclasses.FrozenInstanceError):
        POOLS_TIME.does = "maps every row"
    assert {kind, ItemKind("sequence", "fc6"), ItemKind("sequence", "fc6", True)} == {
        kind, ItemKind("sequence", "fc6", per_image=True)}
    assert len({POOLS_TIME, FISHER, POOLS_TIME}) == 2
    assert shape_kind(2) == ItemKind("sequence", "imported", guessed=True)
    assert shape_kind(3) == ItemKind("sequence", "imported", guessed=True)
    assert shape_kind(1) == ItemKind("vector", "imported", guessed=True)


def test_check_input_names_both_sides_and_each_way_out():
    """A mismatch is a ParameterError of the parameter named; an unknown or guessed side is
    not checked; each way out as its case says."""
    from featpipe.item_kinds import CLASSIFY, FITS, POOLS_TIME, ItemKind, check_input, way_out

    sift = ItemKind("descriptors", "dsift")
    check_input("hrp", None, {}, sift, "'raw'")
    check_input("hrp", POOLS_TIME, {}, None, "'raw'")
    check_input("hrp", POOLS_TIME, {}, ItemKind("descriptors", guessed=True), "'raw'")
    check_input("hrp", POOLS_TIME, {}, ItemKind("sequence"), "'raw'")
    with pytest.raises(ParameterError) as raised:
        check_input("classify", CLASSIFY, {}, sift, "'raw'", param="inputs")
    assert raised.value.param == "inputs"
    assert str(raised.value) == (
        "inputs 'raw' holds dsift sets of local descriptors (rows with their frame index); "
        "classify trains on one vector per item: encode the descriptors first (featpipe "
        "encode -m fisher, bilinear, ...)")
    cases = {("descriptors", ("sequence",)): "encode each frame first (extract --encode fisher "
             "--per-frame, or spatial-grid), or use a local-descriptor encoder (fisher, "
             "bilinear, cov, cbp-ts, cbp-rm)",
             ("descriptors", ("vector",)): "encode the descriptors first (featpipe encode -m "
             "fisher, bilinear, ...)",
             ("vector", ("sequence",)): "there is no time axis left to pool: pool the "
             "per-frame stage it was made from (e.g. fisher --per-frame), or use the vectors "
             "as they are",
             ("vector", ("descriptors",)): "its items are already one vector each; use it as "
             "it is",
             ("sequence", ("vector",)): "pool the frames first (featpipe encode -m avg, "
             "rankpool, hrp, ...)",
             ("sequence", ("descriptors",)): "it needs each descriptor's frame (and position): "
             "give it the local features of the extraction",
             ("sequence", ("vector", "descriptors")): "it takes vector or descriptors items"}
    for (given, taken), text in cases.items():
        assert way_out(given, taken) == text, (given, taken)
    everything = ("sequence", "descriptors", "vector")
    assert {fit: kinds.taken({}) for fit, kinds in FITS.items()} == {
        "pca": everything, "gmm": ("descriptors", "sequence"),
        "deep-gmm": ("descriptors", "sequence"), "standardize": everything,
        "dhrp": ("sequence",), "gmsop": ("descriptors",)}


def test_a_stages_item_kind_follows_from_its_record(tmp_path, monkeypatch):
    """extraction_kind of each record an extraction writes; an import's declared kind, else
    its first computed item's shape (None before one is); an encode stage from its method and
    input; a stage without items (fit, classify) None; remember() overrides, per folder."""
    from types import SimpleNamespace

    import numpy as np

    from featpipe import item_kinds
    from featpipe.item_kinds import ItemKind, extraction_kind, item_kind, remember
    from featpipe.manifest import from_rows

    monkeypatch.setattr(item_kinds, "_known", {})  # this process's kinds: none known yet

    records = [
        ({"features": "nope"}, None),
        ({"features": "dsift"}, ItemKind("descriptors", "dsift")),
        ({"features": "dsift", "sampling": {"every": 2}}, ItemKind("descriptors", "dsift")),
        ({"features": "vgg16-fc6"}, ItemKind("sequence", "vgg16-fc6")),
        ({"features": "vgg16-fc6", "sampling": None},
         ItemKind("vector", "vgg16-fc6", per_image=True)),
        ({"features": "dsift", "sampling": None}, ItemKind("descriptors", "dsift", True)),
        ({"features": "torchvision", "spatial": True}, ItemKind("descriptors", "torchvision")),
        ({"features": "dsift", "spatial": False}, ItemKind("sequence", "dsift")),
        ({"features": "dsift", "sample": {"n": 5}}, ItemKind("descriptors", "a sample of dsift")),
        ({"features": "dsift", "sample": {"n": 5}, "sampling": None},
         ItemKind("descriptors", "a sample of dsift", per_image=True)),
        ({"features": "dsift", "encode": {"method": "fisher"}},
         ItemKind("vector", "fisher of dsift")),
        ({"features": "dsift", "encode": {"method": "nope"}}, None),
        ({"features": "dsift", "encode": None}, ItemKind("descriptors", "dsift")),
        ({"features": "dsift", "sampling": None, "encode": {"method": "spatial-grid"}},
         ItemKind("vector", "spatial-grid of dsift", per_image=True)),
    ]
    for params, kind in records:
        assert extraction_kind(params) == kind, params
    store = Store(tmp_path / "s")
    items = from_rows([("a", "", ["x"], ["train"]), ("b", "", ["x"], ["test"])], tmp_path)
    declared = store.stage("import", {"n": 1, "item_kind": "descriptors"}, items=items)
    assert item_kind(declared) == ItemKind("descriptors", "imported")
    empty = store.stage("import", {"n": 2, "item_kind": "bogus"}, items=items)
    assert item_kind(empty) is None  # nothing computed yet: not known
    framed = store.stage("import", {"n": 3}, items=items)
    framed.write_item("b", np.ones((3, 2), np.float32))
    framed.write_item("a", np.ones((3, 2), np.float32), {"frame_index": np.zeros(3, np.int64)})
    assert item_kind(framed) == ItemKind("descriptors", "imported", guessed=True)  # a's
    vectors = store.stage("import", {"n": 4}, items=items)
    vectors.write_item("b", np.ones(3, np.float32))
    assert item_kind(vectors) == ItemKind("vector", "imported", guessed=True)
    assert item_kind(SimpleNamespace(name="fit-x", kind="fit", params={})) is None
    assert item_kind(SimpleNamespace(name="odd-x", kind="extract", params=None)) is None
    source = SimpleNamespace(name="extract-y", kind="extract", params={"features": "dsift"})
    encoded = SimpleNamespace(name="encode-z", kind="encode", params={"method": "cov"},
                              inputs=lambda: [source])
    assert item_kind(encoded) == ItemKind("sequence", "cov of dsift")
    lost = SimpleNamespace(name="encode-w", kind="encode", params={"method": "nope"},
                           inputs=lambda: [source])
    assert item_kind(lost) is None
    remember(source, ItemKind("vector", "mine"))
    assert item_kind(source) == ItemKind("vector", "mine")
