"""Certificates and keys for the sandbox control plane.

One throwaway CA signs everything: the API server's serving certificate and
the client certificates the admin, the scheduler and the controller manager
authenticate with (Kubernetes takes the user from the CN and the groups from
O). A separate RSA key pair signs service-account tokens. Nothing here is
meant to outlive one sandbox's state directory.
"""

from __future__ import annotations

import datetime
import ipaddress
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec, rsa
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

#: The names a client inside or outside the cluster may use for the API server.
APISERVER_DNS_NAMES = (
    "localhost",
    "kubernetes",
    "kubernetes.default",
    "kubernetes.default.svc",
    "kubernetes.default.svc.cluster.local",
)

#: The CN the API server accepts on requests proxied to aggregated API servers.
FRONT_PROXY_CLIENT = "front-proxy-client"

#: Long enough for any demo or test run; the CA is recreated with the state dir.
VALIDITY = datetime.timedelta(days=365)

#: Client identities: file stem -> (CN = user name, O = groups).
CLIENTS: dict[str, tuple[str, tuple[str, ...]]] = {
    "admin": ("sandbox-admin", ("system:masters",)),
    "kube-scheduler": ("system:kube-scheduler", ()),
    "kube-controller-manager": ("system:kube-controller-manager", ()),
    # The API server's identity towards kubelets (logs, exec, port-forward),
    # named as kubeadm names it; real kubelets authorise it by webhook.
    "apiserver-kubelet-client": ("kube-apiserver-kubelet-client", ("system:masters",)),
}


@dataclass(frozen=True)
class CertPair:
    """A PEM certificate and its PEM private key on disk."""

    cert: Path
    key: Path


@dataclass(frozen=True)
class Pki:
    """Every file the control plane components and kubeconfigs refer to."""

    ca: CertPair
    apiserver: CertPair
    clients: dict[str, CertPair]
    front_proxy_ca: CertPair
    front_proxy_client: CertPair
    sa_public_key: Path
    sa_private_key: Path


def _new_key() -> ec.EllipticCurvePrivateKey:
    return ec.generate_private_key(ec.SECP256R1())


def _key_pem(key) -> bytes:
    return key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.PKCS8,
        serialization.NoEncryption(),
    )


def key_pem(key) -> bytes:
    """A private key as unencrypted PKCS#8 PEM."""
    return _key_pem(key)


def cert_pem(cert: x509.Certificate) -> bytes:
    """A certificate as PEM."""
    return cert.public_bytes(serialization.Encoding.PEM)


def load_private_key(path: Path):
    """A PEM private key from disk."""
    return serialization.load_pem_private_key(Path(path).read_bytes(), password=None)


def load_certificate(path: Path) -> x509.Certificate:
    """A PEM certificate from disk."""
    return x509.load_pem_x509_certificate(Path(path).read_bytes())


def _name(cn: str, orgs: tuple[str, ...] = ()) -> x509.Name:
    attrs = [x509.NameAttribute(NameOID.ORGANIZATION_NAME, o) for o in orgs]
    attrs.append(x509.NameAttribute(NameOID.COMMON_NAME, cn))
    return x509.Name(attrs)


def _write(path: Path, data: bytes, private: bool = False) -> None:
    path.write_bytes(data)
    if private:
        path.chmod(0o600)


def _builder(subject: x509.Name, issuer: x509.Name, public_key) -> x509.CertificateBuilder:
    # Back-date a little so a clock read a moment later in another process
    # never sees a certificate that is "not yet valid".
    now = datetime.datetime.now(datetime.timezone.utc) - datetime.timedelta(minutes=5)
    return (
        x509.CertificateBuilder()
        .subject_name(subject)
        .issuer_name(issuer)
        .public_key(public_key)
        .serial_number(x509.random_serial_number())
        .not_valid_before(now)
        .not_valid_after(now + VALIDITY)
    )


def make_ca(
    cn: str = "gpuspawner-sandbox-ca",
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A self-signed CA key and certificate."""
    key = _new_key()
    name = _name(cn)
    cert = (
        _builder(name, name, key.public_key())
        .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=True,
                crl_sign=True,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.SubjectKeyIdentifier.from_public_key(key.public_key()), critical=False)
        .sign(key, hashes.SHA256())
    )
    return key, cert


def issue(
    ca_key: ec.EllipticCurvePrivateKey,
    ca_cert: x509.Certificate,
    cn: str,
    orgs: tuple[str, ...] = (),
    *,
    server: bool = False,
    dns_names: tuple[str, ...] = (),
    ips: tuple[str, ...] = (),
) -> tuple[ec.EllipticCurvePrivateKey, x509.Certificate]:
    """A leaf key and certificate signed by the CA, for a server or a client."""
    key = _new_key()
    usage = ExtendedKeyUsageOID.SERVER_AUTH if server else ExtendedKeyUsageOID.CLIENT_AUTH
    builder = (
        _builder(_name(cn, orgs), ca_cert.subject, key.public_key())
        .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
        .add_extension(
            x509.KeyUsage(
                digital_signature=True,
                content_commitment=False,
                key_encipherment=False,
                data_encipherment=False,
                key_agreement=False,
                key_cert_sign=False,
                crl_sign=False,
                encipher_only=False,
                decipher_only=False,
            ),
            critical=True,
        )
        .add_extension(x509.ExtendedKeyUsage([usage]), critical=False)
        .add_extension(
            x509.AuthorityKeyIdentifier.from_issuer_public_key(ca_key.public_key()),
            critical=False,
        )
    )
    sans: list[x509.GeneralName] = [x509.DNSName(n) for n in dns_names]
    sans += [x509.IPAddress(ipaddress.ip_address(ip)) for ip in ips]
    if sans:
        builder = builder.add_extension(x509.SubjectAlternativeName(sans), critical=False)
    return key, builder.sign(ca_key, hashes.SHA256())


def _write_pair(directory: Path, stem: str, key, cert: x509.Certificate) -> CertPair:
    pair = CertPair(cert=directory / f"{stem}.crt", key=directory / f"{stem}.key")
    _write(pair.cert, cert.public_bytes(serialization.Encoding.PEM))
    _write(pair.key, _key_pem(key), private=True)
    return pair


def generate(directory: Path, host: str, service_ip: str) -> Pki:
    """Create a fresh CA, serving and client certificates and the SA key pair.

    ``host`` is the API server's address; ``service_ip`` is the first address of
    the service CIDR (ControlPlane.service_ip): the API server puts it in its own
    ``kubernetes`` Service, which pods dial through kube-proxy and verify against
    this certificate.
    """
    directory.mkdir(parents=True, exist_ok=True)
    directory.chmod(0o700)
    ca_key, ca_cert = make_ca()
    ca = _write_pair(directory, "ca", ca_key, ca_cert)

    ips = tuple(dict.fromkeys((host, "127.0.0.1", service_ip)))
    key, cert = issue(
        ca_key,
        ca_cert,
        "kube-apiserver",
        server=True,
        dns_names=APISERVER_DNS_NAMES,
        ips=ips,
    )
    apiserver = _write_pair(directory, "apiserver", key, cert)

    clients = {}
    for stem, (cn, orgs) in CLIENTS.items():
        key, cert = issue(ca_key, ca_cert, cn, orgs)
        clients[stem] = _write_pair(directory, stem, key, cert)

    # The aggregation layer's own CA, as kubeadm sets it up: the API server
    # publishes it (extension-apiserver-authentication) and the scheduler and
    # controller manager load it for their delegated authentication.
    fp_key, fp_cert = make_ca("gpuspawner-sandbox-front-proxy-ca")
    front_proxy_ca = _write_pair(directory, "front-proxy-ca", fp_key, fp_cert)
    key, cert = issue(fp_key, fp_cert, FRONT_PROXY_CLIENT)
    front_proxy_client = _write_pair(directory, "front-proxy-client", key, cert)

    # Service-account tokens are RS256-signed by default; an RSA key keeps
    # every consumer (including older clients verifying JWTs) happy.
    sa_key = rsa.generate_private_key(public_exponent=65537, key_size=2048)
    sa_private = directory / "sa.key"
    sa_public = directory / "sa.pub"
    _write(sa_private, _key_pem(sa_key), private=True)
    _write(
        sa_public,
        sa_key.public_key().public_bytes(
            serialization.Encoding.PEM, serialization.PublicFormat.SubjectPublicKeyInfo
        ),
    )
    return Pki(
        ca=ca,
        apiserver=apiserver,
        clients=clients,
        front_proxy_ca=front_proxy_ca,
        front_proxy_client=front_proxy_client,
        sa_public_key=sa_public,
        sa_private_key=sa_private,
    )
