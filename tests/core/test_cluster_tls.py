"""TLS: an analysis over ``tls://`` through ``connect(security=...)`` and through the CLI's
--tls-* files, against the local scheduler's answer; a TLS scheduler without credentials
is a one-line error before any connection attempt."""

from __future__ import annotations

import time

import numpy as np
import pytest

from cosmo_dask import Snapshot
from cosmo_dask.cli import main
from cosmo_dask.core.cluster import connect
from cosmo_dask.core.errors import ClusterError

pytest.importorskip("cryptography")  # distributed's Security.temporary() needs it
pytestmark = pytest.mark.timeout(180)


def _snap():
    rng = np.random.default_rng(2)
    centres = rng.random((10, 3)) * 10.0
    pos = (centres[rng.integers(0, 10, 3000)] + 0.05 * rng.normal(size=(3000, 3))) % 10.0
    return Snapshot.from_arrays(pos, ids=np.arange(3000), box_size=10.0, particle_mass=1.0,
                                chunks=750)


@pytest.fixture(scope="module")
def tls_cluster():
    from distributed import LocalCluster, Security

    security = Security.temporary()
    with LocalCluster(n_workers=1, threads_per_worker=2, processes=True, host="127.0.0.1",
                      protocol="tls://", security=security, dashboard_address=":0") as c:
        yield c, security


def _labels(snap):
    from cosmo_dask.halos import fof

    return np.asarray(fof(snap, 0.05, absolute=True, min_members=20).labels.compute())


def test_an_analysis_over_tls_through_connect(tls_cluster):
    import dask

    cluster, security = tls_cluster
    assert cluster.scheduler_address.startswith("tls://")
    with dask.config.set(scheduler="threads"):
        want = _labels(_snap())
    with connect(cluster.scheduler_address, security=security, quiet=True) as client:
        assert client.scheduler.address.startswith("tls://")
        got = _labels(_snap())
    np.testing.assert_array_equal(got, want)
    assert (want >= 0).sum() > 2000


def test_a_tls_scheduler_without_credentials_is_one_line_at_once(tls_cluster, tmp_path,
                                                                 capsys):
    cluster, _ = tls_cluster
    t0 = time.perf_counter()
    with pytest.raises(ClusterError, match="speaks TLS and no credentials were given"):
        connect(cluster.scheduler_address, quiet=True)
    assert time.perf_counter() - t0 < 2
    path = _snap().to_zarr(tmp_path / "s.zarr")
    assert main(["--scheduler", cluster.scheduler_address, "info", path]) == 2
    err = capsys.readouterr().err.strip()
    assert err.count("\n") == 0 and "--tls-ca-file, --tls-cert" in err


def test_the_cli_over_tls_with_certificate_files(tls_cluster, tmp_path, capsys):
    cluster, security = tls_cluster
    files = {}
    for name, pem in (("ca", security.tls_ca_file), ("cert", security.tls_client_cert),
                      ("key", security.tls_client_key)):
        files[name] = tmp_path / f"{name}.pem"
        files[name].write_text(pem)
    path = _snap().to_zarr(tmp_path / "s.zarr")
    assert main(["--scheduler", cluster.scheduler_address, "--tls-ca-file", str(files["ca"]),
                 "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"]),
                 "halos", path, str(tmp_path / "h.zarr"), "--linking-length", "0.05",
                 "--absolute", "--min-members", "20", "--centers", ""]) == 0
    from cosmo_dask.halos import open_catalog

    np.testing.assert_array_equal(open_catalog(tmp_path / "h.zarr").labels.compute(),
                                  _labels(_snap()))
    assert main(["--scheduler", cluster.scheduler_address, "--tls-ca-file",
                 str(files["ca"]), "info", path]) == 2
    assert "go together" in capsys.readouterr().err
    assert main(["--workers", "1", "--tls-ca-file", str(tmp_path / "missing.pem"),
                 "--tls-cert", str(files["cert"]), "--tls-key", str(files["key"]), "info",
                 path]) == 2
    assert "missing.pem: no such TLS file" in capsys.readouterr().err
