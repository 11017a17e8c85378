"""The deploy examples: ``--print-script`` renders the SLURM and PBS worker job scripts from
the same options the examples start clusters with, without starting a scheduler."""

from __future__ import annotations

import importlib
import os
import sys
from pathlib import Path

import pytest

pytest.importorskip("dask_jobqueue")
DEPLOY = Path(__file__).resolve().parents[2] / "deploy"


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


# ----------------------------------------------------------------------------- Kubernetes
@pytest.fixture(scope="module")
def k8s():
    pytest.importorskip("dask_kubernetes")
    sys.path.insert(0, str(DEPLOY))
    try:
        yield importlib.import_module("kubernetes_spec")
    finally:
        sys.path.remove(str(DEPLOY))


def test_kubernetes_yaml_is_the_generators_output(k8s, capsys):
    assert k8s.main([]) == 0
    assert (DEPLOY / "kubernetes.yaml").read_text() == capsys.readouterr().out, \
        "deploy/kubernetes.yaml is stale: python deploy/kubernetes_spec.py > deploy/kubernetes.yaml"


@pytest.mark.parametrize("options", [{}, {"tls_secret": "cosmo-tls"},
                                     {"gpus_per_worker": 0, "worker_cpu": "8"},
                                     {"gpus_per_worker": 2, "image": "reg.example/cd:0.4",
                                      "workers": 6}])
def test_specs_validate_against_the_shipped_crd_schema(k8s, options):
    spec = k8s.cluster_spec(**options)
    assert k8s.problems(spec) == []
    worker = spec["spec"]["worker"]["spec"]["containers"][0]
    scheduler = spec["spec"]["scheduler"]["spec"]["containers"][0]
    gpus = options.get("gpus_per_worker", 1)
    assert worker["resources"]["limits"].get("nvidia.com/gpu") == (str(gpus) if gpus else None)
    assert "nvidia.com/gpu" not in scheduler["resources"]["limits"]
    assert worker["command"][:3] == (["dask", "cuda", "worker"] if gpus else
                                     ["dask", "worker", "--name"])
    assert worker["image"] == scheduler["image"] == options.get("image", "cosmo-dask:latest")
    assert spec["spec"]["worker"]["replicas"] == options.get("workers", 2)
    tls = "tls_secret" in options
    assert scheduler["command"][-1] == ("tls" if tls else "tcp")
    names = {e["name"] for e in worker["env"]}
    assert ("DASK_DISTRIBUTED__COMM__TLS__WORKER__CERT" in names) == tls


def test_the_schema_check_finds_what_the_api_server_would_reject_or_drop(k8s):
    import copy

    good = k8s.cluster_spec()
    bad = copy.deepcopy(good)
    bad["spec"]["worker"]["spec"]["containers"][0]["resources"]["limits"]["nvidia.com/gpu"] = 1
    bad["spec"]["worker"]["replica"] = 3  # a typo the API server would prune silently
    del bad["spec"]["scheduler"]["spec"]["containers"][0]["name"]
    found = k8s.problems(bad)
    assert any("nvidia.com/gpu: 1 is not of type 'string'" in p for p in found), found
    assert any("'replica' was unexpected" in p for p in found), found
    assert any("'name' is a required property" in p for p in found), found
    assert len(found) == 3


@pytest.mark.slow
def test_the_tls_spec_commands_run_and_connect(k8s, tmp_path):
    """The TLS spec's scheduler and worker commands and environment, run here as the pods
    would run them (127.0.0.1 for the service name, a temporary certificate for the
    secret): cosmo_dask.connect with the client's certificate computes on them."""
    import socket
    import subprocess
    import time

    from distributed import Security

    import cosmo_dask

    sec = Security.temporary()
    (tmp_path / "ca.crt").write_text(sec.tls_ca_file)
    (tmp_path / "tls.crt").write_text(sec.tls_scheduler_cert)
    (tmp_path / "tls.key").write_text(sec.tls_scheduler_key)
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]

    spec = k8s.cluster_spec(gpus_per_worker=0, tls_secret="cosmo-tls")

    def pod(part):
        c = spec["spec"][part]["spec"]["containers"][0]
        env = dict(os.environ, **{e["name"]: e["value"].replace(k8s.TLS_DIR, str(tmp_path))
                                  for e in c["env"]})
        cmd = [a.replace("0.0.0.0", "127.0.0.1").replace("cosmo-dask-scheduler", "127.0.0.1")
               .replace(":8786", f":{port}").replace("$(DASK_WORKER_NAME)", "w0")
               for a in c["command"]]
        if part == "scheduler":
            cmd += ["--port", str(port), "--dashboard-address", "127.0.0.1:0"]
        else:
            cmd += ["--host", "127.0.0.1"]
            cmd[cmd.index("--dashboard-address") + 1] = "127.0.0.1:0"
        cmd[0] = str(Path(sys.executable).parent / "dask")
        return subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL,
                                stderr=subprocess.DEVNULL)

    procs = [pod("scheduler")]
    try:
        deadline = time.monotonic() + 90  # a busy CI machine takes seconds to import dask
        while True:
            assert procs[0].poll() is None, "the scheduler command exited"
            try:
                socket.create_connection(("127.0.0.1", port), timeout=1).close()
                break
            except OSError:
                assert time.monotonic() < deadline, "the scheduler never listened"
                time.sleep(0.25)
        procs.append(pod("worker"))
        client_sec = Security(tls_ca_file=str(tmp_path / "ca.crt"),
                              tls_client_cert=str(tmp_path / "tls.crt"),
                              tls_client_key=str(tmp_path / "tls.key"), require_encryption=True)
        with cosmo_dask.connect(f"tls://127.0.0.1:{port}", security=client_sec) as client:
            client.wait_for_workers(1, timeout=60)
            assert client.scheduler.address.startswith("tls://")
            assert client.submit(sum, [1, 2, 3]).result() == 6
    finally:
        for p in procs:
            p.terminate()
        for p in procs:
            try:
                p.wait(15)
            except subprocess.TimeoutExpired:
                p.kill()
