"""The secured broker's pieces, without a broker: secrets created its
owner's alone, server.properties with SASL_SSL, PEM stores and ACLs on, and
no password on the format command line."""

from __future__ import annotations

import os
import shlex
import stat

from cryptography import x509

from streaming.local.kafka_broker import FORMAT_ARGS, broker_properties, format_command
from streaming.local.kafka_security import ADMIN, JOB_USER, OUTSIDER, BrokerSecurity


def _mode(path) -> int:
    return stat.S_IMODE(path.stat().st_mode)


def test_secrets_are_made_once_and_only_their_owner_reads_them(tmp_path):
    security = BrokerSecurity.prepare(tmp_path)
    assert _mode(security.dir) == 0o700
    for user in (ADMIN, JOB_USER, OUTSIDER):
        assert _mode(security.password_file(user)) == 0o600 and len(security.password(user)) >= 24
    assert _mode(security.broker_pem) == 0o600
    assert len({security.password(u) for u in (ADMIN, JOB_USER, OUTSIDER)}) == 3
    again = BrokerSecurity.prepare(tmp_path)
    assert again.password(JOB_USER) == security.password(JOB_USER)
    cert = x509.load_pem_x509_certificates(security.broker_pem.read_bytes())[0]
    names = cert.extensions.get_extension_for_class(x509.SubjectAlternativeName).value
    assert "localhost" in names.get_values_for_type(x509.DNSName)
    assert not list(security.dir.glob("*key*")), "the CA's key is not kept"


def test_the_secured_node_takes_sasl_ssl_with_acls_and_its_controller_stays_on_loopback(tmp_path):
    security = BrokerSecurity.prepare(tmp_path)
    props = dict(
        line.split("=", 1)
        for line in broker_properties(tmp_path / "data", 9093, 9094, security=security).splitlines()
        if line
    )
    assert props["listeners"] == "SASL_SSL://127.0.0.1:9093,CONTROLLER://127.0.0.1:9094"
    assert props["listener.security.protocol.map"] == "SASL_SSL:SASL_SSL,CONTROLLER:SASL_PLAINTEXT"
    assert props["ssl.keystore.type"] == props["ssl.truststore.type"] == "PEM"
    assert props["authorizer.class.name"] == "org.apache.kafka.metadata.authorizer.StandardAuthorizer"
    assert props["allow.everyone.if.no.acl.found"] == "false" and props["super.users"] == f"User:{ADMIN}"
    assert security.password(JOB_USER) not in "".join(props.values())
    plain = broker_properties(tmp_path / "data", 9093, 9094)
    assert "PLAINTEXT://127.0.0.1:9093" in plain and "authorizer" not in plain


def test_the_format_command_adds_salted_scram_users_off_its_command_line(tmp_path):
    """The salted passwords log one in as well as the passwords: they are in
    an argument file only its owner can read, not on the command line (``ps``)."""
    security = BrokerSecurity.prepare(tmp_path)
    argv = format_command("java", tmp_path, tmp_path / "c", tmp_path / "l", tmp_path, "cid", security)
    argfile = tmp_path / FORMAT_ARGS
    assert argv[-1] == f"@{argfile}" and "--add-scram" not in argv and "kafka.tools.StorageTool" not in argv
    assert os.stat(argfile).st_mode & 0o777 == 0o600
    # read back as the java launcher reads it: whitespace-separated, double quotes with backslash escapes
    lexer = shlex.shlex(argfile.read_text(), posix=True)
    lexer.whitespace_split, lexer.escapedquotes = True, '"'
    args = list(lexer)
    assert args[:7] == [
        "kafka.tools.StorageTool",
        "format",
        "-t",
        "cid",
        "-c",
        str(tmp_path / "c"),
        "--ignore-formatted",
    ]
    scram = [args[i + 1] for i, a in enumerate(args) if a == "--add-scram"]
    assert len(scram) == 6 and all('saltedpassword="' in s for s in scram)
    assert {s.split("name=")[1].split(",")[0] for s in scram} == {ADMIN, JOB_USER, OUTSIDER}
    assert not any(security.password(u) in argfile.read_text() for u in (ADMIN, JOB_USER, OUTSIDER))
