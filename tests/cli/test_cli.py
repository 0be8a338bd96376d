"""The command-line contract: --version, -v/-q, exit codes 0/1/2, progress only on terminals."""

import os
import pty
import select
import subprocess
import sys

import numpy as np
import pytest

from featpipe import __version__
from featpipe.cli import COMMANDS
from featpipe.manifest import from_rows
from tests.conftest import REPO, run_cli


def test_version(cli):
    result = cli("--version")
    assert result.exit_code == 0 and result.output.strip() == f"featpipe, version {__version__}"


@pytest.mark.parametrize("command", sorted(COMMANDS))
def test_every_registered_command_has_help(cli, command):
    result = cli(command, "--help")
    assert result.exit_code == 0, result.output
    usage = result.output.splitlines()[0]
    assert usage.startswith("Usage: ") and f" {command} " in usage


def test_exit_codes_0_1_2(tmp_path, cli):
    from tests.unit.test_video import write_video

    write_video(tmp_path / "a.mp4", n_frames=2)  # manifest check opens each video's header
    # train and test rows: a split without one of them is warned about on stderr
    (tmp_path / "m.csv").write_text("id,path,label,split1\na,a.mp4,run,train\n"
                                    "b,a.mp4,run,test\n")
    ok = run_cli("manifest", "check", tmp_path / "m.csv", check=False)
    assert ok.returncode == 0 and ok.stderr == ""
    (tmp_path / "s").mkdir()
    failure = run_cli("cache", "verify", "--store", tmp_path / "s", "nope", check=False)
    assert failure.returncode == 1
    assert failure.stderr.startswith("error: no stage named 'nope'") and \
        "Traceback" not in failure.stderr
    usage = run_cli("--no-such-flag", check=False)
    assert usage.returncode == 2 and "Usage:" in usage.stderr
    for args in (["manifest", "check"], ["no-such-command"],
                 ["import", "--from", tmp_path, "--store", tmp_path / "s"]):
        result = cli(*args)
        assert result.exit_code == 2 and "Usage:" in result.output, args


def import_args(tmp_path, n=30):
    ids = [f"x{i}" for i in range(n)]
    from_rows([(i, "", ["a"], ["train"]) for i in ids], tmp_path).write(tmp_path / "m.csv")
    np.savez(tmp_path / "f.npz", **{i: np.ones((2, 2)) for i in ids})
    return ["import", "--manifest", tmp_path / "m.csv", "--from", tmp_path / "f.npz",
            "--store", tmp_path / "s", "--name", "feat"]


def run_with_tty_stderr(args, program=(sys.executable, "-m", "featpipe")
                        ) -> tuple[int, str, str]:
    """Run featpipe (or another ``program``) with stderr on a pseudo-terminal; returns (code,
    stdout, terminal text)."""
    controller, terminal = pty.openpty()
    env = dict(os.environ, PYTHONPATH=str(REPO), COLUMNS="80")
    proc = subprocess.Popen([*program, *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=terminal, text=True)
    os.close(terminal)
    chunks = []
    while True:
        ready, _, _ = select.select([controller], [], [], 60)
        if not ready:
            break
        try:
            data = os.read(controller, 4096)
        except OSError:  # the terminal closed: the process has exited
            break
        if not data:
            break
        chunks.append(data)
    os.close(controller)
    stdout = proc.stdout.read()
    proc.wait(timeout=60)
    return proc.returncode, stdout, b"".join(chunks).decode(errors="replace")


def test_progress_bar_only_when_stderr_is_a_terminal(tmp_path):
    args = import_args(tmp_path)
    piped = run_cli(*args, "--force")
    assert piped.stderr == "" and "30 done" in piped.stdout
    code, stdout, terminal = run_with_tty_stderr(args + ["--force"])
    assert code == 0 and "30 done" in stdout
    assert "import" in terminal and "100%" in terminal
    code, stdout, terminal = run_with_tty_stderr(["-q", *args, "--force"])
    assert code == 0 and "30 done" in stdout and "100%" not in terminal


def test_verbose_and_quiet_flags(tmp_path):
    args = import_args(tmp_path, n=3)
    loud = run_cli("-v", *args)
    quiet = run_cli("-q", *args)
    assert loud.returncode == quiet.returncode == 0
    assert "3 done" in loud.stdout and "3 skipped" in quiet.stdout
    assert "INFO featpipe.stages.imports: 3 items; reference feature shape: arrays of shape " \
        "(N, 2)" in loud.stderr
    assert quiet.stderr == ""


def test_verbose_and_quiet_after_the_command_name(tmp_path):
    """Issue 23: ``featpipe import -v`` = ``featpipe -v import``; ``-v`` counts add up."""
    args = import_args(tmp_path, n=3)
    loud = run_cli(*args, "-v")
    assert "INFO featpipe.stages.imports: 3 items" in loud.stderr
    assert "DEBUG" not in loud.stderr
    quiet = run_cli(*args, "--force", "-q")
    assert quiet.stderr == "" and "3 done" in quiet.stdout
    both = run_cli("-v", *args, "-q", check=False)
    assert both.returncode == 2 and "-q and -v exclude each other" in both.stderr
    grouped = run_cli("cache", "ls", "--store", tmp_path / "s", "-q")
    assert grouped.returncode == 0 and "feat" in grouped.stdout
    louder = run_cli("-v", *args, "-v", "--force")  # -vv: a progress line at every update
    assert "progress: import feat 3/3 items (100%)" in louder.stderr
    assert "progress: import feat 3/3 items (100%)" not in run_cli(*args, "-v", "--force").stderr


def leaf_commands(group=None, path=()):
    """(words, command) for every command of the tree under ``group`` (the root by default)."""
    import click

    from featpipe.cli import cli as root

    group = group or root
    ctx = click.Context(group)
    for name in group.list_commands(ctx):
        command = group.get_command(ctx, name)
        if isinstance(command, click.Group):
            yield from leaf_commands(command, (*path, name))
        else:
            yield (*path, name), command


def test_every_command_takes_verbose_quiet_and_log_file_after_its_name(tmp_path):
    """Issue 23: ``-q``/``-v``/``--log-file`` after the name of every command, the
    subcommands of every group (manifest, example, cache, fit) included."""
    commands = dict(leaf_commands())
    assert {("manifest", "check"), ("example", "clips"), ("cache", "rm"),
            ("fit", "deep-gmm"), ("encode",)} <= set(commands)
    for words, command in commands.items():
        flags = {opt for param in command.params for opt in getattr(param, "opts", ())}
        assert {"-q", "-v", "--log-file"} <= flags, words
    # a warning of `manifest check` (no test rows), silenced by -q after the subcommand name
    (tmp_path / "m.csv").write_text("id,path,label,split1\na,a.avi,run,train\n")
    loud = run_cli("manifest", "check", tmp_path / "m.csv", "--no-files")
    assert "warning: split1 has no test rows" in loud.stderr
    quiet = run_cli("manifest", "check", tmp_path / "m.csv", "--no-files", "-q")
    assert quiet.stderr == "" and quiet.stdout == loud.stdout
    log = tmp_path / "run.log"
    run_cli("example", "pipeline", "--log-file", log)
    assert log.read_text().splitlines()[-1].split(" ", 2)[2].startswith(
        "INFO featpipe.output: exit status 0 after ")


def test_log_file_keeps_the_full_record_of_a_run(tmp_path):
    """Issue 23: --log-file (before or after the command, or $FEATPIPE_LOG_FILE) appends the
    command, every log level, the reported lines, progress and the exit status, even with
    -q; an error and its exit status too."""
    args = import_args(tmp_path, n=3)
    log = tmp_path / "logs" / "run.log"
    quiet = run_cli("-q", *args, "--log-file", log)
    assert quiet.stderr == ""
    text = log.read_text()
    lines = [line.split(" ", 2)[2] for line in text.splitlines()]  # without date and time
    assert lines[0].startswith("INFO featpipe.output: featpipe -q import --manifest ")
    assert "INFO featpipe.stages.imports: 3 items; reference feature shape: arrays of shape " \
        "(N, 2)" in lines
    assert "INFO featpipe.output: summary: 3 done, 0 skipped (already complete), 0 failed" \
        in lines
    assert any(line.startswith("INFO featpipe.output: progress: import feat 3/3 items in ")
               for line in lines)
    assert lines[-1].startswith("INFO featpipe.output: exit status 0 after ")
    bad = run_cli("encode", "--store", tmp_path / "s", "--input", "nope", "--method", "avg",
                  check=False, env={"FEATPIPE_LOG_FILE": str(log)})
    assert bad.returncode == 1
    lines = [line.split(" ", 2)[2] for line in log.read_text().splitlines()]
    assert log.read_text().startswith(text)  # appended
    assert "ERROR featpipe.output: error: no stage named 'nope' in store " in \
        "\n".join(lines) and lines[-1].startswith("INFO featpipe.output: exit status 1 after ")


@pytest.mark.parametrize("before", [True, False])
def test_an_unwritable_log_file_is_a_usage_error(tmp_path, before):
    (tmp_path / "file").write_text("")
    bad = ["--log-file", tmp_path / "file" / "run.log"]  # a folder that is a file
    args = ["cache", "ls", "--store", tmp_path]
    proc = run_cli(*(bad + args if before else args + bad), check=False)
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert "Invalid value for '--log-file': " in proc.stderr and "cannot write it" in \
        proc.stderr


@pytest.mark.parametrize("where", ["before", "after"])
def test_quiet_and_log_file_after_the_name_cover_the_jobs_warning(tmp_path, cli, where):
    """Issue 30: ``-q`` and ``--log-file`` after the command name act before the other
    options, as before it: the ``--jobs N is more than the cores`` warning (given while the
    options are read) is hidden by ``-q`` and recorded by ``--log-file`` in both positions."""
    args = ["encode", "--store", tmp_path / "s", "--input", "nope", "--method", "avg",
            "--jobs", "100000"]

    def place(*flags):
        return [*flags, *args] if where == "before" else [*args, *flags]

    loud = cli(*args)
    assert "--jobs 100000 is more than the" in loud.stderr
    quiet = cli(*place("-q"))
    assert quiet.exit_code == 1 and quiet.stderr.startswith("error: no store at ")
    assert "more than the" not in quiet.stderr
    log = tmp_path / "run.log"
    cli(*place("--log-file", log))
    assert "--jobs 100000 is more than the" in log.read_text()


def run_with_closed_stdout(*args) -> subprocess.CompletedProcess:
    """Run featpipe with its stdout a real pipe whose reader closes it before featpipe writes
    (as ``| head -0`` does; ``| head -1`` closes it after one line)."""
    env = dict(os.environ, PYTHONPATH=str(REPO))
    proc = subprocess.Popen([sys.executable, "-m", "featpipe", *map(str, args)], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    proc.stdout.close()  # the reader is gone: every write to stdout meets EPIPE
    stderr = proc.stderr.read()
    proc.wait(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, "", stderr)


def test_a_closed_stdout_drops_the_results_and_the_command_finishes_quietly(tmp_path):
    """Issue 30: ``classify ... | head -1`` exited 1 with nothing on stderr while ``cache ls |
    head -1`` exited 0.  One rule for every command: what would go to a closed stdout is
    dropped, the command does all its work (the report is written) and exits with its usual
    status, nothing said on stderr."""
    from tests.cli.test_classify_cli import GOOD, _store_with

    store = _store_with(tmp_path, GOOD, {r[0]: np.arange(1.0, 5.0) + i
                                         for i, r in enumerate(GOOD)})
    report = tmp_path / "r.json"
    classify = run_with_closed_stdout("classify", "--store", store.root, "--input", "enc",
                                      "--report", report)
    assert (classify.returncode, classify.stderr) == (0, "")
    assert report.exists()
    listing = run_with_closed_stdout("cache", "ls", "--store", store.root)
    assert (listing.returncode, listing.stderr) == (0, "")
    failing = run_with_closed_stdout("cache", "verify", "--store", store.root, "nope")
    assert failing.returncode == 1 and failing.stderr.startswith("error: no stage named")
