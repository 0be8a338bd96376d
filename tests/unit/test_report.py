"""Classification reports: row-normalised confusion matrices with class names at any class count
(51 and 101 synthetic classes, as HMDB51 and UCF101), sorted AP bars, and a Markdown report
that embeds the plots and records the command line, the input stages and the versions."""

import json
from pathlib import Path

import matplotlib.image
import numpy as np
import pytest

from featpipe.classify import metrics
from featpipe.classify.report import (
    build_report,
    class_order,
    markdown,
    row_normalised,
    write_report,
)
from tests.conftest import run_cli

CONFIG = {"store": "S", "inputs": ["hrp", "avg"], "kernels": ["chi2+ser", "linear"],
          "fusion": "average", "weights": None, "C": [1000.0], "cv": 5, "split": "1",
          "metric": "accuracy", "ap": "standard", "solver": "libsvm", "normalize": "l2"}


def synthetic_result(n_classes: int, seed: int = 0) -> dict:
    """Five test items per class; 70% right, the others confused with the next classes."""
    rng = np.random.default_rng(seed)
    classes = [f"Class{i:03d}_{'ApplyEyeMakeup' if i % 2 else 'Basketball'}"
               for i in range(n_classes)]
    true = np.repeat(np.arange(n_classes), 5)
    wrong = (true + rng.integers(1, 3, true.size)) % n_classes
    predicted = np.where(rng.random(true.size) < 0.7, true, wrong)
    ap = [float(v) for v in rng.uniform(0.2, 1.0, n_classes)]
    ap[3] = None  # a class without a positive test item
    return {"split": 1, "n_train": 10 * n_classes, "n_test": int(true.size),
            "classes": classes, "multilabel": False, "C": 1000.0, "cv_scores": {},
            "gammas": [None, None], "per_class_ap": ap,
            "map": float(np.mean([v for v in ap if v is not None])), "seconds": {},
            "accuracy": float(np.mean(true == predicted)),
            "n_correct": int(np.sum(true == predicted)),
            "per_class_accuracy": [None] * n_classes,
            "confusion": metrics.confusion_matrix(true, predicted, n_classes).tolist(),
            "predictions": [], "score": float(np.mean(true == predicted))}


def summary(result):
    return {"metric": "accuracy", "splits": [1], "values": [result["score"]],
            "mean": result["score"], "std": 0.0}


@pytest.mark.parametrize("n_classes", [51, 101])
def test_plots_scale_with_the_class_count(tmp_path, n_classes):
    small = synthetic_result(4)
    large = synthetic_result(n_classes)
    written = {}
    for name, result in (("small", small), ("large", large)):
        files = write_report(tmp_path / f"{name}.json",
                             build_report(CONFIG, [result], summary(result), [], "featpipe x"))
        written[name] = {p.name.split(".", 1)[1]: matplotlib.image.imread(p) for p in files
                         if p.suffix == ".png"}
    for kind in ("split1.confusion.png", "split1.ap.png"):
        small_image, large_image = written["small"][kind], written["large"][kind]
        assert large_image.shape[0] > 2 * small_image.shape[0]  # grows with the class count
    confusion = written["large"]["split1.confusion.png"]
    # at least ~10 pixels per class along each axis, so every class name has its own row
    assert min(confusion.shape[:2]) >= 10 * n_classes
    # the AP bar chart keeps one row of >= 18 pixels per class
    assert written["large"]["split1.ap.png"].shape[0] >= 18 * n_classes


def test_confusion_rows_are_normalised_and_large_sets_grouped_by_confusion():
    counts = np.array([[3, 1, 0], [0, 0, 0], [2, 2, 4]])
    np.testing.assert_allclose(row_normalised(counts),
                               [[0.75, 0.25, 0], [0, 0, 0], [0.25, 0.25, 0.5]])
    # 40 classes in 20 pairs that confuse each other (i with i + 20): grouping puts each
    # pair side by side; up to 30 classes the sorted order stays
    n = 40
    confusion = np.eye(n) * 0.6
    for i in range(20):
        confusion[i, i + 20] = confusion[i + 20, i] = 0.4
    order = list(class_order(confusion))
    assert sorted(order) == list(range(n))
    for i in range(20):
        assert abs(order.index(i) - order.index(i + 20)) == 1
    assert list(class_order(np.eye(30))) == list(range(30))


def test_markdown_embeds_plots_and_records_command_inputs_and_versions(tmp_path):
    result = synthetic_result(5)
    chain = [{"stage": "import-abc", "kind": "import", "params": {"sources": ["x.ts"]},
              "inputs": [], "names": ["frames"], "created": "2026-11-23T09:00:00+00:00"},
             {"stage": "encode-def", "kind": "encode", "params": {"method": "hrp", "window": 20},
              "inputs": ["import-abc"], "names": ["hrp"], "created": "2026-11-23T09:05:00+00:00"}]
    command = "featpipe classify --store S --input hrp --input avg --report r.json"
    files = write_report(tmp_path / "r.json", build_report(CONFIG, [result], summary(result),
                                                           chain, command))
    text = (tmp_path / "r.md").read_text()
    assert "![Confusion matrix (rows normalised), split 1](r.split1.confusion.png)" in text
    assert "![Average precision per class, split 1](r.split1.ap.png)" in text
    assert f"```\n{command}\n```" in text
    assert "`encode-def` (names: hrp) from import-abc" in text and '"window": 20' in text
    versions = json.loads((tmp_path / "r.json").read_text())["versions"]
    for package in ("featpipe", "numpy", "scikit-learn", "torch", "opencv", "python"):
        assert package in versions and f"{package} {versions[package]}" in text
    assert [p.name for p in files] == ["r.json", "r.md", "r.split1.confusion.png",
                                       "r.split1.ap.png"]
    library = markdown({**build_report(CONFIG, [result], summary(result)), "command": None})
    assert "Equivalent library call" in library


def test_classify_report_end_to_end_records_the_exact_command_and_chain(tmp_path):
    aeon = pytest.importorskip("aeon")
    data = Path(aeon.__file__).parent / "datasets" / "data" / "BasicMotions"
    store = tmp_path / "store"
    run_cli("import", "--from", data / "BasicMotions_TRAIN.ts", "--from",
            data / "BasicMotions_TEST.ts", "--store", store, "--name", "frames")
    run_cli("encode", "--store", store, "--input", "frames", "--method", "avg", "--name", "avg")
    args = ["classify", "--store", store, "--input", "avg", "--kernel", "chi2",
            "--report", tmp_path / "rep" / "avg.json"]
    run_cli(*args)
    report = json.loads((tmp_path / "rep" / "avg.json").read_text())
    assert report["command"] == "featpipe " + " ".join(str(a) for a in args)
    kinds = [entry["kind"] for entry in report["inputs_chain"]]
    assert kinds == ["import", "encode"]
    assert report["inputs_chain"][1]["params"]["method"] == "avg"
    assert report["inputs_chain"][1]["names"] == ["avg"]
    text = (tmp_path / "rep" / "avg.md").read_text()
    assert report["command"] in text and "avg.split1.confusion.png" in text
    image = matplotlib.image.imread(tmp_path / "rep" / "avg.split1.confusion.png")
    assert image.shape[0] >= 400  # 4 classes: a readable figure, not 270 px
