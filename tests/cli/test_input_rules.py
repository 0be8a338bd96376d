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
