"""Throwaway certificate authorities and server certificates (the openssl command line), for
loopback TLS."""

from __future__ import annotations

import ssl
import subprocess
from pathlib import Path
from typing import NamedTuple


class CertAuthority(NamedTuple):
    key: Path
    cert: Path


def _openssl(*args: str) -> None:
    subprocess.run(["openssl", *args], check=True, capture_output=True, timeout=60)


def make_ca(tmp: Path, name: str) -> CertAuthority:
    """A throwaway certificate authority, valid two days."""
    ca = CertAuthority(tmp / f"{name}.key", tmp / f"{name}.pem")
    _openssl(
        "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "2", "-subj", f"/CN={name}",
        "-keyout", str(ca.key), "-out", str(ca.cert),
    )  # fmt: skip
    return ca


def server_context(tmp: Path, name: str, host: str, ca: CertAuthority) -> ssl.SSLContext:
    """A server context with a certificate for ``host`` signed by ``ca``."""
    key, csr, cert, ext = (tmp / f"{name}.{s}" for s in ("key", "csr", "pem", "ext"))
    ext.write_text(f"subjectAltName=DNS:{host}\n")
    _openssl(
        "req", "-newkey", "rsa:2048", "-nodes", "-subj", f"/CN={host}", "-keyout", str(key), "-out", str(csr)
    )
    _openssl(
        "x509", "-req", "-in", str(csr), "-CA", str(ca.cert), "-CAkey", str(ca.key), "-CAcreateserial",
        "-days", "2", "-extfile", str(ext), "-out", str(cert),
    )  # fmt: skip
    context = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    context.load_cert_chain(cert, key)
    return context
