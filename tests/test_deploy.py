"""The deploy examples: ``--print-script`` renders the SLURM and PBS worker job scripts from
the same options the examples start clusters with, without starting a scheduler."""

from __future__ import annotations

import importlib
import sys
from pathlib import Path

import pytest

pytest.importorskip("dask_jobqueue")
DEPLOY = Path(__file__).resolve().parents[1] / "deploy"


@pytest.fixture(scope="module")
def examples():
    sys.path.insert(0, str(DEPLOY))
    try:
        yield {name: importlib.import_module(f"{name}_jobqueue") for name in ("slurm", "pbs")}
    finally:
        sys.path.remove(str(DEPLOY))


def _script(module, argv, capsys, monkeypatch):
    import distributed

    started = []  # a scheduler started anywhere in this process would be recorded here
    monkeypatch.setattr(distributed.Scheduler, "__init__", lambda *a, **k: started.append(a))
    module.main(argv + ["--print-script"])
    assert not started, "--print-script started a scheduler"
    return capsys.readouterr().out


def test_slurm_cpu_script_takes_the_sizes(examples, capsys, monkeypatch):
    out = _script(examples["slurm"], ["--queue", "debug", "--cores", "2", "--processes", "1",
                                      "--memory", "8GB", "--walltime", "00:30:00",
                                      "--interface", "lo"], capsys, monkeypatch)
    for line in ("#SBATCH -p debug", "#SBATCH --cpus-per-task=2", "#SBATCH --mem=8G",
                 "#SBATCH -t 00:30:00"):
        assert line in out.splitlines(), out
    assert "distributed.cli.dask_worker tcp://SCHEDULER-ADDRESS:8786" in out
    assert "--nthreads 2" in out and "--memory-limit 7.45GiB" in out
    assert "--interface lo" in out and "export HDF5_USE_FILE_LOCKING=FALSE" in out
    four = _script(examples["slurm"], ["--queue", "debug", "--cores", "8", "--processes", "4"],
                   capsys, monkeypatch)
    assert "--nworkers 4" in four and "--nthreads 2" in four  # 8 cores over 4 processes


def test_slurm_gpu_script_runs_dask_cuda_worker(examples, capsys, monkeypatch):
    out = _script(examples["slurm"], ["--gpu", "--queue", "gpu", "--account", "abc",
                                      "--cores", "16", "--memory", "30GB"], capsys, monkeypatch)
    assert "#SBATCH --gres=gpu:4" in out and "#SBATCH -A abc" in out
    assert "#SBATCH --cpus-per-task=16" in out and "#SBATCH --mem=0" in out
    assert "-m dask_cuda.cli tcp://SCHEDULER-ADDRESS:8786" in out
    assert "--memory-limit 27.94GiB" in out


def test_pbs_scripts_come_from_the_same_code(examples, capsys, monkeypatch):
    cpu = _script(examples["pbs"], ["--queue", "workq", "--cores", "4", "--memory", "16GB",
                                    "--walltime", "02:00:00"], capsys, monkeypatch)
    for line in ("#PBS -q workq", "#PBS -l select=1:ncpus=4:mem=16gb",
                 "#PBS -l walltime=02:00:00", "cd $PBS_O_WORKDIR"):
        assert line in cpu.splitlines(), cpu
    gpu = _script(examples["pbs"], ["--gpu", "--queue", "gpuq"], capsys, monkeypatch)
    assert "#PBS -l select=1:ncpus=32:ngpus=4:mem=256gb" in gpu.splitlines(), gpu
    assert "-m dask_cuda.cli" in gpu


def test_processes_do_not_apply_to_gpu_jobs(examples, capsys):
    with pytest.raises(SystemExit) as exc:
        examples["slurm"].main(["--gpu", "--queue", "gpu", "--processes", "2",
                                "--print-script"])
    assert exc.value.code == 2 and "--processes applies to CPU jobs" in capsys.readouterr().err
