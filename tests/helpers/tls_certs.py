"""A throw-away certificate authority for TLS tests, made with the openssl CLI:
``ca.crt``, a server certificate for 127.0.0.1 / localhost (``server.crt``,
``server.key``; usable as a client certificate too, as Redis Cluster nodes
use theirs on the cluster bus) and a client certificate (``client.crt``,
``client.key``).  EC P-256 keys: quick to make.
"""

from __future__ import annotations

import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path

import pytest


@dataclass(frozen=True)
class TlsFiles:
    dir: Path

    @property
    def ca(self) -> Path:
        return self.dir / "ca.crt"

    @property
    def server_cert(self) -> Path:
        return self.dir / "server.crt"

    @property
    def server_key(self) -> Path:
        return self.dir / "server.key"

    @property
    def client_cert(self) -> Path:
        return self.dir / "client.crt"

    @property
    def client_key(self) -> Path:
        return self.dir / "client.key"

    def query(self, client_cert: bool = True) -> str:
        """The rediss URL options netlimit needs to trust this CA (and present the client certificate)."""
        q = f"ssl_ca_certs={self.ca}"
        if client_cert:
            q += f"&ssl_certfile={self.client_cert}&ssl_keyfile={self.client_key}"
        return q


def _run(*args: str, cwd: Path) -> None:
    p = subprocess.run(args, cwd=cwd, capture_output=True, text=True, timeout=30)
    if p.returncode != 0:
        raise RuntimeError(f"{' '.join(args)} failed: {p.stderr[-2000:]}")


def make_certs(d: Path) -> TlsFiles:
    if shutil.which("openssl") is None:
        pytest.fail("openssl is not installed: the TLS tests make their certificates with it (apt-get install openssl)")
    d.mkdir(parents=True, exist_ok=True)
    key = ("-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes")
    _run("openssl", "req", "-x509", "-new", *key, "-keyout", "ca.key", "-out", "ca.crt", "-days", "3",
         "-subj", "/CN=netlimit test CA", cwd=d)  # fmt: skip
    (d / "server.ext").write_text(
        "subjectAltName=IP:127.0.0.1,DNS:localhost\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth,clientAuth\n"
    )
    (d / "client.ext").write_text("basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n")
    for name, cn in (("server", "localhost"), ("client", "netlimit")):
        _run("openssl", "req", "-new", *key, "-keyout", f"{name}.key", "-out", f"{name}.csr", "-subj", f"/CN={cn}",
             cwd=d)  # fmt: skip
        _run("openssl", "x509", "-req", "-in", f"{name}.csr", "-CA", "ca.crt", "-CAkey", "ca.key",
             "-CAcreateserial", "-out", f"{name}.crt", "-days", "3", "-extfile", f"{name}.ext", cwd=d)  # fmt: skip
    return TlsFiles(d)
