"""A throwaway CA and one certificate for a whole stack, laid out as cert-manager writes its
Secret (ca.crt, tls.crt, tls.key), made with the openssl CLI: what TLS tests and a local
`gearshift up` with GEARSHIFT_TLS__* use."""

from __future__ import annotations

import subprocess
from dataclasses import dataclass
from pathlib import Path

from gearshift.settings import TlsSettings

LOOPBACK = tuple(f"127.0.0.{i}" for i in range(1, 10))  # replicas on loopback: 127.0.0.2, 127.0.0.3, ...
EC_KEY = ["-newkey", "ec", "-pkeyopt", "ec_paramgen_curve:prime256v1", "-nodes"]


def _openssl(*args: str, cwd: Path) -> None:
    done = subprocess.run(["openssl", *args], cwd=cwd, capture_output=True, text=True)
    if done.returncode:
        raise RuntimeError(f"openssl {args[0]}: {done.stderr.strip()}")


@dataclass(frozen=True)
class StackCertificate:
    directory: Path

    @property
    def ca(self) -> Path:
        return self.directory / "ca.crt"

    @property
    def cert(self) -> Path:
        return self.directory / "tls.crt"

    @property
    def key(self) -> Path:
        return self.directory / "tls.key"

    def settings(self, client_auth: bool = False, server_name: str = "", health_port: int = 0) -> TlsSettings:
        return TlsSettings(enabled=True, cert_file=self.cert, key_file=self.key, ca_file=self.ca, client_auth=client_auth,
                           server_name=server_name, health_port=health_port)

    def env(self, client_auth: bool = False, server_name: str = "") -> dict[str, str]:
        return {
            "GEARSHIFT_TLS__ENABLED": "true", "GEARSHIFT_TLS__CERT_FILE": str(self.cert), "GEARSHIFT_TLS__KEY_FILE": str(self.key),
            "GEARSHIFT_TLS__CA_FILE": str(self.ca), "GEARSHIFT_TLS__CLIENT_AUTH": str(client_auth).lower(),
            "GEARSHIFT_TLS__SERVER_NAME": server_name,
        }


def issue(directory: Path, names: tuple[str, ...] = ("localhost",), ips: tuple[str, ...] = LOOPBACK, days: int = 2) -> StackCertificate:
    """A new CA in directory and a certificate it signs for names and ips, for servers and
    clients alike (mutual TLS), each with a P-256 key."""
    directory.mkdir(parents=True, exist_ok=True)
    _openssl("req", "-x509", *EC_KEY, "-keyout", "ca.key", "-out", "ca.crt", "-days", str(days), "-subj", "/CN=gearshift test CA",
             "-addext", "basicConstraints=critical,CA:TRUE", "-addext", "keyUsage=critical,keyCertSign,cRLSign", cwd=directory)
    _openssl("req", *EC_KEY, "-keyout", "tls.key", "-out", "tls.csr", "-subj", "/CN=gearshift", cwd=directory)
    alt_names = ",".join([f"DNS:{name}" for name in names] + [f"IP:{ip}" for ip in ips])
    (directory / "leaf.ext").write_text(
        f"subjectAltName={alt_names}\nbasicConstraints=critical,CA:FALSE\nkeyUsage=critical,digitalSignature\n"
        "extendedKeyUsage=serverAuth,clientAuth\nsubjectKeyIdentifier=hash\nauthorityKeyIdentifier=keyid,issuer\n"
    )
    _openssl("x509", "-req", "-in", "tls.csr", "-CA", "ca.crt", "-CAkey", "ca.key", "-CAcreateserial", "-out", "tls.crt",
             "-days", str(days), "-extfile", "leaf.ext", cwd=directory)
    return StackCertificate(directory)
