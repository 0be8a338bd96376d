"""Issue 16 items 5 and 14: a bad parameter is a usage error (exit 2) before any stage exists,
and a name moves only to a complete stage (and says so when it moves)."""

from __future__ import annotations

import re

import numpy as np
import pytest

from featpipe.manifest import from_rows
from featpipe.store import Store
from tests._stores import six_sequences


@pytest.fixture
def store(tmp_path, cli):
    """Six labelled sequences (train/test) and a complete hrp stage named e_hrp."""
    store = six_sequences(tmp_path)
    good = cli("encode", "--store", store.root, "--input", "seq", "--method", "hrp",
               "--window", "4", "--name", "e_hrp")
    assert good.exit_code == 0, good.output
    return store


def _state(store: Store):
    return sorted(p.name for p in store.stages_dir.iterdir()), store.names()


def _usage_error(cli, store, *args, flag):
    before = _state(store)
    result = cli(*args)
    assert result.exit_code == 2, result.output
    assert f"error: {flag} " in result.stderr, result.stderr
    assert _state(store) == before  # no stage folder, no name moved
    return result.stderr


BAD_ENCODE = [("--window", "0"), ("--stride", "0"), ("--depth", "0"), ("--C", "0"),
              ("--C", "-1"), ("--C", "nan"), ("--C", "inf"), ("--epsilon", "-0.1"),
              ("--emit-layer", "3")]


@pytest.mark.parametrize("flag, value", BAD_ENCODE)
def test_bad_encode_values_are_usage_errors_before_any_stage(cli, store, flag, value):
    message = _usage_error(cli, store, "encode", "--store", store.root, "--input", "seq",
                           "--method", "hrp", flag, value, "--name", "e_hrp", flag=flag)
    assert "t0" not in message  # a parameter, not an item, is to blame
    # cache gc keeps the complete stage that e_hrp still points to
    assert cli("cache", "gc", "--store", store.root, "--min-age", "0").exit_code == 0
    assert store.resolve("e_hrp").is_complete()


@pytest.mark.parametrize("flag, value", [("--fps", "inf"), ("--fps", "nan"), ("--fps", "0"),
                                         ("--every", "0"), ("--frames", "0"),
                                         ("--decode-timeout", "inf")])
def test_bad_extract_sampling_or_timeout_is_a_usage_error_before_any_stage(
        cli, store, tmp_path, flag, value):
    manifest = tmp_path / "m.csv"
    manifest.write_text("id,path,label,split1\nclip,clip.mp4,a,train\n")
    for dry_run in ([], ["--dry-run"]):
        message = _usage_error(cli, store, "extract", "--manifest", manifest, "--store",
                               store.root, "--features", "dsift", flag, value, *dry_run,
                               flag=flag)
        assert f"got {value}" in message and len(message.strip().splitlines()) == 1


def test_emit_layer_beyond_depth_says_why(cli, store):
    message = _usage_error(cli, store, "encode", "--store", store.root, "--input", "seq",
                           "--method", "hrp", "--emit-layer", "3", flag="--emit-layer")
    assert "error: --emit-layer must be between 1 and depth=2, got 3" in message


def test_cuda_without_a_gpu_is_a_usage_error(cli, store):
    import torch

    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    message = _usage_error(cli, store, "encode", "--store", store.root, "--input", "seq",
                           "--method", "hrp", "--device", "cuda", "--name", "e_hrp",
                           flag="--device")
    assert "no GPU" in message


def test_fit_pca_dim_zero_is_a_usage_error_naming_the_flag(cli, store):
    message = _usage_error(cli, store, "fit", "pca", "--store", store.root, "--input", "seq",
                           "--dim", "0", "--name", "p", flag="--n-components")
    assert "error: --n-components (--dim) must be an int in the range [1, inf), got 0" \
        in message


def test_a_name_that_moves_says_so(cli, store):
    before = store.resolve("e_hrp").name
    result = cli("encode", "--store", store.root, "--input", "seq", "--method", "rankpool",
                 "--name", "e_hrp")
    assert result.exit_code == 0
    after = store.resolve("e_hrp").name
    assert f"name e_hrp moved from {before} (hrp) to {after} (rankpool)" in result.stderr
    again = cli("encode", "--store", store.root, "--input", "seq", "--method", "rankpool",
                "--name", "e_hrp")
    assert "moved" not in again.stderr  # same stage: nothing moves


def test_an_incomplete_run_does_not_move_the_name(cli, store):
    stage = store.resolve("seq")
    stage.write_item("t5", np.zeros((0, 3), np.float32))  # an empty sequence fails hrp
    before = store.resolve("e_hrp").name
    result = cli("encode", "--store", store.root, "--input", "seq", "--method", "hrp",
                 "--window", "5", "--name", "e_hrp")
    assert result.exit_code == 1
    folder = re.search(r"name e_hrp not moved: stage (encode-\w+) is incomplete \((\d) of 6 "
                       r"items done\)", result.stderr)
    assert folder and folder.group(1) != before
    assert store.resolve("e_hrp").name == before
    status = cli("status", "--store", store.root, "e_hrp")  # follows the run
    assert f"stage {folder.group(1)}" in status.output and "incomplete" in status.output
    assert cli("cache", "gc", "--store", store.root, "--min-age", "0").exit_code == 0
    assert (store.stages_dir / folder.group(1)).is_dir()  # its computed items are kept


def test_the_shard_that_completes_the_stage_moves_the_name(cli, store):
    first = cli("encode", "--store", store.root, "--input", "seq", "--method", "avg",
                "--name", "avg", "--shard", "0/2")
    assert first.exit_code == 0 and "name avg not moved" in first.stderr
    assert "avg" not in store.names()
    second = cli("encode", "--store", store.root, "--input", "seq", "--method", "avg",
                 "--name", "avg", "--shard", "1/2")
    assert second.exit_code == 0 and "not moved" not in second.stderr
    assert store.resolve("avg").is_complete()


@pytest.mark.parametrize("shard", ["3/2", "abc", "1/0"])
def test_bad_shards_are_usage_errors(cli, store, shard):
    message = _usage_error(cli, store, "encode", "--store", store.root, "--input", "seq",
                           "--method", "avg", "--shard", shard, flag="--shard")
    assert "must be I/N with 0 <= I < N" in message


@pytest.mark.parametrize("args, flag", [
    (["--C", "0"], "--C"), (["--C", "-1"], "--C"), (["--C", "nan"], "--C"),
    (["--C", "inf"], "--C"), (["--C", "1,10", "--cv", "1"], "--cv"),
    (["--input", "e_hrp", "--weights", "1,-1"], "--weights"),
    (["--kernel", "chi2-exp", "--gamma", "-1"], "--gamma"),
    (["--kernel", "chi2-map", "--order", "-1"], "--order"),
])
def test_bad_classify_values_are_usage_errors(cli, store, args, flag):
    _usage_error(cli, store, "classify", "--store", store.root, "--input", "e_hrp", *args,
                 flag=flag)


def test_classify_accepts_good_values(cli, store):
    result = cli("classify", "--store", store.root, "--input", "e_hrp", "--C", "10")
    assert result.exit_code == 0, result.output


@pytest.mark.parametrize("command", [
    ["encode", "--input", "seq", "--method", "avg"],
    ["fit", "pca", "--input", "seq", "--dim", "2"],
    ["import", "--from", "nowhere.npz", "--manifest", "MANIFEST"],
    ["extract", "--manifest", "MANIFEST", "--features", "dsift"],
])
def test_a_name_with_a_path_is_refused_before_any_stage(cli, store, tmp_path, command):
    manifest = tmp_path / "m.csv"
    from_rows([("a", "a.mp4", ["x"], ["train"])], root=tmp_path).write(manifest)
    command = [str(manifest) if part == "MANIFEST" else part for part in command]
    message = _usage_error(cli, store, *command, "--store", store.root, "--name", "../../evil",
                           flag="--name")
    assert "'../../evil'" in message
    assert not (tmp_path / "evil").exists()


def test_fisher_without_a_gmm_says_which_fit_makes_one(cli, store):
    message = _usage_error(cli, store, "encode", "--store", store.root, "--input", "seq",
                           "--method", "fisher", "--name", "fv", flag="--gmm")
    assert "--gmm is required by --method fisher" in message
    assert "`featpipe fit gmm`" in message
