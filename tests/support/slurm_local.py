"""A one-node SLURM (munge + slurmctld + slurmd) on 127.0.0.1, started inside a test's
temporary directory and stopped by pid, for running dask-jobqueue for real.

Needs Debian's ``slurm-wlm`` and ``munge`` packages (``.ci/run`` installs them) and
root (the daemons run as the current user; slurmd needs root to start jobs as the
submitting user). Every daemon is started in the foreground as a child of this process
and stopped by :meth:`LocalSlurm.stop`, also when starting failed half-way.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path

DAEMONS = ("munged", "slurmctld", "slurmd")
#: the single node's and partition's names
NODE, PARTITION = "cdnode", "debug"


def missing_programs() -> list[str]:
    """The SLURM and munge programs this machine lacks (empty: a LocalSlurm can start)."""
    return [p for p in (*DAEMONS, "sbatch", "squeue", "scancel", "sinfo")
            if shutil.which(p) is None and not Path("/usr/sbin", p).exists()]


def _program(name: str) -> str:
    return shutil.which(name) or str(Path("/usr/sbin", name))


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LocalSlurm:
    """``with LocalSlurm(dir) as slurm:``; ``slurm.env`` is the environment for sbatch/squeue
    (``SLURM_CONF`` naming this cluster's configuration)."""

    def __init__(self, root: str | os.PathLike, cpus: int | None = None,
                 memory_mb: int | None = None):
        self.root = Path(root)
        self.cpus = cpus or os.cpu_count() or 1
        total = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") // 2**20
        self.memory_mb = memory_mb or int(total * 0.8)
        self.procs: dict[str, subprocess.Popen] = {}
        self.conf = self.root / "slurm.conf"
        self.env = dict(os.environ, SLURM_CONF=str(self.conf))

    # ------------------------------------------------------------------ setup
    def _write_files(self) -> None:
        r = self.root
        for d in ("state", "spool", "munge"):
            (r / d).mkdir(parents=True, exist_ok=True)
        os.chmod(r / "munge", 0o700)
        key = r / "munge" / "munge.key"
        key.write_bytes(os.urandom(1024))
        os.chmod(key, 0o600)
        user = os.environ.get("USER") or "root"
        lines = [
            "ClusterName=cosmodask",
            "SlurmctldHost=localhost(127.0.0.1)",
            f"SlurmctldPort={_free_port()}",
            f"SlurmdPort={_free_port()}",
            f"SlurmUser={user}",
            f"SlurmdUser={user}",
            "AuthType=auth/munge",
            "CredType=cred/munge",
            f"AuthInfo=socket={r / 'munge' / 'socket'}",
            f"StateSaveLocation={r / 'state'}",
            f"SlurmdSpoolDir={r / 'spool'}",
            f"SlurmctldPidFile={r / 'slurmctld.pid'}",
            f"SlurmdPidFile={r / 'slurmd.pid'}",
            f"SlurmctldLogFile={r / 'slurmctld.log'}",
            f"SlurmdLogFile={r / 'slurmd.log'}",
            "ProctrackType=proctrack/linuxproc",
            "TaskPlugin=task/none",
            "MpiDefault=none",
            "SchedulerType=sched/builtin",
            "SelectType=select/cons_tres",
            "SelectTypeParameters=CR_Core",
            "JobCompType=jobcomp/none",
            "AccountingStorageType=accounting_storage/none",
            "JobAcctGatherType=jobacct_gather/none",
            "ReturnToService=2",
            "CommunicationParameters=NoInAddrAny,NoCtldInAddrAny",
            f"NodeName={NODE} NodeHostname=localhost NodeAddr=127.0.0.1 "
            f"CPUs={self.cpus} RealMemory={self.memory_mb} State=UNKNOWN",
            f"PartitionName={PARTITION} Nodes={NODE} Default=YES MaxTime=INFINITE State=UP",
        ]
        self.conf.write_text("\n".join(lines) + "\n")

    def _spawn(self, name: str, args: list[str]) -> None:
        log = open(self.root / f"{name}.out", "wb")  # noqa: SIM115 (closed with the process)
        self.procs[name] = subprocess.Popen([_program(name), *args], stdout=log,
                                            stderr=subprocess.STDOUT, env=self.env,
                                            start_new_session=True)
        log.close()

    def start(self, timeout: float = 60.0) -> LocalSlurm:
        """Start munged, slurmctld and slurmd; return once the node is idle."""
        try:
            self._write_files()
            m = self.root / "munge"
            self._spawn("munged", ["--foreground", "--force", f"--key-file={m / 'munge.key'}",
                                   f"--socket={m / 'socket'}", f"--pid-file={m / 'pid'}",
                                   f"--log-file={m / 'log'}", f"--seed-file={m / 'seed'}"])
            self._wait(lambda: (m / "socket").exists(), "munged", timeout)
            self._spawn("slurmctld", ["-D", "-f", str(self.conf)])
            self._spawn("slurmd", ["-D", "-N", NODE, "-f", str(self.conf)])
            self._wait(self._node_idle, "the node to be idle", timeout)
        except BaseException:
            self.stop()
            raise
        return self

    def _node_idle(self) -> bool:
        out = subprocess.run(["sinfo", "-h", "-N", "-o", "%T"], env=self.env,
                             capture_output=True, text=True, timeout=10)
        return out.returncode == 0 and out.stdout.strip() == "idle"

    def _wait(self, ready, what: str, timeout: float) -> None:
        t0 = time.monotonic()
        while not ready():
            dead = [n for n, p in self.procs.items() if p.poll() is not None]
            if dead:
                raise RuntimeError(f"{', '.join(dead)} exited while waiting for {what}:\n"
                                   + self.logs())
            if time.monotonic() - t0 > timeout:
                raise TimeoutError(f"no {what} after {timeout:.0f} s:\n" + self.logs())
            time.sleep(0.25)

    def logs(self) -> str:
        """The tails of every daemon's log (for failure messages)."""
        parts = []
        for f in sorted(self.root.glob("*.log")) + sorted(self.root.glob("*.out")) + [
                self.root / "munge" / "log"]:
            if f.is_file():
                parts.append(f"--- {f.name}\n" + "\n".join(f.read_text(errors="replace")
                                                         .splitlines()[-15:]))
        return "\n".join(parts)

    # ------------------------------------------------------------------ teardown
    def stop(self, timeout: float = 15.0) -> None:
        """Stop every daemon this object started (SIGTERM, then SIGKILL), jobs first."""
        if "slurmctld" in self.procs and self.procs["slurmctld"].poll() is None:
            subprocess.run(["scancel", "--full", "-u", os.environ.get("USER") or "root"],
                           env=self.env, capture_output=True, timeout=10, check=False)
        for name in reversed(DAEMONS):
            p = self.procs.get(name)
            if p is None or p.poll() is not None:
                continue
            os.killpg(p.pid, signal.SIGTERM)
            try:
                p.wait(timeout)
            except subprocess.TimeoutExpired:
                os.killpg(p.pid, signal.SIGKILL)
                p.wait(5)

    def running(self) -> list[int]:
        """Pids of this object's daemons still alive."""
        return [p.pid for p in self.procs.values() if p.poll() is None]

    def __enter__(self) -> LocalSlurm:
        return self.start()

    def __exit__(self, *exc) -> None:
        self.stop()
