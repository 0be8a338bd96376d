"""SLURM job arrays for item-parallel stages (``featpipe submit --backend slurm``).

A stage command (``featpipe encode ...``) becomes an array of N tasks; task I runs the same
command with ``--executor slurm --shard I/N``, so it computes only the items whose id hashes
to I (:func:`featpipe.parallel.shard_of`).  A small report job, started after the array ends
in any way (``--dependency=afterany``), runs ``featpipe status --check`` on the stage: its
log shows done/failed counts and its exit status says whether the stage is complete.
"""

from __future__ import annotations

import shlex
import shutil
import subprocess
import time
from dataclasses import dataclass, field
from importlib import resources
from pathlib import Path

from featpipe.errors import FeatpipeError
from featpipe.processes import featpipe_command, import_path

#: The job-array template, shipped as package data (``featpipe/templates/``).
TEMPLATE_NAME = "featpipe-array.sbatch"
#: Flags ``submit`` adds to every stage command; the user must not give them.
ADDED_FLAGS = ("--executor", "--shard", "--scheduler")


def stage_argv(command: list[str] | tuple[str, ...]) -> list[str]:
    """The stage command to run: a leading ``featpipe`` becomes this Python's
    ``-P -m featpipe`` (:func:`featpipe.processes.featpipe_command`).

    Running ``sys.executable -m featpipe`` makes every task use the environment the job was
    submitted from (a virtual environment on the shared filesystem), PATH or not; ``-P`` and
    the script's PYTHONPATH (this process's import path) make it import the featpipe this
    process imported, whatever the job's working folder holds.
    """
    argv = list(command)
    if not argv:
        raise FeatpipeError("submit needs a stage command after `--`, e.g. "
                            "`featpipe submit --backend slurm --tasks 8 -- featpipe encode ...`")
    for arg in argv:
        if arg.split("=", 1)[0] in ADDED_FLAGS:
            raise FeatpipeError(f"do not pass {arg.split('=', 1)[0]} in the stage command: "
                                "submit adds --executor/--shard/--scheduler itself")
    if argv[0] == "featpipe":
        argv = [*featpipe_command(), *argv[1:]]
    return argv


def option_value(argv: list[str], *flags: str) -> str | None:
    """The value of the last ``--flag VALUE`` / ``--flag=VALUE`` in ``argv`` (None if absent)."""
    value = None
    for i, arg in enumerate(argv):
        for flag in flags:
            if arg == flag and i + 1 < len(argv):
                value = argv[i + 1]
            elif flag.startswith("--") and arg.startswith(flag + "="):
                value = arg[len(flag) + 1:]
    return value


@dataclass
class ArrayJob:
    """What to render into the template: the stage command and the SLURM resources."""

    command: list[str]
    tasks: int
    log_dir: Path
    job_name: str
    partition: str | None = None
    time: str | None = None
    mem: str | None = None
    gpus: int | None = None
    cpus_per_task: int | None = None
    throttle: int | None = None
    extra: list[str] = field(default_factory=list)
    workdir: Path = field(default_factory=Path.cwd)

    def array_spec(self) -> str:
        spec = f"0-{self.tasks - 1}"
        return f"{spec}%{self.throttle}" if self.throttle else spec

    def sbatch_options(self) -> list[str]:
        options = []
        if self.partition:
            options.append(f"--partition={self.partition}")
        if self.time:
            options.append(f"--time={self.time}")
        if self.mem:
            options.append(f"--mem={self.mem}")
        if self.gpus:
            options.append(f"--gres=gpu:{self.gpus}")
        if self.cpus_per_task:
            options.append(f"--cpus-per-task={self.cpus_per_task}")
        options.extend(self.extra)
        return options

    def render(self, template: str) -> str:
        """The sbatch script: ``{{NAME}}`` placeholders of ``template`` filled in."""
        if self.tasks < 1:
            raise FeatpipeError(f"--tasks must be at least 1, got {self.tasks}")
        if self.throttle is not None and self.throttle < 1:
            raise FeatpipeError(f"--array-throttle must be at least 1, got {self.throttle}")
        values = {
            "JOB_NAME": self.job_name,
            "ARRAY": self.array_spec(),
            "LOG_DIR": str(self.log_dir),
            "WORKDIR": shlex.quote(str(self.workdir)),
            "TASKS": str(self.tasks),
            "COMMAND": shlex.join(self.command),
            "PYTHONPATH": shlex.quote(import_path()),
        }
        options = "".join(f"#SBATCH {o}\n" for o in self.sbatch_options())
        text = template.replace("{{SBATCH_OPTIONS}}\n", options)
        for key, value in values.items():
            text = text.replace("{{" + key + "}}", value)
        if "{{" in text:
            start = text.index("{{")
            raise FeatpipeError(f"template has an unknown placeholder {text[start:start + 30]!r}")
        return text


def default_template() -> str:
    """The text of the shipped job-array template (read with importlib.resources, so it is
    found in a wheel, a zip or a source checkout alike)."""
    return resources.files("featpipe").joinpath("templates", TEMPLATE_NAME).read_text(
        encoding="utf-8")


def sbatch_path() -> str:
    path = shutil.which("sbatch")
    if path is None:
        raise FeatpipeError("sbatch not found: run submit on a SLURM login node "
                            "(--dry-run prints the script without submitting)")
    return path


def sbatch(args: list[str]) -> str:
    """Run ``sbatch --parsable ARGS``; returns the job id."""
    proc = subprocess.run([sbatch_path(), "--parsable", *args], capture_output=True, text=True)
    if proc.returncode != 0:
        message = (proc.stderr.strip() or proc.stdout.strip()).splitlines()
        raise FeatpipeError(f"sbatch failed (exit {proc.returncode}): "
                            f"{message[-1] if message else 'no message'}")
    return proc.stdout.strip().split(";")[0]


def wait_for_jobs(job_ids: list[str], max_delay: float = 10.0) -> None:
    """Poll ``squeue`` until none of ``job_ids`` (array jobs included) is pending or running.

    Polls every 0.5 s at first, then every elapsed/30 s up to ``max_delay``: short stages end
    promptly, long ones do not load the controller.
    """
    squeue = shutil.which("squeue")
    if squeue is None:
        raise FeatpipeError("squeue not found: cannot wait for the jobs")
    started = time.monotonic()
    while True:
        proc = subprocess.run([squeue, "-h", "-j", ",".join(job_ids), "-o", "%i"],
                              capture_output=True, text=True)
        if proc.returncode == 0 and not proc.stdout.strip():
            return
        if proc.returncode != 0:
            if "Invalid job id" in proc.stderr:
                return  # finished long enough ago to be forgotten by the controller
            raise FeatpipeError(f"squeue failed (exit {proc.returncode}): "
                                f"{proc.stderr.strip()[-200:]}")
        time.sleep(min(max_delay, max(0.5, (time.monotonic() - started) / 30)))
