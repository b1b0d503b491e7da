"""The sandbox's certificates: who they name and what they are valid for."""

from __future__ import annotations

import ipaddress
import ssl

from cryptography import x509
from cryptography.x509.oid import ExtendedKeyUsageOID, NameOID

from gpuspawner_sandbox import pki


def subject(cert: x509.Certificate, oid) -> list[str]:
    return [a.value for a in cert.subject.get_attributes_for_oid(oid)]


def test_apiserver_certificate_names_every_address_clients_use(tmp_path):
    p = pki.generate(tmp_path, host="127.0.0.1", service_ip="10.244.255.129")
    cert = pki.load_certificate(p.apiserver.cert)
    sans = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert set(sans.get_values_for_type(x509.DNSName)) == {
        "localhost",
        "kubernetes",
        "kubernetes.default",
        "kubernetes.default.svc",
        "kubernetes.default.svc.cluster.local",
    }
    assert set(sans.get_values_for_type(x509.IPAddress)) == {
        ipaddress.ip_address("127.0.0.1"),
        ipaddress.ip_address("10.244.255.129"),
    }
    usage = cert.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.SERVER_AUTH in usage


def test_client_identities_carry_kubernetes_users_and_groups(tmp_path):
    p = pki.generate(tmp_path, host="127.0.0.1", service_ip="10.244.255.129")
    admin = pki.load_certificate(p.clients["admin"].cert)
    assert subject(admin, NameOID.ORGANIZATION_NAME) == ["system:masters"]
    scheduler = pki.load_certificate(p.clients["kube-scheduler"].cert)
    assert subject(scheduler, NameOID.COMMON_NAME) == ["system:kube-scheduler"]
    cm = pki.load_certificate(p.clients["kube-controller-manager"].cert)
    assert subject(cm, NameOID.COMMON_NAME) == ["system:kube-controller-manager"]
    usage = admin.extensions.get_extension_for_class(x509.ExtendedKeyUsage).value
    assert ExtendedKeyUsageOID.CLIENT_AUTH in usage


def test_everything_chains_to_the_ca_and_keys_are_private(tmp_path):
    p = pki.generate(tmp_path, host="127.0.0.1", service_ip="10.244.255.129")
    ca = pki.load_certificate(p.ca.cert)
    for pair in [p.apiserver, *p.clients.values()]:
        cert = pki.load_certificate(pair.cert)
        cert.verify_directly_issued_by(ca)
        # ssl accepts the pair as a client/server credential
        ssl.create_default_context().load_cert_chain(str(pair.cert), str(pair.key))
        assert pair.key.stat().st_mode & 0o077 == 0
    assert p.sa_private_key.stat().st_mode & 0o077 == 0
    assert b"PUBLIC KEY" in p.sa_public_key.read_bytes()
