"""``featpipe classify`` end to end on real data (aeon's BasicMotions), reports, bad input."""

from __future__ import annotations

import json
import re

import numpy as np
import pytest
from sklearn.svm import SVC

from featpipe.manifest import from_rows
from featpipe.store import Store
from tests._stores import make_old


def _basic_motions():
    aeon = pytest.importorskip("aeon.datasets")
    X_train, y_train = aeon.load_basic_motions(split="train")
    X_test, y_test = aeon.load_basic_motions(split="test")
    return X_train, y_train, X_test, y_test


@pytest.fixture(scope="module")
def motions(tmp_path_factory):
    """BasicMotions in a store: per-frame T×6 items, then average pooling as an encode stage."""
    X_train, y_train, X_test, y_test = _basic_motions()
    root = tmp_path_factory.mktemp("motions")
    rows, series = [], {}
    for part, X, y in (("train", X_train, y_train), ("test", X_test, y_test)):
        for n, (x, label) in enumerate(zip(X, y, strict=True)):
            item_id = f"{part}/{n:03d}"
            rows.append((item_id, "", [str(label)], [part]))
            series[item_id] = x.T  # (T, 6) per-frame features
    manifest = from_rows(rows, root, n_splits=1)
    store = Store(root / "store")
    frames = store.stage("import", {"source": "aeon:BasicMotions"}, items=manifest)
    for item_id, x in series.items():
        frames.write_item(item_id, x)
    store.set_name("frames", frames)
    pooled = store.stage("encode", {"method": "avg"}, inputs=[frames])
    for item_id in manifest.ids:
        pooled.write_item(item_id, frames.read_item(item_id).mean(axis=0))
    store.set_name("avg", pooled)
    means = {i: series[i].astype(np.float32).mean(axis=0) for i in manifest.ids}
    return store, manifest, means, (y_train, y_test)


def _sklearn_one_vs_rest(K_train, K_test, y_train, C=1000.0):
    classes = np.unique(y_train)
    scores = np.column_stack([SVC(kernel="precomputed", C=C).fit(K_train, y_train == c)
                              .decision_function(K_test) for c in classes])
    return classes[scores.argmax(1)]


def test_basic_motions_end_to_end(motions, tmp_path, cli):
    store, manifest, means, (y_train, y_test) = motions
    report = tmp_path / "out" / "report.json"
    proc = cli("classify", "--store", store.root, "--input", "avg", "--kernel", "chi2",
               "--C", "1000", "--split", "1", "--normalize", "none", "--report", report,
               check=True)
    # Expected 40/40.  Why: the per-channel means of the smartwatch signals (accelerometer and
    # gyroscope) already separate standing, walking, running and badminton (by their
    # magnitudes too: hence --normalize none, not the default l2), and the signed
    # chi-square kernel (VLFeat's rule) separates them fully: an independent one-vs-rest
    # scikit-learn SVC (C = 1000) on a literal numpy transcription of that kernel classifies
    # all 40 test series correctly (the linear kernel on the same vectors gets 34/40), and
    # featpipe must agree item by item.
    X_train = np.array([means[i] for i in manifest.split_ids(1, "train")], dtype=np.float64)
    X_test = np.array([means[i] for i in manifest.split_ids(1, "test")], dtype=np.float64)

    def literal_chi2(A, B):
        a, b = A[:, None, :], B[None, :, :]
        return (2 * a * b / (np.abs(a) + np.abs(b))).sum(-1)

    expected = _sklearn_one_vs_rest(literal_chi2(X_train, X_train),
                                    literal_chi2(X_test, X_train), y_train)
    assert np.mean(expected == y_test) == 1.0
    assert "split 1: accuracy 1.0000 (40/40)" in proc.stdout
    data = json.loads(report.read_text())
    assert data["summary"]["mean"] == 1.0
    assert [p["predicted"] for p in data["splits"][0]["predictions"]] == list(expected)
    assert data["config"]["kernels"] == ["chi2"] and "libsvm-official" in data["versions"]
    assert np.trace(np.array(data["splits"][0]["confusion"])) == 40
    for suffix in (".md", ".split1.confusion.png", ".split1.ap.png"):
        assert (tmp_path / "out" / f"report{suffix}").stat().st_size > 0


def test_basic_motions_ssr_matches_independent_reference(motions, cli):
    # SSR discards magnitude information that separates walking from running, so this
    # kernel is not perfect; whatever it gets must equal scikit-learn's SVC on the literal
    # L2(SSR(x)) vectors.
    store, manifest, means, (y_train, y_test) = motions
    result = cli("classify", "--store", store.root, "--input", "avg", "--kernel", "ssr")
    assert result.exit_code == 0, result.output

    def ssr(X):
        Z = np.sign(X) * np.sqrt(np.abs(X))
        return Z / np.linalg.norm(Z, axis=1, keepdims=True)

    X_train = ssr(np.array([means[i] for i in manifest.split_ids(1, "train")], np.float64))
    X_test = ssr(np.array([means[i] for i in manifest.split_ids(1, "test")], np.float64))
    expected = _sklearn_one_vs_rest(X_train @ X_train.T, X_test @ X_train.T, y_train)
    n_correct = int(np.sum(expected == y_test))
    assert n_correct < 40
    assert f"accuracy {n_correct / 40:.4f} ({n_correct}/40)" in result.output


def test_normalize_l2_matches_an_independent_reference(motions, cli, tmp_path):
    # --normalize l2 divides each encoding by its norm before the kernel: the predictions must
    # equal scikit-learn's SVC on the literal L2-normalised vectors with a linear kernel.
    store, manifest, means, (y_train, y_test) = motions
    report = tmp_path / "l2.json"
    result = cli("classify", "--store", store.root, "--input", "avg", "--kernel", "linear",
                 "--normalize", "l2", "--report", report)
    assert result.exit_code == 0, result.output

    def l2(ids):
        X = np.array([means[i] for i in ids], np.float64)
        return X / np.linalg.norm(X, axis=1, keepdims=True)

    X_train, X_test = l2(manifest.split_ids(1, "train")), l2(manifest.split_ids(1, "test"))
    expected = _sklearn_one_vs_rest(X_train @ X_train.T, X_test @ X_train.T, y_train)
    data = json.loads(report.read_text())
    assert data["config"]["normalize"] == "l2"
    assert [p["predicted"] for p in data["splits"][0]["predictions"]] == list(expected)


def test_l2_is_the_default_normalisation_everywhere(cli):
    """The command line, the Python API, its argument check and the experiment's settings
    (issue 49: every recipe of the docs passed --normalize l2)."""
    import inspect

    from featpipe import stages
    from featpipe.classify.experiment import Settings
    from featpipe.cli.classify import classify
    from featpipe.stages.classification import check_arguments

    option = next(p for p in classify.params if p.name == "normalize")
    assert option.default == "l2" == Settings().normalize
    for function in (stages.classify, check_arguments):
        assert inspect.signature(function).parameters["normalize"].default == "l2"
    assert "[default: l2]" in " ".join(cli("classify", "--help").output.split())


def test_fusion_cv_and_liblinear(motions, cli):
    from sklearn.metrics import average_precision_score
    from sklearn.svm import LinearSVC

    from tests.cli.test_pipeline import literal_chi2

    store, manifest, means, (y_train, y_test) = motions
    X_train = np.array([means[i] for i in manifest.split_ids(1, "train")], np.float64)
    X_test = np.array([means[i] for i in manifest.split_ids(1, "test")], np.float64)
    result = cli("classify", "--store", store.root, "--input", "avg", "--input", "avg",
                 "--kernel", "chi2", "--kernel", "linear", "--weights", "1,3",
                 "--C", "0.1,10,1000", "--cv", "4", "--normalize", "none")
    assert result.exit_code == 0, result.output
    found = re.search(r"split 1: accuracy ([0-9.]+) \((\d+)/40\), C=([0-9.]+) by 4-fold cv",
                      result.output)
    assert found, result.output
    # the weighted average kernel (weights 1, 3 -> 1/4, 3/4) of a literal chi-square and the
    # linear kernel, each divided by the mean of its train diagonal k(x, x) (issue 40: the
    # linear kernel of these means is about 4 times the chi-square one there), scikit-learn's
    # libsvm at the chosen C: the same test accuracy
    chi2_diag = np.diagonal(literal_chi2(X_train, X_train)).mean()
    linear_diag = np.einsum("ij,ij->i", X_train, X_train).mean()
    assert linear_diag > 3 * chi2_diag

    def fused(A, B, scaled=True):
        s, t = (chi2_diag, linear_diag) if scaled else (1.0, 1.0)
        return 0.25 * literal_chi2(A, B) / s + 0.75 * A @ B.T / t

    expected = _sklearn_one_vs_rest(fused(X_train, X_train), fused(X_test, X_train), y_train,
                                    C=float(found.group(3)))
    assert int(found.group(2)) == int(np.sum(expected == y_test))
    assert float(found.group(1)) == pytest.approx(np.mean(expected == y_test), abs=1e-4)
    as_computed = cli("classify", "--store", store.root, "--input", "avg", "--input", "avg",
                      "--kernel", "chi2", "--kernel", "linear", "--weights", "1,3",
                      "--fusion-scale", "none", "--C", "1000", "--normalize", "none")
    expected = _sklearn_one_vs_rest(fused(X_train, X_train, False),
                                    fused(X_test, X_train, False), y_train)
    assert f"split 1: accuracy {np.mean(expected == y_test):.4f} " in as_computed.output
    result = cli("classify", "--store", store.root, "--input", "avg", "--kernel", "linear",
                 "--solver", "liblinear", "--C", "10", "--metric", "map", "--normalize", "none")
    assert result.exit_code == 0, result.output
    mean_ap = float(re.search(r"split 1: map ([0-9.]+), C=10", result.output).group(1))
    # liblinear -s 3 -B 1 at the optimum (scikit-learn's LinearSVC, hinge loss, tol 1e-8);
    # featpipe stops at liblinear's default -e 0.1, so the ranking can differ slightly
    aps = [average_precision_score(y_test == c, LinearSVC(
        C=10, loss="hinge", tol=1e-8, max_iter=10**6).fit(X_train, y_train == c)
        .decision_function(X_test)) for c in np.unique(y_train)]
    assert mean_ap == pytest.approx(np.mean(aps), abs=0.01)
    result = cli("classify", "--store", store.root, "--input", "avg", "--kernel", "chi2",
                 "--solver", "liblinear")
    assert result.exit_code == 2  # a usage error: found before any kernel is computed
    assert "error: --solver liblinear needs explicit-feature kernels" in result.output


def _store_with(tmp_path, rows, vectors):
    manifest = from_rows(rows, tmp_path, n_splits=max(len(r[3]) for r in rows))
    store = Store(tmp_path / "store")
    stage = store.stage("encode", {"method": "test", "n": len(rows)}, items=manifest)
    for item_id, vector in vectors.items():
        stage.write_item(item_id, vector)
    store.set_name("enc", stage)
    return store


GOOD = [("a", "", ["x"], ["train"]), ("b", "", ["y"], ["train"]),
        ("c", "", ["x"], ["test"]), ("d", "", ["y"], ["test"])]


@pytest.mark.parametrize("rows, vectors, message", [
    ([("a", "", [], ["train"])] + GOOD[1:], None, "a: train item of split 1 has no label"),
    (GOOD[:3] + [("d", "", ["z"], ["test"])], None, "class 'z' of this test item appears in "
                                                     "no train item"),
    (GOOD, {"d": np.ones(5)}, "d: test item of input encode-"),
    (GOOD[:2] + [("c", "", ["x"], [""]), ("d", "", ["y"], [""])], None,
     "split 1 has no test items"),
    (GOOD, {"b": np.ones((3, 4))}, "has shape (3, 4); classify needs one vector per item"),
])
def test_bad_input_is_one_clear_line(tmp_path, cli, rows, vectors, message):
    base = {r[0]: np.arange(1.0, 5.0) + i for i, r in enumerate(rows)}
    base.update(vectors or {})
    store = _store_with(tmp_path, rows, base)
    result = cli("classify", "--store", store.root, "--input", "enc", "--kernel", "chi2")
    assert result.exit_code == 1
    assert message in result.output, result.output
    assert "Traceback" not in result.output


def test_nan_and_negative_inputs(tmp_path, cli):
    store = _store_with(tmp_path, GOOD, {"a": np.array([1.0, -2.0]), "b": np.array([0.5, 1.0]),
                                         "c": np.array([1.0, 2.0]), "d": np.array([2.0, 1.0])})
    result = cli("classify", "--store", store.root, "--input", "enc", "--kernel", "chi2-exp")
    assert result.exit_code == 1
    assert "chi2-exp needs non-negative inputs" in result.output and "use 'chi2'" in \
        result.output
    stage = store.resolve("enc")
    np.save(stage.item_path("c"), np.array([np.nan, 1.0], dtype=np.float32))  # bypasses checks
    result = cli("classify", "--store", store.root, "--input", "enc", "--kernel", "chi2")
    assert result.exit_code == 1  # the file no longer has the checksum it was written with
    assert "c: test item of input" in result.output and "damaged" in result.output
    make_old(store.root, item_sums=False)  # a store from before checksums
    result = cli("classify", "--store", store.root, "--input", "enc", "--kernel", "chi2")
    assert result.exit_code == 1
    assert "c: test item of input" in result.output and "NaN" in result.output


def test_usage_errors_exit_2(motions, cli):
    store = motions[0]
    proc = cli("classify", "--store", store.root, "--input", "avg", "--input", "avg",
               "--kernel", "chi2", "--kernel", "ssr", "--kernel", "linear")
    assert proc.exit_code == 2 and "--kernel needs one value for all inputs" in proc.stderr
    result = cli("classify", "--store", store.root, "--input", "avg", "--split", "3")
    assert result.exit_code == 2 and "split 3 does not exist" in result.output
    result = cli("classify", "--store", store.root, "--input", "nope")
    assert result.exit_code == 1 and "no stage named 'nope'" in result.output


def test_multilabel_map_and_all_splits(tmp_path, cli):
    # synthetic multi-label set: 3 labels, each switches on its own group of dimensions
    rng = np.random.default_rng(5)
    rows, vectors, truth = [], {}, {}
    for n in range(48):
        labels = [c for c in "abc" if rng.random() < 0.45] or ["a"]
        x = rng.random(9) * 0.5
        for c in labels:
            x["abc".index(c) * 3:"abc".index(c) * 3 + 3] += rng.random(3)
        splits = ["train" if n % 3 else "test", "test" if n % 3 else "train"]
        rows.append((f"m{n}", "", labels, splits))
        vectors[f"m{n}"], truth[f"m{n}"] = x, labels
    assert any(len(r[2]) > 1 for r in rows)
    store = _store_with(tmp_path, rows, vectors)
    report = tmp_path / "ml.json"
    result = cli("classify", "--store", store.root, "--input", "enc", "--kernel", "chi2",
                 "--C", "1", "--split", "all", "--report", report)
    assert result.exit_code == 0, result.output
    data = json.loads(report.read_text())
    assert data["summary"]["metric"] == "map" and data["summary"]["splits"] == [1, 2]
    from sklearn.metrics import average_precision_score

    values = []
    for split in data["splits"]:
        classes = split["classes"]
        Y = np.array([[c in p["labels"] for c in classes] for p in split["predictions"]])
        S = np.array([p["scores"] for p in split["predictions"]])
        values.append(np.mean([average_precision_score(Y[:, c], S[:, c])
                               for c in range(len(classes))]))
        assert split["map"] == pytest.approx(values[-1], rel=1e-12)
    assert data["summary"]["mean"] == pytest.approx(np.mean(values), rel=1e-12)
    assert data["summary"]["std"] == pytest.approx(np.std(values), rel=1e-9)
    assert f"map: {np.mean(values):.4f} ± {np.std(values):.4f} over 2 split(s)" in \
        result.output
    assert "| a |" in (tmp_path / "ml.md").read_text()
    result = cli("classify", "--store", store.root, "--input", "enc", "--metric", "accuracy")
    assert result.exit_code == 2 and "error: --metric accuracy is undefined for multi-label" \
        in result.output


def test_per_class_accuracy_and_ap_on_stdout(tmp_path, cli):
    """Issue 23: the per-class numbers are printed, not only written to the report."""
    rows = [("a", "", ["x"], ["train"]), ("b", "", ["y"], ["train"]),
            ("c", "", ["x"], ["test"]), ("d", "", ["y"], ["test"]), ("e", "", ["y"], ["test"])]
    vectors = {"a": [1.0, 0.0], "b": [0.0, 1.0], "c": [0.9, 0.1], "d": [0.2, 0.8],
               "e": [0.8, 0.3]}  # e (a y) looks like an x
    store = _store_with(tmp_path, rows, {k: np.array(v) for k, v in vectors.items()})
    proc = cli("classify", "--store", store.root, "--input", "enc", "--C", "10", check=True)
    lines = proc.stdout.splitlines()
    start = lines.index("per class (split 1):")
    assert lines[start + 1].split() == ["class", "accuracy", "AP"]
    # x: c correct (1/1); its scores rank c (0.9) above e (0.8): AP 1. y: d right, e wrong
    # (1/2); y's scores rank d first, then e, then c: AP 1.
    assert lines[start + 2].split() == ["x", "1.0000", "(1/1)", "1.0000"]
    assert lines[start + 3].split() == ["y", "0.5000", "(1/2)", "1.0000"]


def _few_per_class(tmp_path, per_class):
    """Train items: per_class[c] of class c; two test items per class."""
    rng = np.random.default_rng(3)
    rows, vectors = [], {}
    for c, n in enumerate(per_class):
        for j in range(n + 2):
            item_id = f"c{c}_{j}"
            rows.append((item_id, "", [f"k{c}"], ["train" if j < n else "test"]))
            vectors[item_id] = rng.random(4) + np.eye(4)[c]
    return _store_with(tmp_path, rows, vectors)


def test_default_cv_uses_the_folds_the_smallest_class_allows(tmp_path, cli):
    """Issue 23: the default --cv 5 with a class of 3 train items uses 3 folds and says so;
    an explicit --cv 5 is refused before training, naming the class and its count."""
    store = _few_per_class(tmp_path, [6, 3, 5])
    report = tmp_path / "r.json"
    proc = cli("classify", "--store", store.root, "--input", "enc", "--C", "1,10",
               "--report", report, check=True)
    assert "note: split 1: class 'k1' has 3 train items, so C is chosen by 3-fold " \
           "cross-validation instead of 5" in proc.stderr
    assert "by 3-fold cv" in proc.stdout
    data = json.loads(report.read_text())
    assert data["config"]["cv"] == 3 and data["splits"][0]["cv_folds"] == 3
    # the chosen C has the best mean fold accuracy among the recorded cv_scores
    scores = data["splits"][0]["cv_scores"]
    assert data["splits"][0]["C"] == max((float(c) for c in scores), key=lambda c:
                                         scores[repr(c)])
    explicit = cli("classify", "--store", store.root, "--input", "enc", "--C", "1,10",
                   "--cv", "5")
    assert explicit.exit_code == 2
    assert "error: --cv is 5, but class 'k1' has only 3 train items in split 1; use 3 or " \
           "fewer" in explicit.stderr
    assert cli("classify", "--store", store.root, "--input", "enc", "--C", "1,10", "--cv",
               "3").exit_code == 0
    lonely = _few_per_class(tmp_path / "one", [4, 1])
    result = cli("classify", "--store", lonely.root, "--input", "enc", "--C", "1,10")
    assert result.exit_code == 1
    assert "error: split 1: class 'k1' has 1 train item, too few to cross-validate" \
        in result.stderr
    # one C needs no cross-validation: the same store classifies
    assert cli("classify", "--store", lonely.root, "--input", "enc", check=True).exit_code == 0


def _stamps(paths) -> dict:
    return {p: (p.stat().st_ino, p.stat().st_mtime_ns) for p in paths}


def test_a_rerun_reuses_the_stored_result_and_touches_nothing(tmp_path, cli, monkeypatch):
    """Issue 30: the README says running any command again computes nothing, but `classify`
    retrained on every run and rewrote its report, and a rerun rewrote `names/*`.  The
    result is kept in a classify stage under its key; a rerun with the same inputs and options
    trains nothing, prints the same lines and leaves every file as it was (inode and mtime),
    the report's and the store's names alike; a report file that is missing or differs is
    written again."""
    import featpipe.stages.classification as classification

    store = _store_with(tmp_path, GOOD, {r[0]: np.arange(1.0, 5.0) + i
                                         for i, r in enumerate(GOOD)})
    import_args = ["import", "--manifest", tmp_path / "m.csv", "--from", tmp_path / "f.npz",
                   "--store", store.root, "--name", "imp"]
    from_rows(GOOD, tmp_path).write(tmp_path / "m.csv")
    np.savez(tmp_path / "f.npz", **{r[0]: np.ones((2, 2)) for r in GOOD})
    cli(*import_args, check=True)
    args = ["classify", "--store", store.root, "--input", "enc", "--kernel", "chi2",
            "--report", tmp_path / "r" / "r.json"]
    first = cli(*args, check=True)
    key = first.stdout.splitlines()[0].removeprefix("classify ")
    assert (store.stages_dir / f"classify-{key}" / "stage.json").exists()
    report_files = sorted((tmp_path / "r").iterdir())
    assert len(report_files) == 4  # json, md, confusion and AP plots
    watched = [*report_files, *sorted(store.names_dir.iterdir())]
    before = _stamps(p for p in watched if p.is_file())

    def no_training(*_, **__):
        raise AssertionError("a rerun trained again")

    monkeypatch.setattr(classification, "run_split", no_training)
    again = cli(*args, check=True)
    reused = f"reused the stored result of stage classify-{key} (computed "
    lines = again.stdout.splitlines()
    assert lines[1].startswith(reused) and lines[1].endswith("); nothing trained")
    assert lines[:1] + lines[2:] == first.stdout.splitlines()
    cli(*import_args, check=True)  # a rerun of an item stage: its name stays as it was
    assert _stamps(before) == before
    (tmp_path / "r" / "r.md").unlink()
    (tmp_path / "r" / "r.json").write_text("{}")
    cli(*args, check=True)
    after = _stamps(before)
    assert (tmp_path / "r" / "r.md").exists()
    changed = {p.name for p in before if after[p] != before[p]}
    assert changed == {"r.md", "r.json"}


def test_a_damaged_stored_result_is_named_and_computed_again(tmp_path, cli):
    store = _store_with(tmp_path, GOOD, {r[0]: np.arange(1.0, 5.0) + i
                                         for i, r in enumerate(GOOD)})
    args = ["classify", "--store", store.root, "--input", "enc"]
    first = cli(*args, check=True)
    key = first.stdout.splitlines()[0].removeprefix("classify ")
    (store.stages_dir / f"classify-{key}" / "models" / "result.json").write_text("{")
    again = cli(*args, check=True)
    assert "model 'result' of stage classify-" in again.stderr and \
        "computing the result again" in again.stderr
    assert again.stdout == first.stdout
    assert "reused the stored result" in cli(*args, check=True).stdout
