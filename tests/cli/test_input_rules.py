"""Input that was accepted and then broke work, refused up front with one line (issue 31
section 3): two pipeline steps with one name, integral floats, Unicode normalisation of
manifest ids against file names, encode parameters that fit no item."""

from __future__ import annotations

import re

import pytest

from featpipe.pipeline import PipelineError, load_pipeline

FRAMES = "[steps.frames]\nstage = 'import_features'\nsources = ['x.ts']\n"


@pytest.mark.parametrize("steps, message", [
    ("[steps.a]\nstage = 'encode'\ninput = 'frames'\nmethod = 'avg'\nname = 'e'\n"
     "[steps.b]\nstage = 'encode'\ninput = 'frames'\nmethod = 'max'\nname = 'e'\n",
     "step 'b' (encode): name 'e' is already the name of step 'a' (encode)"),
    ("[steps.a]\nstage = 'encode'\ninput = 'frames'\nmethod = 'avg'\n"
     "[steps.b]\nstage = 'encode'\ninput = 'frames'\nmethod = 'max'\nname = 'a'\n",
     "step 'b' (encode): name 'a' is already the name of step 'a' (encode)"),
])
def test_two_steps_naming_one_stage_are_refused_when_the_file_is_checked(tmp_path, steps,
                                                                        message, cli):
    """Before: accepted, and the name flipped between the two stages on every run."""
    path = tmp_path / "p.toml"
    path.write_text(FRAMES + steps)
    with pytest.raises(PipelineError, match=re.escape(message)):
        load_pipeline(path)
    proc = cli("run", path, "--store", tmp_path / "s")
    assert proc.exit_code == 2 and message in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "s").exists()


@pytest.fixture
def frames(tmp_path, cli):
    from tests._stores import write_npy_dataset

    manifest = write_npy_dataset(tmp_path / "data", n=3, dim=4)
    cli("import", "--manifest", manifest, "--from", tmp_path / "data" / "npy", "--store",
        tmp_path / "s", "--name", "frames", check=True)
    return tmp_path / "s"


def planned_stage(output: str) -> str:
    return next(line.split()[1] for line in output.splitlines() if line.startswith("stage "))


def test_an_integral_float_is_one_rule_on_the_command_line_and_in_a_pipeline(tmp_path, frames,
                                                                            cli):
    """Before: the command line refused ``--window 20.0`` that a pipeline file took."""
    encode = ("encode", "--store", frames, "--input", "frames", "--method", "hrp",
              "--dry-run", "--window")
    whole, written_as_float = cli(*encode, "20"), cli(*encode, "20.0")
    assert whole.exit_code == 0 and written_as_float.exit_code == 0, written_as_float.output
    assert planned_stage(whole.output) == planned_stage(written_as_float.output)
    from featpipe.store import Store

    path = tmp_path / "p.toml"
    source = Store(frames).resolve("frames").name
    path.write_text(f"[steps.e]\nstage = 'encode'\ninput = '{source}'\nmethod = 'hrp'\n"
                    "params = { window = 20.0 }\n")
    run = cli("run", path, "--store", frames, "--dry-run")
    assert run.exit_code == 0 and planned_stage(whole.output) in run.output, run.output
    half = cli(*encode, "20.5")
    assert half.exit_code == 2 and "must be a whole number, got '20.5'" in half.stderr
    path.write_text(path.read_text().replace("20.0", "20.5"))
    refused = cli("run", path, "--store", frames)
    assert refused.exit_code == 2 and "window must be an int" in refused.stderr
    for sizes, taken in (("4.0,8", True), ("4.5,8", False)):  # a list option: the same rule
        listed = cli("extract", "-m", tmp_path / "none.csv", "-s", frames, "-f", "dsift",
                     "--sizes", sizes, "--dry-run")
        assert ("expected comma-separated int values" not in listed.stderr) == taken, sizes


def test_an_id_and_a_file_name_in_other_unicode_normalisations_are_named_as_such(tmp_path,
                                                                                cli):
    """Before: ``not found`` (or ``does not exist``) with two names that print the same."""
    import unicodedata

    import numpy as np

    composed = unicodedata.normalize("NFC", "café")
    decomposed = unicodedata.normalize("NFD", "café")
    assert composed != decomposed
    (tmp_path / "npy").mkdir()
    np.save(tmp_path / "npy" / f"{decomposed}.npy", np.ones((2, 3), np.float32))
    np.save(tmp_path / "npy" / "tea.npy", np.ones((2, 3), np.float32))
    manifest = tmp_path / "m.csv"
    manifest.write_text(f"id,path,label,split1\n{composed},npy/{composed}.npy,a,train\n"
                        "tea,npy/tea.npy,b,train\n", encoding="utf-8")
    checked = cli("manifest", "check", manifest)
    assert checked.exit_code == 1 and "differs in Unicode normalisation (NFC here, NFD on " \
        "disk)" in checked.output, checked.output
    imported = cli("import", "--manifest", manifest, "--from", tmp_path / "npy", "--store",
                   tmp_path / "s", "--name", "f", "--on-error", "skip")
    assert "differs in Unicode normalisation (NFC here, NFD on disk)" in imported.output, \
        imported.output


def test_a_depth_no_item_can_fit_is_a_usage_error_before_the_stage_exists(frames, cli):
    """Before: ``--depth 50`` made a stage, then every item failed with ``MemoryError ...
    64.0 PiB``."""
    from featpipe.store import Store

    before = {s.name for s in Store(frames).all_stages()}
    encode = ("encode", "--store", frames, "--input", "frames", "--method", "hrp",
              "--depth", "50")
    refused = cli(*encode)
    assert refused.exit_code == 2 and "Traceback" not in refused.stderr
    assert "--depth 50 with psi ser doubles the dimension 50 times: each item's vector needs " \
        "4096.0 TiB per input feature" in refused.stderr, refused.stderr
    assert {s.name for s in Store(frames).all_stages()} == before
    assert cli(*encode, "--psi", "ssr", "--dry-run").exit_code == 0  # the dimension stays
    assert cli(*encode[:-1], "20", "--dry-run").exit_code == 0


def test_extract_names_a_video_path_in_another_unicode_normalisation(tmp_path, cli):
    import unicodedata

    from tests.cli.test_extract_cli import write_manifest
    from tests.unit.test_video import write_video

    write_video(tmp_path / unicodedata.normalize("NFD", "café.mp4"), n_frames=4,
                size=(96, 80))
    manifest = write_manifest(tmp_path, [("v", unicodedata.normalize("NFC", "café.mp4"), "a",
                                          "train")])
    result = cli("extract", "-m", manifest, "-s", tmp_path / "s", "-f", "dsift", "--sizes",
                 "4", "--every", "2")
    assert result.exit_code == 1
    assert "differs in Unicode normalisation (NFC here, NFD on disk)" in result.output, \
        result.output
