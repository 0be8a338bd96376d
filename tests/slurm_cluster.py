"""A real single-node SLURM cluster for tests (docs/cluster.md, "Tests with real engines").

:func:`start_cluster` installs Debian's ``slurm-wlm`` and ``munge`` when ``sbatch`` is
missing and we are root, writes a ``slurm.conf`` for this host into a temporary folder
(``SLURM_CONF`` points the client commands at it), starts ``munged`` as the munge user,
``slurmctld`` and ``slurmd``, and waits until ``sinfo`` shows the node idle.  It returns a
:class:`LocalCluster` whose ``stop()`` ends exactly the daemons it started.  A cluster that
already answers ``sinfo`` is used as it is and left alone.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import socket
import subprocess
import time
from dataclasses import dataclass, field
from pathlib import Path


class ClusterUnavailable(Exception):
    """Why no SLURM cluster can be had here (the tests skip with this reason)."""


@dataclass
class LocalCluster:
    env: dict[str, str]
    pid_files: list[Path] = field(default_factory=list)

    def stop(self) -> None:
        """SIGTERM the slurm daemons we started (together), wait, then munged."""
        slurm = [p for p in self.pid_files if "munge" not in p.name]
        munge = [p for p in self.pid_files if "munge" in p.name]
        for group in (slurm, munge):
            pids = [pid for pid in map(_read_pid, group) if pid is not None]
            for pid in pids:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGTERM)
            deadline = time.monotonic() + 15
            while pids and time.monotonic() < deadline:
                pids = [pid for pid in pids if _alive(pid)]
                time.sleep(0.1)


def _read_pid(path: Path) -> int | None:
    try:
        return int(path.read_text().split()[0])
    except (FileNotFoundError, ValueError, IndexError):
        return None


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    return True


def _run(args, env=None, timeout=60, check=True):
    try:
        proc = subprocess.run(args, capture_output=True, text=True, env=env, timeout=timeout)
    except FileNotFoundError:
        raise ClusterUnavailable(f"{args[0]} is not installed") from None
    if check and proc.returncode != 0:
        raise ClusterUnavailable(f"`{' '.join(map(str, args))}` exited {proc.returncode}: "
                                 f"{(proc.stderr or proc.stdout).strip()[-300:]}")
    return proc


def _node_state(env) -> str | None:
    if shutil.which("sinfo") is None:
        return None
    try:
        proc = _run(["sinfo", "-h", "-N", "-o", "%T"], env=env, timeout=10, check=False)
    except subprocess.TimeoutExpired:
        return None
    return proc.stdout.strip() if proc.returncode == 0 and proc.stdout.strip() else None


def _install() -> None:
    if os.geteuid() != 0:
        raise ClusterUnavailable("sbatch is not installed and we are not root to install "
                                 "slurm-wlm and munge")
    if shutil.which("apt-get") is None:
        raise ClusterUnavailable("sbatch is not installed and there is no apt-get")
    env = dict(os.environ, DEBIAN_FRONTEND="noninteractive")
    proc = subprocess.run(["apt-get", "install", "-y", "-qq", "slurm-wlm", "munge"],
                          capture_output=True, text=True, env=env, timeout=600)
    if proc.returncode != 0 or shutil.which("sbatch") is None:
        raise ClusterUnavailable("apt-get install slurm-wlm munge failed: "
                                 f"{proc.stderr.strip()[-300:]}")


def _start_munge(pid_files: list[Path]) -> None:
    if _run(["munge", "-n"], timeout=10, check=False).returncode == 0:
        return  # a munged is already running: use it, leave it alone
    key = Path("/etc/munge/munge.key")
    if not key.exists():
        _run(["mungekey", "--create", "--keyfile", str(key)])
        shutil.chown(key, "munge", "munge")
        key.chmod(0o400)
    for folder in ("/run/munge", "/var/log/munge", "/var/lib/munge"):
        Path(folder).mkdir(parents=True, exist_ok=True)
        shutil.chown(folder, "munge", "munge")
    _run(["runuser", "-u", "munge", "--", "munged"])
    pid_files.append(Path("/run/munge/munged.pid"))
    for _ in range(50):
        if _run(["munge", "-n"], timeout=10, check=False).returncode == 0:
            return
        time.sleep(0.1)
    raise ClusterUnavailable("munged started but `munge -n` still fails")


def _memory_mb() -> int:
    with open("/proc/meminfo") as handle:
        for line in handle:
            if line.startswith("MemTotal:"):
                return int(line.split()[1]) // 1024
    raise ClusterUnavailable("cannot read MemTotal from /proc/meminfo")


def write_conf(folder: Path) -> Path:
    """A minimal slurm.conf for one node (this host) and one default partition."""
    host = socket.gethostname().split(".")[0]
    for sub in ("state", "spool"):
        (folder / sub).mkdir(parents=True, exist_ok=True)
    real_memory = int(_memory_mb() * 0.9)
    try:
        socket.gethostbyname(host)
        ctld, node_addr = host, ""
    except OSError:  # a container whose host name does not resolve
        ctld, node_addr = f"{host}(127.0.0.1)", " NodeAddr=127.0.0.1"
    node = f"NodeName={host}{node_addr} CPUs={os.cpu_count()} RealMemory={real_memory}"
    conf = folder / "slurm.conf"
    conf.write_text(f"""\
ClusterName=featpipe-test
SlurmctldHost={ctld}
SlurmUser=root
AuthType=auth/munge
CredType=cred/munge
ProctrackType=proctrack/linuxproc
TaskPlugin=task/none
SelectType=select/cons_tres
SelectTypeParameters=CR_Core
ReturnToService=2
SlurmdParameters=config_overrides
MpiDefault=none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SchedulerType=sched/backfill
SchedulerParameters=batch_sched_delay=0,sched_min_interval=100000
KillWait=2
MinJobAge=600
StateSaveLocation={folder}/state
SlurmdSpoolDir={folder}/spool
SlurmctldPidFile={folder}/slurmctld.pid
SlurmdPidFile={folder}/slurmd.pid
SlurmctldLogFile={folder}/slurmctld.log
SlurmdLogFile={folder}/slurmd.log
{node} State=UNKNOWN
PartitionName=featpipe Nodes=ALL Default=YES MaxTime=INFINITE State=UP OverSubscribe=FORCE:4
""")
    return conf


def start_cluster(folder: Path, timeout: float = 60.0) -> LocalCluster:
    """Use the running SLURM cluster, or install and start one; see the module docstring."""
    if shutil.which("sbatch") is None:
        _install()
    if _node_state(dict(os.environ)) in ("idle", "mixed", "allocated"):
        return LocalCluster(env={})
    if os.geteuid() != 0:
        raise ClusterUnavailable("no SLURM cluster answers sinfo and we are not root to start "
                                 "slurmctld/slurmd")
    pid_files: list[Path] = []
    cluster = LocalCluster(env={}, pid_files=pid_files)
    try:
        _start_munge(pid_files)
        conf = write_conf(folder)
        env = dict(os.environ, SLURM_CONF=str(conf))
        cluster.env = {"SLURM_CONF": str(conf)}
        _run(["slurmctld", "-f", str(conf)], env=env)
        pid_files.append(folder / "slurmctld.pid")
        _run(["slurmd", "-f", str(conf)], env=env)
        pid_files.append(folder / "slurmd.pid")
        deadline = time.monotonic() + timeout
        state = None
        while time.monotonic() < deadline:
            state = _node_state(env)
            if state == "idle":
                return cluster
            time.sleep(0.3)
        log = (folder / "slurmctld.log")
        tail = log.read_text()[-400:] if log.exists() else ""
        raise ClusterUnavailable(f"the SLURM node did not become idle (state {state!r}): {tail}")
    except BaseException:
        cluster.stop()
        raise
