"""One computation, one key (issue 22 section 1).

Every stage kind is asked for through the three entry points (the command line in-process,
a pipeline file, the Python API) with equal values written differently: ints for float
parameters and floats for int ones, defaults omitted or given, the short CLI aliases
(``--dim``, ``--components``, ``--seed``) or scikit-learn's names, a partial ``params`` table.
Each must give one key.  Dry runs compute the keys without computing anything, except for
``classify``, which runs (it has no dry run; its inputs are tiny).
"""

from __future__ import annotations

import json
import re

import numpy as np
import pytest

from featpipe import stages
from featpipe.encode.registry import load_methods
from featpipe.extract.settings import ExtractSettings
from featpipe.io.video import Sampling
from featpipe.manifest import Manifest
from featpipe.parameters import estimator_parameters, parameter_record, typed_value
from featpipe.pipeline import load_pipeline, run_pipeline
from featpipe.stages import Reporter, RunOptions
from featpipe.store import Stage, Store
from tests._stores import write_npy_dataset
from tests.unit.test_video import write_video

KEY_LINE = re.compile(r"^(?:stage [a-z][a-z0-9-]*-([0-9a-f]{16})|classify ([0-9a-f]{16}))",
                      re.M)


class Lines(Reporter):
    def __init__(self):
        self.lines = []

    def info(self, text):
        self.lines.append(text)


def keys_in(text: str) -> list[str]:
    return [a or b for a, b in KEY_LINE.findall(text)]


@pytest.fixture(scope="module")
def world(tmp_path_factory):
    """A store with imported sequences ``frames`` (12 items, 8 dims), a fitted GMM ``g``,
    model stages for the model parameters of encode, encoded ``avg``/``max`` for classify,
    and a manifest of one tiny video for extract."""
    root = tmp_path_factory.mktemp("keys")
    manifest = write_npy_dataset(root)
    store = Store(root / "store")
    stages.import_features(store, [str(root / "npy")], str(manifest), name="frames")
    stages.fit_gmm(store, "frames", name="g", n_components=2, max_iter=5, sample=50)
    for kind in ("dhrp", "gmsop", "standardize"):
        stage = store.stage(kind, {"stand-in": kind}, items=Manifest([]))
        store.set_name(f"model-{kind}", stage)
    for method in ("avg", "max"):
        stages.encode(store, "frames", method, name=method)
    write_video(root / "clip.mp4", n_frames=12, size=(48, 32), fps=10.0)
    (root / "video.csv").write_text("id,path,label,split1\nclip,clip.mp4,a,train\n")
    return root, store


def cli_key(cli, *args) -> str:
    result = cli(*args)
    assert result.exit_code == 0, result.output
    found = keys_in(result.output)
    assert len(found) == 1, result.output
    return found[0]


def _toml(value) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list | tuple):
        return "[" + ", ".join(_toml(v) for v in value) + "]"
    if isinstance(value, dict):
        return "{ " + ", ".join(f"{k} = {_toml(v)}" for k, v in value.items()) + " }"
    return json.dumps(value)


def by_folder(store, step: dict) -> dict:
    """The step with the stages it names given by their folders (a pipeline step names a
    stage made elsewhere by its folder)."""
    names = store.names()
    step = dict(step)
    for key in ("input", "gmm", "pca"):
        if key in step:
            step[key] = names[step[key]]
    if "inputs" in step:
        step["inputs"] = [names[n] for n in step["inputs"]]
    if "params" in step:
        step["params"] = {k: names[v] if k in ("gmm", "model") else v
                          for k, v in step["params"].items()}
    return step


def pipeline_key(root, store, step: dict, dry_run: bool = True) -> str:
    """The key of a one-step pipeline file (``dry_run``: planned, not computed)."""
    step = by_folder(store, step)
    path = root / "one.toml"
    body = "\n".join(f"{k} = {_toml(v)}" for k, v in step.items() if v is not None)
    path.write_text(f"[steps.probe]\n{body}\n", encoding="utf-8")
    lines = Lines()
    run_pipeline(load_pipeline(path), store, dry_run=dry_run, reporter=lines)
    found = keys_in("\n".join(lines.lines))
    assert len(found) == 1, lines.lines
    return found[0]


def python_key(result) -> str:
    if isinstance(result, dict):
        return result["key"]
    return (result if isinstance(result, Stage) else result.stage).key


def respelled(value):
    """The same value written the other way: 1.0 -> 1, 20 -> 20.0, others unchanged."""
    if isinstance(value, bool) or not isinstance(value, int | float):
        return value
    if isinstance(value, float) and value.is_integer():
        return int(value)
    return float(value) if isinstance(value, int) else value


def _model_of(method: str) -> str:
    return {"standardize": "model-standardize", "dhrp": "model-dhrp",
            "gmsop": "model-gmsop"}.get(method, "g")


#: parameters a method requires (no default), given alike through the three entry points
REQUIRED = {"fisher-group": {"group": "hog"}}


@pytest.mark.parametrize("method", sorted(load_methods()))
def test_each_encode_method_has_one_key_through_the_three_entry_points(cli, world, method):
    root, store = world
    chosen = load_methods()[method]
    models = {p.name: _model_of(method) for p in chosen.parameters if p.model}
    models.update(REQUIRED.get(method, {}))
    # the command line: defaults omitted, model stages by name
    args = ["encode", "-s", store.root, "-i", "frames", "-m", method, "-n", "x", "--dry-run"]
    for name, value in models.items():
        args += [f"--{name}", value]
    key = cli_key(cli, *args)
    # a pipeline file: every default given, floats that are whole written as ints
    params = {p.name: respelled(p.default) for p in chosen.parameters
              if not p.model and p.default is not None}
    step = {"stage": "encode", "input": "frames", "method": method,
            "params": {**params, **models}}
    assert pipeline_key(root, store, step) == key
    # the Python API: only the numbers, each written the other way (5 -> 5.0, 1.0 -> 1)
    numbers = {k: respelled(v) for k, v in params.items()
               if isinstance(v, int | float) and not isinstance(v, bool)}
    numbers = {k: float(v) if isinstance(v, int) else v for k, v in numbers.items()}
    run = stages.encode(store, "frames", method, {**numbers, **models},
                        options=RunOptions(dry_run=True))
    assert python_key(run) == key


def test_hrp_values_written_as_int_or_float_are_one_stage(cli, world):
    root, store = world
    key = cli_key(cli, "encode", "-s", store.root, "-i", "frames", "-m", "hrp", "--C", "1.0",
                  "--window", "5", "--epsilon", "0.1", "--dry-run")
    step = {"stage": "encode", "input": "frames", "method": "hrp",
            "params": {"C": 1, "window": 5.0}}
    assert pipeline_key(root, store, step) == key
    run = stages.encode(store, "frames", "hrp", {"C": np.float32(1), "window": np.int64(5)},
                        options=RunOptions(dry_run=True))
    assert python_key(run) == key


def test_extract_dsift_one_key_for_fps_5_and_5_0_and_a_partial_table(cli, world):
    root, store = world
    key = cli_key(cli, "extract", "-m", root / "video.csv", "-s", store.root, "-f", "dsift",
                  "--fps", "5.0", "--sizes", "8", "--step", "4", "--dry-run")
    step = {"stage": "extract", "manifest": str(root / "video.csv"), "features": "dsift",
            "sampling": {"fps": 5}, "params": {"sizes": [8], "step": 4.0}}
    assert pipeline_key(root, store, step) == key
    run = stages.extract(store, Manifest.read(root / "video.csv"), "dsift",
                         sampling=Sampling(fps=5), params={"sizes": (8.0,), "step": 4,
                                                           "contrast_threshold": 0.005},
                         options=RunOptions(dry_run=True))
    assert python_key(run) == key


def test_extract_dsift_default_sampling_is_one_frame_per_second(cli, world):
    root, store = world
    key = cli_key(cli, "extract", "-m", root / "video.csv", "-s", store.root, "-f", "dsift",
                  "--sizes", "8", "--dry-run")
    assert cli_key(cli, "extract", "-m", root / "video.csv", "-s", store.root, "-f", "dsift",
                   "--sizes", "8", "--fps", "1", "--dry-run") == key


def test_extract_with_an_encoding_has_one_key(cli, world):
    root, store = world
    key = cli_key(cli, "extract", "-m", root / "video.csv", "-s", store.root, "-f", "dsift",
                  "--sizes", "8", "--encode", "cov", "--dry-run")
    assert cli_key(cli, "extract", "-m", root / "video.csv", "-s", store.root, "-f", "dsift",
                   "--sizes", "8", "--encode", "cov", "--ns-iters", "5", "--run-eta", "0.6",
                   "--seed", "0", "--dry-run") == key
    step = {"stage": "extract", "manifest": str(root / "video.csv"), "features": "dsift",
            "params": {"sizes": [8.0]}, "encode": "cov",
            "encode_params": {"ns_iters": 5.0, "norm": "ssr", "random_state": 0.0}}
    assert pipeline_key(root, store, step) == key
    settings = ExtractSettings(encode="cov", encode_params={"run_eta": 0.6, "log_eps": 1e-6})
    run = stages.extract(store, Manifest.read(root / "video.csv"), "dsift",
                         params={"sizes": [8]}, settings=settings,
                         options=RunOptions(dry_run=True))
    assert python_key(run) == key


def test_extract_of_images_keys_no_sampling_and_no_decoder(cli, world):
    import cv2

    root, store = world
    cv2.imwrite(str(root / "still.png"), np.full((32, 48, 3), 90, np.uint8))
    (root / "images.csv").write_text("id,path,label,split1\nstill,still.png,a,train\n")
    args = ["extract", "-m", root / "images.csv", "-s", store.root, "-f", "dsift", "--sizes",
            "8", "--dry-run"]
    key = cli_key(cli, *args)
    for other in (["--fps", "5"], ["--every", "1"], ["--frames", "3"],
                  ["--decoder", "tests.cli.test_extract_interrupt:SlowDecoder"]):
        assert cli_key(cli, *args, *other) == key, other  # an image is read whole
    video = ["extract", "-m", root / "video.csv", "-s", store.root, "-f", "dsift", "--sizes",
             "8", "--dry-run"]
    assert cli_key(cli, *video, "--every", "1") != cli_key(cli, *video)


def test_extract_vgg_one_key(cli, world):
    root, store = world
    key = cli_key(cli, "extract", "-m", root / "video.csv", "-s", store.root, "-f",
                  "vgg16-fc6", "--weights", "random:0", "--every", "2", "--crop", "32",
                  "--resize", "40", "--dry-run")
    step = {"stage": "extract", "manifest": str(root / "video.csv"), "features": "vgg16-fc6",
            "params": {"weights": "random:0", "crop": 32.0, "resize": 40},
            "sampling": {"every": 2.0}}
    assert pipeline_key(root, store, step) == key
    run = stages.extract(store, Manifest.read(root / "video.csv"), "vgg16-fc6",
                         params={"weights": "random:0", "crop": 32, "resize": 40.0},
                         sampling=Sampling(every=2), options=RunOptions(dry_run=True))
    assert python_key(run) == key
    # torchvision's 256/224 omitted, given, and given the other way
    default = cli_key(cli, "extract", "-m", root / "video.csv", "-s", store.root, "-f",
                      "vgg16-fc6", "--weights", "random:0", "--dry-run")
    assert default != key
    step = {"stage": "extract", "manifest": str(root / "video.csv"), "features": "vgg16-fc6",
            "params": {"weights": "random:0", "crop": 224, "resize": 256.0}}
    assert pipeline_key(root, store, step) == default
    run = stages.extract(store, Manifest.read(root / "video.csv"), "vgg16-fc6",
                         params={"weights": "random:00", "crop": 224.0},
                         options=RunOptions(dry_run=True))
    assert python_key(run) == default


FITS = [
    # (command, CLI arguments, pipeline step arguments, Python call arguments)
    ("pca", ["--dim", "4", "--seed", "3", "--sample", "50"],
     {"n_components": 4.0, "random_state": 3, "sample": 50.0},
     {"n_components": 4, "random_state": 3.0, "sample": 50}),
    ("gmm", ["--components", "2", "--random-state", "0", "--sample", "50", "--tol", "1e-5"],
     {"n_components": 2, "sample": 50, "max_iter": 100.0},
     {"n_components": 2.0, "sample": 50, "tol": 0.00001, "random_state": 0}),
    ("dhrp", ["--C", "1", "--epochs", "3"], {"C": 1, "epochs": 3.0, "lr": 0.01},
     {"C": 1.0, "epochs": 3, "svm_C": 1000}),
    ("gmsop", ["--components", "4", "--top-k", "2", "--seed", "1"],
     {"n_components": 4, "top_k": 2.0, "random_state": 1},
     {"n_components": 4.0, "top_k": 2, "random_state": 1, "balance_weight": 100}),
    ("standardize", ["--split", "1"], {}, {"split": 1.0}),
    ("deep-gmm", ["--gmm", "g", "--C", "1.0", "--val-fraction", "0.25"],
     {"gmm": "g", "C": 1, "max_iter": 20.0},
     {"gmm": "g", "C": 1, "val_fraction": 0.25, "subsample": 0.1}),
]


@pytest.mark.parametrize("kind, cli_args, step_args, python_args", FITS,
                         ids=[f[0] for f in FITS])
def test_each_fit_has_one_key_and_the_cli_aliases_are_scikit_learns_names(
        cli, world, kind, cli_args, step_args, python_args):
    root, store = world
    key = cli_key(cli, "fit", kind, "-s", store.root, "-i", "frames", "-n", "m", "--dry-run",
                  *cli_args)
    function = "fit_" + kind.replace("-", "_")
    step = {"stage": function, "input": "frames", **step_args}
    assert pipeline_key(root, store, step) == key
    python_args = dict(python_args)
    positional = [python_args.pop("gmm")] if "gmm" in python_args else []
    stage = getattr(stages, function)(store, "frames", *positional, name="m", dry_run=True,
                                      **python_args)
    assert python_key(stage) == key


def test_classify_and_fusion_have_one_key(cli, world):
    root, store = world
    key = cli_key(cli, "classify", "-s", store.root, "-i", "avg", "--C", "1.0", "--kernel",
                  "linear")
    step = {"stage": "classify", "inputs": ["avg"], "C": [1], "kernels": ["linear"]}
    assert pipeline_key(root, store, step, dry_run=False) == key
    assert python_key(stages.classify(store, ["avg"], C=[np.float64(1)])) == key
    fused = cli_key(cli, "classify", "-s", store.root, "-i", "avg", "-i", "max", "--C", "10",
                    "--weights", "1,1")
    assert fused != key
    step = {"stage": "classify", "inputs": ["avg", "max"], "C": [10], "weights": [0.5, 0.5]}
    assert pipeline_key(root, store, step, dry_run=False) == fused
    result = stages.classify(store, ["avg", "max"], ["linear", "linear"], C=[10.0])
    assert python_key(result) == fused and result["params"]["weights"] == [0.5, 0.5]


def test_the_record_fills_defaults_types_values_and_suggests_names():
    from featpipe.encode.fisher import GaussianMixtureModel
    from featpipe.errors import ParameterError
    from featpipe.extract.dsift import DenseSIFT

    record = parameter_record(estimator_parameters(DenseSIFT), {"sizes": (8,), "magnif": 6})
    assert record == {"sizes": [8], "step": 2, "magnif": 6.0, "window_size": 1.5,
                      "contrast_threshold": None, "low_contrast": "zero", "root_sift": False,
                      "max_pixels": None, "start": 0, "engine": "featpipe"}
    assert json.dumps(record["magnif"]) == "6.0"
    with pytest.raises(ParameterError, match=r"n_component is not a parameter of "
                       r"GaussianMixtureModel \(did you mean n_components\?\)"):
        parameter_record(estimator_parameters(GaussianMixtureModel), {"n_component": 2},
                         "GaussianMixtureModel")
    assert typed_value(20.5, (int,)) == 20.5  # left for validation to refuse
    assert typed_value(True, (float,)) is True  # ... and so is a bool for a number


@pytest.mark.parametrize("call", [
    lambda store: stages.encode(store, "frames", "hrp", {"stride": True},
                                options=RunOptions(dry_run=True)),
    lambda store: stages.encode(store, "frames", "hrp", {"C": True},
                                options=RunOptions(dry_run=True)),
    lambda store: stages.fit_gmm(store, "frames", name="m", n_components=True, dry_run=True),
    lambda store: stages.fit_pca(store, "frames", name="m", random_state=False, dry_run=True),
    lambda store: stages.classify(store, ["avg"], C=[True]),
], ids=["stride", "C", "n_components", "random_state", "classify C"])
def test_a_bool_is_no_number(world, call):
    """True == 1 in Python: taken for a number it would be a second key for stride = 1."""
    from featpipe.errors import ParameterError

    root, store = world
    with pytest.raises(ParameterError, match=r"must be .*, got (True|False)$"):
        call(store)


def test_cache_show_prints_the_record(cli, world):
    root, store = world
    result = cli("cache", "show", "-s", store.root, "g")
    assert result.exit_code == 0, result.output
    assert '  n_components: 2\n' in result.output and '  tol: 1e-05\n' in result.output
    assert '  sample: 50\n' in result.output and '  max_iter: 5\n' in result.output
