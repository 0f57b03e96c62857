"""The secured local broker (``spark-abs local up --secure``): a CA and a
broker certificate made with ``cryptography`` (PEM, which Kafka reads as
key- and truststores), SCRAM users written into the metadata at format time,
and the ACLs of the job's user granted once the broker runs.

Everything lives in ``<runtime>/secrets`` (mode 0700, each file created
0600 but the CA certificate): the CA, the broker's key and certificate,
and one password file per user.  The users:

- ``admin``: the broker's own principal and the only super user; the
  controller listener (loopback, SASL_PLAINTEXT with PLAIN) and the broker
  listener between brokers use it;
- ``spark-abs``: the jobs' user, whose credentials the connection file
  names; no right until ``grant_job`` gives it the ACLs one job needs
  (``spark-abs local grant --secure``; prefixed on the job's own resources,
  literal on its ingress and sink topics: ``streaming.adapters.kafka.acls``);
- ``outsider``: authenticates, may do nothing (tests use it).

The listener clients use is SASL_SSL (SCRAM-SHA-512 or -256); the
controller listener is bound to 127.0.0.1 and takes only PLAIN from
``admin`` (the JAAS config in server.properties, itself 0600)."""

from __future__ import annotations

import base64
import datetime
import hashlib
import ipaddress
import secrets
from dataclasses import dataclass
from pathlib import Path

from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID

from streaming.adapters.kafka import acls
from streaming.adapters.kafka.acls import Grant
from streaming.api.config import KafkaAccess
from streaming.api.pipeline import Pipeline
from streaming.private_files import write_private

__all__ = ["ADMIN", "JOB_USER", "OUTSIDER", "MECHANISM", "BrokerSecurity"]

ADMIN, JOB_USER, OUTSIDER = "admin", "spark-abs", "outsider"
MECHANISM = "SCRAM-SHA-512"
_ITERATIONS = 8192
_HASHES = {"SCRAM-SHA-256": "sha256", "SCRAM-SHA-512": "sha512"}


@dataclass(frozen=True, slots=True)
class BrokerSecurity:
    """The secrets of one secured runtime, under ``dir``."""

    dir: Path

    @classmethod
    def prepare(cls, runtime_dir: Path) -> BrokerSecurity:
        """The runtime's secrets, made on first use and kept afterwards."""
        security = cls(runtime_dir / "secrets")
        security.dir.mkdir(mode=0o700, parents=True, exist_ok=True)
        security.dir.chmod(0o700)
        for user in (ADMIN, JOB_USER, OUTSIDER):
            if not security.password_file(user).exists():
                write_private(security.password_file(user), secrets.token_urlsafe(24))
        if not security.broker_pem.exists() or not security.ca_file.exists():
            security._make_certificates()
        return security

    @property
    def ca_file(self) -> Path:
        return self.dir / "ca.pem"

    @property
    def broker_pem(self) -> Path:
        """The broker's private key (PKCS#8) and certificate chain: its PEM keystore."""
        return self.dir / "broker.pem"

    def password_file(self, user: str) -> Path:
        return self.dir / f"{user}.password"

    def password(self, user: str) -> str:
        return self.password_file(user).read_text().strip()

    def access(self, servers: str, user: str = JOB_USER) -> KafkaAccess:
        """How ``user`` reaches the listener at ``servers``."""
        return KafkaAccess(
            servers,
            "SASL_SSL",
            MECHANISM,
            user,
            password_file=self.password_file(user),
            ca_file=self.ca_file,
        )

    def _make_certificates(self) -> None:
        now = datetime.datetime.now(datetime.UTC)
        ca_key = ec.generate_private_key(ec.SECP256R1())
        ca_name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "spark-abs local CA")])
        ca = (
            x509.CertificateBuilder()
            .subject_name(ca_name)
            .issuer_name(ca_name)
            .public_key(ca_key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=3650))
            .add_extension(x509.BasicConstraints(ca=True, path_length=0), critical=True)
            .add_extension(x509.KeyUsage(False, False, False, False, False, True, True, False, False), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        key = ec.generate_private_key(ec.SECP256R1())
        names = [x509.DNSName("localhost"), x509.IPAddress(ipaddress.ip_address("127.0.0.1"))]
        cert = (
            x509.CertificateBuilder()
            .subject_name(x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")]))
            .issuer_name(ca_name)
            .public_key(key.public_key())
            .serial_number(x509.random_serial_number())
            .not_valid_before(now - datetime.timedelta(minutes=5))
            .not_valid_after(now + datetime.timedelta(days=825))
            .add_extension(x509.SubjectAlternativeName(names), critical=False)
            .add_extension(x509.BasicConstraints(ca=False, path_length=None), critical=True)
            .sign(ca_key, hashes.SHA256())
        )
        pem = serialization.Encoding.PEM
        key_pem = key.private_bytes(pem, serialization.PrivateFormat.PKCS8, serialization.NoEncryption())
        write_private(self.broker_pem, key_pem + cert.public_bytes(pem) + ca.public_bytes(pem))
        # the CA's key signs nothing more: it is not kept
        self.ca_file.write_bytes(ca.public_bytes(pem))

    # -- the broker's side ---------------------------------------------------

    def scram_arguments(self) -> list[str]:
        """``--add-scram`` arguments of ``kafka-storage format``: each user's
        credential for both SCRAM mechanisms, salted here, so no password is
        on a command line."""
        args = []
        for user in (ADMIN, JOB_USER, OUTSIDER):
            for mechanism, digest in _HASHES.items():
                salt = secrets.token_bytes(24)
                salted = hashlib.pbkdf2_hmac(digest, self.password(user).encode(), salt, _ITERATIONS)
                args += [
                    "--add-scram",
                    f"{mechanism}=[name={user},iterations={_ITERATIONS},"
                    f'salt="{base64.b64encode(salt).decode()}",saltedpassword="{base64.b64encode(salted).decode()}"]',
                ]
        return args

    def listener_properties(self, port: int, controller_port: int) -> list[str]:
        """server.properties lines of a node whose clients' listener (``SASL_SSL``)
        is at ``port`` and whose controller listener (loopback, PLAIN from
        ``admin`` alone) is at ``controller_port``."""
        admin = self.password(ADMIN).replace('"', '\\"')
        scram = (
            f'org.apache.kafka.common.security.scram.ScramLoginModule required username="{ADMIN}" password="{admin}";'
        )
        plain = (
            f'org.apache.kafka.common.security.plain.PlainLoginModule required username="{ADMIN}" '
            f'password="{admin}" user_{ADMIN}="{admin}";'
        )
        return [
            f"listeners=SASL_SSL://127.0.0.1:{port},CONTROLLER://127.0.0.1:{controller_port}",
            f"advertised.listeners=SASL_SSL://127.0.0.1:{port}",
            "controller.listener.names=CONTROLLER",
            "inter.broker.listener.name=SASL_SSL",
            "listener.security.protocol.map=SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT",
            "sasl.enabled.mechanisms=SCRAM-SHA-512,SCRAM-SHA-256",
            f"sasl.mechanism.inter.broker.protocol={MECHANISM}",
            "sasl.mechanism.controller.protocol=PLAIN",
            "listener.name.controller.sasl.enabled.mechanisms=PLAIN",
            f"listener.name.controller.plain.sasl.jaas.config={plain}",
            f"listener.name.sasl_ssl.scram-sha-512.sasl.jaas.config={scram}",
            f"listener.name.sasl_ssl.scram-sha-256.sasl.jaas.config={scram}",
            "ssl.keystore.type=PEM",
            f"ssl.keystore.location={self.broker_pem}",
            "ssl.truststore.type=PEM",
            f"ssl.truststore.location={self.ca_file}",
            "ssl.client.auth=none",
            "authorizer.class.name=org.apache.kafka.metadata.authorizer.StandardAuthorizer",
            "allow.everyone.if.no.acl.found=false",
            f"super.users=User:{ADMIN}",
        ]

    def revoke_wildcards(self, servers: str) -> int:
        """Remove what an earlier version granted ``spark-abs`` at start (All on every topic, group
        and transactional id): the job user holds only what ``grant_job`` gives (as ``admin``;
        idempotent).  How many ACLs went."""
        everything = [Grant(kind, "*", ("ALL",)) for kind in ("TOPIC", "GROUP", "TRANSACTIONAL_ID")]
        return acls.revoke(self.access(servers, ADMIN), JOB_USER, everything)

    def grant_job(self, servers: str, pipeline: Pipeline) -> list[Grant]:
        """Grant ``spark-abs`` what ``pipeline``'s job needs (``acls.job_grants``, with cleanup: a
        drill's retention kind and the tests delete topics), as ``admin``; idempotent."""
        grants = acls.job_grants(pipeline, cleanup=True)
        acls.grant(self.access(servers, ADMIN), JOB_USER, grants)
        return grants
