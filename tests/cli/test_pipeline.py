"""``featpipe run PIPELINE.toml``: a declared sequence of stages, end to end on real data
(aeon's BasicMotions: import -> fit standardize -> encode -> classify), dry runs, reruns that
compute nothing, and bad pipeline files."""

import json
import re
from pathlib import Path

import numpy as np
import pytest

from featpipe.pipeline import PipelineError, load_pipeline, run_pipeline
from featpipe.store import Store

aeon = pytest.importorskip("aeon")
DATA = Path(aeon.__file__).parent / "datasets" / "data" / "BasicMotions"

PIPELINE = f"""
[pipeline]
store = "store"

[steps.frames]
stage = "import_features"
sources = ["{DATA / 'BasicMotions_TRAIN.ts'}", "{DATA / 'BasicMotions_TEST.ts'}"]

[steps.std]
stage = "fit_standardize"
input = "frames"

[steps.frames-std]
stage = "encode"
input = "frames"
method = "standardize"
params = {{ model = "std" }}

[steps.avg]
stage = "encode"
input = "frames-std"
method = "avg"
jobs = 2

[steps.result]
stage = "classify"
inputs = ["avg"]
kernels = ["chi2"]
normalize = "none"
report = "reports/avg.json"
"""


def literal_chi2(A, B):
    """Σ_i 2 a_i b_i / (|a_i| + |b_i|) (VLFeat's signed rule; 0 where both are 0)."""
    num = 2 * A[:, None, :] * B[None, :, :]
    den = np.abs(A)[:, None, :] + np.abs(B)[None, :, :]
    return np.where(den > 0, num / np.where(den > 0, den, 1), 0).sum(axis=2)


def reference_accuracy() -> float:
    """PIPELINE's accuracy recomputed without featpipe: channels standardised with the train
    frames' mean and std, averaged over time (not L2-normalised: ``normalize = "none"``), a
    literal chi-square kernel, scikit-learn's libsvm one-vs-rest at C = 1000 (classify's
    default), the highest decision value wins."""
    from aeon.datasets import load_basic_motions
    from sklearn.svm import SVC

    Xtr, ytr = load_basic_motions(split="train")
    Xte, yte = load_basic_motions(split="test")
    frames = np.concatenate([x.T for x in Xtr]).astype(np.float64)
    mean, std = frames.mean(axis=0), frames.std(axis=0)
    Ztr = np.stack([((x.T - mean) / std).mean(axis=0) for x in Xtr])
    Zte = np.stack([((x.T - mean) / std).mean(axis=0) for x in Xte])
    Ktr, Kte = literal_chi2(Ztr, Ztr), literal_chi2(Zte, Ztr)
    classes = np.unique(ytr)
    scores = np.column_stack([SVC(kernel="precomputed", C=1000).fit(Ktr, ytr == c)
                              .decision_function(Kte) for c in classes])
    return float(np.mean(classes[scores.argmax(1)] == yte))


def printed_accuracy(stdout: str) -> float:
    return float(re.search(r"split 1: accuracy ([0-9.]+)", stdout).group(1))


@pytest.fixture
def pipeline_file(tmp_path):
    path = tmp_path / "pipeline.toml"
    path.write_text(PIPELINE)
    return path


def test_a_pipeline_runs_end_to_end_and_a_rerun_computes_nothing(tmp_path, pipeline_file, cli,
                                                                  monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = cli("run", pipeline_file, "--dry-run", check=True)
    lines = plan.stdout.splitlines()
    assert lines.count("dry run: 80 to compute, 0 already complete") == 3
    assert sum(line.startswith("would compute ") for line in lines) == 9  # 3 per item step
    assert "dry run: would fit" in lines
    assert any(line.startswith("dry run: would run classify on avg") for line in lines)
    assert "would run after" not in plan.stdout  # every step planned on the earlier ones
    planned = [line for line in lines if line.startswith("stage ")]
    assert len(planned) == 4  # frames, std, frames-std, avg: each step's stage and key
    assert not (tmp_path / "store").exists()  # a dry run creates nothing
    first = cli("run", pipeline_file, check=True)
    assert [line for line in first.stdout.splitlines() if line.startswith("stage ")] == \
        planned  # the keys the dry run printed are the stages computed
    assert first.stdout.count("summary: 80 done, 0 skipped") == 3
    assert "step 5/5: result (classify)" in first.stdout
    assert printed_accuracy(first.stdout) == pytest.approx(reference_accuracy(), abs=1e-4)
    store = Store(tmp_path / "store")
    assert sorted(store.names()) == ["avg", "frames", "frames-std", "result", "std"]
    assert store.resolve("result").kind == "classify"  # a step's name names its result too
    report = json.loads((tmp_path / "reports" / "avg.json").read_text())
    assert report["command"] == f"featpipe run {pipeline_file} (step result)"
    assert [e["kind"] for e in report["inputs_chain"]] == ["import", "standardize", "encode",
                                                             "encode"]
    again = cli("run", pipeline_file, check=True)
    assert again.stdout.count("summary: 0 done, 80 skipped (already complete)") == 3
    assert again.stdout.split("split 1: ")[1].splitlines()[0] == \
        first.stdout.split("split 1: ")[1].splitlines()[0]
    plan = cli("run", pipeline_file, "--dry-run", check=True)
    assert plan.stdout.count("dry run: 0 to compute, 80 already complete") == 3
    assert "dry run: model already fitted" in plan.stdout
    assert "would run after" not in plan.stdout


def test_the_same_steps_through_the_library(tmp_path, pipeline_file, monkeypatch, cli):
    monkeypatch.chdir(tmp_path)
    pipeline = load_pipeline(pipeline_file)
    assert [s.name for s in pipeline.steps] == ["frames", "std", "frames-std", "avg", "result"]
    results = run_pipeline(pipeline, Store(tmp_path / "lib"))
    assert results[3].summary.done == 80 and results[4]["summary"]["metric"] == "accuracy"
    # the command line gives the same numbers
    command = cli("run", pipeline_file, "--store", tmp_path / "cli", check=True)
    assert f"accuracy {results[4]['splits'][0]['score']:.4f}" in command.stdout
    only = cli("run", pipeline_file, "--store", tmp_path / "cli", "--step", "avg", check=True)
    assert "step 4/5: avg (encode)" in only.stdout and "step 1/5" not in only.stdout


FRAMES = "[steps.frames]\nstage = 'import_features'\nsources = ['x.ts']\n"


@pytest.mark.parametrize("text, message", [
    ("[steps.a]\nstage = 'encoder'\n", "stage = 'encoder' is not one of import_features"),
    ("[steps.a]\nstage = 'encode'\ninput = 'x'\nmethod = 'avg'\nwindw = 3\n",
     "step 'a' (encode) has no parameter 'windw'"),
    ("[steps.a]\nstage = 'encode'\ninput = 'x'\n", "step 'a' (encode) needs method"),
    ("[steps.a\n", "not a TOML file"),
    ("[pipeline]\nstore = 's'\n", "no steps"),
    ("[pipline]\n[steps.a]\nstage = 'encode'\n", "expected a [pipeline] table"),
    # unknown keys, with the closest known one
    (f"{FRAMES}[steps.a]\nstage = 'encode'\ninptu = 'frames'\nmethod = 'avg'\n",
     "step 'a' (encode) has no parameter 'inptu' (did you mean 'input'? "),
    (f"{FRAMES}[steps.a]\nstage = 'encode'\ninput = 'frames'\nmethod = 'hrp'\n"
     "params = { windw = 3 }\n",
     "step 'a' (encode): windw does not apply to method hrp (did you mean window?)"),
    (f"{FRAMES}[steps.a]\nstage = 'encode'\ninput = 'frames'\nmethod = 'hpr'\n",
     "step 'a' (encode): method must be one of"),
    (f"{FRAMES}[steps.p]\nstage = 'fit_pca'\ninput = 'frames'\nn_component = 3\n",
     "step 'p' (fit_pca): n_component is not a parameter of PCAProjection (did you mean "
     "n_components?)"),
    ("[steps.x]\nstage = 'extract'\nmanifest = 'm.csv'\nfeatures = 'dsift'\n"
     "sampling = { fsp = 5 }\n", "step 'x' (extract): sampling has no key 'fsp' (did you "
     "mean fps?)"),
    # values, checked as the command line checks them
    (f"{FRAMES}[steps.a]\nstage = 'encode'\ninput = 'frames'\nmethod = 'hrp'\n"
     "params = { window = 0 }\n",
     "step 'a' (encode): window must be an int in the range [1, inf), got 0"),
    (f"{FRAMES}[steps.a]\nstage = 'encode'\ninput = 'frames'\nmethod = 'avg'\n"
     "on_error = 'skp'\n", "step 'a' (encode): on_error must be one of fail, skip"),
    (f"{FRAMES}[steps.a]\nstage = 'encode'\ninput = 'frames'\nmethod = 'hrp'\n"
     "params = { stride = true }\n",
     "step 'a' (encode): stride must be an int in the range [1, inf), got True"),
    ("[steps.x]\nstage = 'extract'\nmanifest = 'm.csv'\nfeatures = 'dsift'\n"
     "params = { step = 0 }\n", "step 'x' (extract): "),
    ("[steps.x]\nstage = 'extract'\nmanifest = 'm.csv'\nfeatures = 'dsift'\n"
     "sampling = { fps = '5' }\n", "step 'x' (extract): fps must be a finite number > 0, got "
     "'5'"),
    ("[steps.x]\nstage = 'extract'\nmanifest = 'm.csv'\nfeatures = 'dsift'\n"
     "sampling = { every = 2.5 }\n", "step 'x' (extract): every must be a whole number >= 1, "
     "got 2.5"),
    ("[steps.x]\nstage = 'extract'\nmanifest = 'm.csv'\nfeatures = 'dsift'\n"
     "sampling = { frames = true }\n", "step 'x' (extract): frames must be a whole number "
     ">= 1, got True"),
    ("[steps.x]\nstage = 'extract'\nmanifest = 'm.csv'\nfeatures = 'sift'\n",
     "step 'x' (extract): features must be one of"),
    # extract's settings are keys of the step, checked as the command line checks them
    ("[steps.x]\nstage = 'extract'\nmanifest = 'm.csv'\nfeatures = 'dsift'\n"
     "sample_descriptor = 9\n", "step 'x' (extract) has no parameter 'sample_descriptor' "
     "(did you mean 'sample_descriptors'? "),
    ("[steps.x]\nstage = 'extract'\nmanifest = 'm.csv'\nfeatures = 'dsift'\n"
     "batch_size = 0\n", "step 'x' (extract): batch_size must be >= 1, got 0"),
    ("[steps.x]\nstage = 'extract'\nmanifest = 'm.csv'\nfeatures = 'dsift'\n"
     "encode_params = { per_frame = true }\n",
     "step 'x' (extract): per_frame applies to --encode only"),
    ("[steps.x]\nstage = 'extract'\nmanifest = 'm.csv'\nfeatures = 'vgg16-fc6'\n"
     "encode = 'fisher'\n", "step 'x' (extract): encode applies to local features"),
    (f"{FRAMES}[steps.c]\nstage = 'classify'\ninputs = ['frames']\nC = []\n",
     "step 'c' (classify): C needs at least one value"),
    # references: earlier steps only
    (f"{FRAMES}[steps.a]\nstage = 'encode'\ninput = 'b'\nmethod = 'avg'\n"
     "[steps.b]\nstage = 'encode'\ninput = 'frames'\nmethod = 'max'\n",
     "step 'a' (encode): input names step 'b', which comes later in the file"),
    (f"{FRAMES}[steps.a]\nstage = 'encode'\ninput = 'fram'\nmethod = 'avg'\n",
     "step 'a' (encode): input names 'fram', which is no earlier step of this file (did you "
     "mean 'frames'? earlier steps: frames)"),
    (f"{FRAMES}[steps.a]\nstage = 'encode'\ninput = 'a'\nmethod = 'avg'\n",
     "step 'a' (encode): input names the step itself (a cycle)"),
    (f"{FRAMES}[steps.a]\nstage = 'encode'\ninput = 'frames'\nmethod = 'standardize'\n"
     "params = { model = 'std' }\n[steps.std]\nstage = 'fit_standardize'\n"
     "input = 'frames'\n", "step 'a' (encode): model names step 'std', which comes later"),
    (f"{FRAMES}[steps.c]\nstage = 'classify'\ninputs = ['frames', 'later']\n"
     "[steps.later]\nstage = 'encode'\ninput = 'frames'\nmethod = 'avg'\n",
     "step 'c' (classify): inputs names step 'later', which comes later"),
])
def test_bad_pipeline_files_are_usage_errors_before_anything_runs(tmp_path, text, message, cli):
    path = tmp_path / "p.toml"
    path.write_text(text)
    with pytest.raises(PipelineError, match=re.escape(message)):
        load_pipeline(path)
    proc = cli("run", path, "--store", tmp_path / "s")
    assert proc.exit_code == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "s").exists()


def test_a_failing_step_names_itself_and_stops_the_pipeline(tmp_path, pipeline_file, cli,
                                                            monkeypatch):
    monkeypatch.chdir(tmp_path)
    broken = PIPELINE.replace('inputs = ["avg"]', 'inputs = ["nope"]')
    path = tmp_path / "broken.toml"
    path.write_text(broken)
    proc = cli("run", path)
    assert proc.exit_code == 2  # checked before any step runs: nothing computed
    assert "step 'result' (classify): inputs names 'nope', which is no earlier step" in \
        proc.stderr and not (tmp_path / "store").exists()
    bad_value = PIPELINE.replace('method = "avg"', 'method = "hrp"\nparams = { window = 0 }')
    path.write_text(bad_value)
    proc = cli("run", path, "--store", tmp_path / "other")
    assert proc.exit_code == 2 and "step 'avg' (encode): window must be" in proc.stderr
    assert not (tmp_path / "other").exists()
    missing = cli("run", tmp_path / "none.toml")
    assert missing.exit_code == 2 and "no such file" in missing.stderr
    unknown = cli("run", pipeline_file, "--step", "nope")
    assert unknown.exit_code == 2 and "no step 'nope'" in unknown.stderr


def small_import(tmp_path, n=4) -> str:
    """A manifest ``m.csv`` and ``f.npz`` of ``n`` (3, 2) sequences: an import step's table."""
    from featpipe.manifest import from_rows

    ids = [f"x{i}" for i in range(n)]
    from_rows([(i, "", ["a"], ["train"]) for i in ids], tmp_path).write(tmp_path / "m.csv")
    np.savez(tmp_path / "f.npz", **{i: np.full((3, 2), k, float) for k, i in enumerate(ids)})
    return (f"stage = 'import_features'\nsources = ['{tmp_path / 'f.npz'}']\n"
            f"manifest_path = '{tmp_path / 'm.csv'}'\n")


def test_a_step_is_referenced_by_its_key_whatever_its_name(tmp_path, cli):
    """Issue 30: a step with ``name = "z"`` is used by a later step as ``input = "a"`` (its
    key), which used to pass the check and then fail with ``no stage named 'a'``; ``input =
    "z"`` is refused, saying to use the key."""
    path = tmp_path / "p.toml"
    path.write_text(f"[steps.a]\n{small_import(tmp_path)}name = 'z'\n"
                    "[steps.b]\nstage = 'encode'\ninput = 'a'\nmethod = 'avg'\n")
    plan = cli("run", path, "--store", tmp_path / "s", "--dry-run", check=True)
    assert "would run after" not in plan.stdout
    cli("run", path, "--store", tmp_path / "s", check=True)
    store = Store(tmp_path / "s")
    assert sorted(store.names()) == ["b", "z"]
    assert store.resolve("b").inputs() == [store.resolve("z")]
    path.write_text(path.read_text().replace("input = 'a'", "input = 'z'"))
    with pytest.raises(PipelineError, match=re.escape(
            "step 'b' (encode): input names 'z', which is the name = of step 'a': a step is "
            "referenced by its key, write 'a'")):
        load_pipeline(path)


def test_at_name_takes_a_stage_made_outside_the_file_resolved_when_checked(tmp_path, cli):
    """Issue 30: ``input = "@feat"`` names the store's stage ``feat`` (made by an earlier
    command), resolved to its key before any step runs and printed by the dry run; a bare
    ``feat`` is still refused, and an ``@name`` the store lacks is a problem of the plan."""
    store_path = tmp_path / "s"
    made = tmp_path / "made.toml"
    made.write_text(f"[steps.feat]\n{small_import(tmp_path)}")
    cli("run", made, "--store", store_path, check=True)
    folder = Store(store_path).resolve("feat").name
    path = tmp_path / "p.toml"
    path.write_text("[steps.avg]\nstage = 'encode'\ninput = '@feat'\nmethod = 'avg'\n")
    plan = cli("run", path, "--store", store_path, "--dry-run", check=True)
    assert f"@feat = {folder}" in plan.stdout.splitlines()
    assert "dry run: 4 to compute, 0 already complete" in plan.stdout
    cli("run", path, "--store", store_path, check=True)
    store = Store(store_path)
    assert store.resolve("avg").inputs() == [store.resolve("feat")]
    path.write_text(path.read_text().replace("'@feat'", "'@nope'"))
    proc = cli("run", path, "--store", store_path)
    assert proc.exit_code == 1 and "Traceback" not in proc.stderr  # a problem of the plan
    assert "problem: step 'avg': input @nope: no stage named 'nope' in store" in proc.stderr
    assert "stage " not in proc.stdout  # checked before any step ran
    path.write_text(path.read_text().replace("'@nope'", "'feat'"))
    with pytest.raises(PipelineError, match="input names 'feat', which is no earlier step"):
        load_pipeline(path)
