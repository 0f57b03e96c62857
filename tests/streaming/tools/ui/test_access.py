"""Who may read ``spark-abs ui``'s pages (``streaming.tools.ui.access``), through
Flask's test client and, for what the server logs and the command refuses,
a served app and the command itself: a request naming a foreign ``Host`` is
refused (DNS rebinding), loopback's names and the allowed ones are served;
with a token, a request without it or with another is 401 and one with it
200, ``?token=`` once sets a cookie; the token shows in no page and no log
line; off loopback the command does not start without one."""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading
import urllib.error
import urllib.request
from pathlib import Path

import pytest

from streaming.errors import ConfigError
from streaming.tools.ui.access import COOKIE, TOKEN_ENV, Access, host_name, is_loopback, read_token
from streaming.tools.ui.app import JobSource, create_app, serve

JOB = "ledger"
TOKEN = "s3cr3t-t0ken-of-the-test"
PAGES = ("/", "/generations", "/reports", "/checkpoints/1", "/assets/plotly.min.js", "/no-such-page")


@pytest.fixture
def source(tmp_path) -> JobSource:
    (tmp_path / "store").mkdir()
    return JobSource(f"file://{tmp_path / 'store'}", JOB, home=tmp_path / "home")


def _client(source: JobSource, access: Access | None = None):
    return create_app(source, refresh_s=0, access=access).test_client()


@pytest.mark.parametrize(
    ("header", "name"),
    [
        ("localhost:8050", "localhost"),
        ("127.0.0.1", "127.0.0.1"),
        ("[::1]:8050", "::1"),
        ("[::1]", "::1"),
        ("Evil.Example:80", "evil.example"),
        ("127.0.0.1.nip.io:8050", "127.0.0.1.nip.io"),
    ],
)
def test_the_host_name_of_a_host_header(header, name):
    assert host_name(header) == name


@pytest.mark.parametrize("host", ["evil.example", "evil.example:8050", "127.0.0.1.nip.io:8050", "localhost.evil:80"])
def test_a_foreign_host_is_refused_on_every_page(source, host):
    client = _client(source)
    for url in PAGES:
        answer = client.get(url, headers={"Host": host})
        assert answer.status_code == 400, (url, host)
        said = answer.get_data(as_text=True)
        assert "this page answers to 127.0.0.1, [::1], localhost" in said
        assert f"--allow-host {host_name(host)}" in said


@pytest.mark.parametrize("host", ["localhost", "localhost:8050", "127.0.0.1:8050", "[::1]:8050", "LOCALHOST:1"])
def test_loopbacks_names_are_served(source, host):
    assert _client(source).get("/reports", headers={"Host": host}).status_code == 200


def test_an_allowed_host_is_served_and_only_it(source):
    client = _client(source, Access().allowing(["ui.internal"]))
    assert client.get("/reports", headers={"Host": "ui.internal:8050"}).status_code == 200
    assert client.get("/reports", headers={"Host": "localhost:8050"}).status_code == 200
    assert client.get("/reports", headers={"Host": "other.internal:8050"}).status_code == 400


def test_with_a_token_a_request_without_it_or_with_another_is_401(source):
    client = _client(source, Access(token=TOKEN))
    wrong = (
        {},
        {"Authorization": "Bearer not-the-token"},
        {"Authorization": f"Basic {TOKEN}"},
        {"Authorization": f"Bearer {TOKEN}x"},
    )
    for url in PAGES:
        for headers in wrong:
            answer = client.get(url, headers=headers)
            assert answer.status_code == 401, (url, headers)
            assert answer.headers["WWW-Authenticate"].startswith("Bearer")
            assert "Authorization: Bearer <token>" in answer.get_data(as_text=True)
    assert client.get("/reports?token=not-the-token").status_code == 401
    client.set_cookie(COOKIE, "not-the-token")
    assert client.get("/reports").status_code == 401


def test_the_host_is_checked_before_the_token(source):
    client = _client(source, Access(token=TOKEN))
    answer = client.get("/reports", headers={"Host": "evil.example", "Authorization": f"Bearer {TOKEN}"})
    assert answer.status_code == 400


def test_the_right_token_is_served_and_shows_in_no_page(source):
    client = _client(source, Access(token=TOKEN))
    for url in ("/", "/generations", "/reports"):
        answer = client.get(url, headers={"Authorization": f"Bearer {TOKEN}"})
        assert answer.status_code in (200, 404), url  # 404: a job the store does not know, a page that says so
        assert "<html" in answer.get_data(as_text=True).lower()
        assert TOKEN not in answer.get_data(as_text=True)
        assert answer.headers["Referrer-Policy"] == "no-referrer"


def test_a_token_in_the_query_sets_a_cookie_once_and_leaves_the_address(source):
    client = _client(source, Access(token=TOKEN))
    answer = client.get(f"/checkpoints/1/state?rows=5&token={TOKEN}&task=a-0")
    assert answer.status_code == 303
    assert answer.headers["Location"] == "/checkpoints/1/state?rows=5&task=a-0"
    cookie = answer.headers["Set-Cookie"]
    assert cookie.startswith(f"{COOKIE}={TOKEN};")
    assert {"HttpOnly", "SameSite=Strict", "Path=/"} <= {part.strip() for part in cookie.split(";")}
    assert TOKEN not in answer.get_data(as_text=True)
    # the browser now carries the cookie
    assert client.get("/reports").status_code == 200
    # and is sent nowhere else
    elsewhere = client.get("/", query_string={"token": TOKEN}, environ_overrides={"PATH_INFO": "//evil.example/"})
    assert elsewhere.headers["Location"] == "/evil.example/"


def test_the_token_comes_from_the_environment_or_a_file_only_its_owner_reads(tmp_path):
    assert read_token({}) is None
    assert read_token({TOKEN_ENV: f" {TOKEN}\n"}) == TOKEN
    path = tmp_path / "token"
    path.write_text(f"{TOKEN}\n")
    path.chmod(0o600)
    assert read_token({}, path) == TOKEN
    with pytest.raises(ConfigError, match="give one"):
        read_token({TOKEN_ENV: TOKEN}, path)
    path.chmod(0o640)
    with pytest.raises(ConfigError, match=r"the token file .* can be read by others \(mode 640\): `chmod 600"):
        read_token({}, path)
    path.write_text("\n")
    path.chmod(0o600)
    with pytest.raises(ConfigError, match="is empty"):
        read_token({}, path)
    with pytest.raises(ConfigError, match="the token file .* cannot be read"):
        read_token({}, tmp_path / "none")
    with pytest.raises(ConfigError, match="empty"):
        Access(token=" ")


@pytest.mark.parametrize(
    ("host", "loopback"),
    [("127.0.0.1", True), ("127.0.0.2", True), ("::1", True), ("localhost", True), ("0.0.0.0", False), ("::", False)]
    + [("10.0.0.5", False), ("ui.internal", False)],
)
def test_what_is_loopback(host, loopback):
    assert is_loopback(host) is loopback


def test_the_servers_log_never_shows_the_token(source, caplog):
    caplog.set_level(logging.INFO, logger="werkzeug")
    server = serve(create_app(source, refresh_s=0, access=Access(token=TOKEN)), "127.0.0.1", 0)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    base = f"http://127.0.0.1:{server.server_port}"
    try:
        for url in (f"/reports?token={TOKEN}", f"/reports?rows=1&token={TOKEN}x", "/reports"):
            try:
                urllib.request.urlopen(base + url, timeout=10).close()
            except urllib.error.HTTPError as exc:
                assert exc.code in (401, 303), url
    finally:
        server.shutdown()
        server.server_close()
        thread.join(10)
    logged = caplog.text
    assert "GET /reports?token=<redacted>" in logged and "?rows=1&token=<redacted>" in logged
    assert TOKEN not in logged


def _ui(*args: str, env: dict[str, str] | None = None) -> subprocess.Popen:
    return subprocess.Popen(
        [sys.executable, "-m", "streaming.tools.cli", "ui", *args],
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
        env={k: v for k, v in os.environ.items() if k != TOKEN_ENV} | (env or {}),
    )


def test_the_command_off_loopback_does_not_start_without_a_token(source):
    where = ("--store", source.store, "--job", JOB, "--store-only", "--port", "0")
    for host in ("0.0.0.0", "::", "10.0.0.5"):
        refused = _ui(*where, "--host", host)
        out, _ = refused.communicate(timeout=60)
        assert refused.returncode == 2, out
        assert f"serving on {host}, not loopback, needs a token" in out and TOKEN_ENV in out, out
        assert "--token-file PATH" in out and "Traceback" not in out


def test_the_command_off_loopback_with_a_token_asks_for_it_and_never_prints_it(source, tmp_path: Path):
    where = ("--store", source.store, "--job", JOB, "--store-only", "--port", "0")
    served = _ui(*where, "--host", "0.0.0.0", "--allow-host", "ui.internal", env={TOKEN_ENV: TOKEN})
    try:
        said = [served.stdout.readline() for _ in range(2)]
        port = next(m.group(1) for line in said if (m := re.search(r"http://0\.0\.0\.0:(\d+)/", line)))
        refused = urllib.request.Request(f"http://127.0.0.1:{port}/reports")
        with pytest.raises(urllib.error.HTTPError) as exc:
            urllib.request.urlopen(refused, timeout=10)
        assert exc.value.code == 401
        given = urllib.request.Request(
            f"http://127.0.0.1:{port}/reports", headers={"Authorization": f"Bearer {TOKEN}", "Host": "ui.internal"}
        )
        with urllib.request.urlopen(given, timeout=10) as page:
            assert page.status == 200 and TOKEN not in page.read().decode()
    finally:
        served.terminate()
        out = served.communicate(timeout=30)[0]
    said_all = "".join(said) + out
    assert any("not loopback: every request must carry the token" in line for line in said), said
    assert "ui.internal" in said_all and "asks for the token" in said_all
    assert TOKEN not in said_all
