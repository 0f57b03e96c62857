"""A client of a Confluent-compatible schema registry (the local runtime's
is Apicurio Registry, ``streaming.local.schema_registry``): Avro schemas by
id for ingress values in Confluent's wire format, and schemas registered
under a subject for the values a Kafka sink writes.

Subjects follow Confluent's default strategy: ``<topic>-value``.  A schema
fetched by id never changes (an id names one schema for good), so it is
cached for the life of the process; a subject's ids are asked again when a
value names an id the cache does not have.

Every request waits a bounded time: while the registry is unreachable it is
tried again for up to ``bound_s`` (60 s), then a ``RegistryUnavailableError``
names the registry and the bound.  An id the registry does not have is an
``UnknownSchemaError``: a record naming it is a dead letter, not a failure.
"""

from __future__ import annotations

import base64
import json
import logging
import os
import ssl
import threading
import time
import urllib.error
import urllib.parse
import urllib.request
from collections.abc import Mapping
from pathlib import Path
from typing import Any

import fastavro

from streaming.api.avro_schema import subject_of
from streaming.api.config import ENV, Connection
from streaming.api.job_key import read_secret_file
from streaming.api.pipeline import Pipeline
from streaming.errors import ConfigError, SparkAbsError
from streaming.hosts import is_loopback
from streaming.waits import WaitTimeout, retry

__all__ = [
    "MalformedAnswer",
    "MAX_ANSWER_BYTES",
    "unbounded_items",
    "SchemaRegistry",
    "RegistryUnavailableError",
    "UnknownSchemaError",
    "subject_of",
    "use_registry",
    "use_connection_registry",
    "registry_of",
    "current_registry",
    "REGISTRY_BOUND_S",
    "check_registry",
    "registry_users",
]

log = logging.getLogger(__name__)

# how long a request waits for an unreachable registry, in all
REGISTRY_BOUND_S = 60.0
# how long an id found not to be a version of a subject is taken as such before the registry is asked again
_ASK_AGAIN_S = 30.0
_CONTENT_TYPE = "application/vnd.schemaregistry.v1+json"


class RegistryUnavailableError(SparkAbsError):
    """The schema registry did not answer within its bound."""


class MalformedAnswer(ValueError):
    """The registry answered what a Confluent-compatible registry never does
    (no JSON, no ``schema`` or ``id``, nesting past the recursion limit, an
    answer over ``MAX_ANSWER_BYTES``), or gave a schema no value can be read
    with safely (``unbounded_items``): the values that name it are dead
    letters with the reason."""


# the largest answer of the registry read: a schema of thousands of fields takes a few hundred KB
MAX_ANSWER_BYTES = 4 << 20


class UnknownSchemaError(SparkAbsError):
    """The registry has no schema of that id."""


class SchemaRegistry:
    """The registry whose Confluent-compatible API is at ``url``
    (``http://host:port/apis/ccompat/v7`` for Apicurio's); with ``username``
    and ``password``, reached with HTTP basic authentication (over https://,
    or http:// to loopback only); ``ca_file``: the CA its https:// certificate
    is checked against.  A redirect to another host (or from https:// to
    http://) is refused: what a registry answers comes from the registry."""

    def __init__(
        self,
        url: str,
        *,
        bound_s: float = REGISTRY_BOUND_S,
        timeout_s: float = 10.0,
        username: str | None = None,
        password: str | None = None,
        ca_file: str | None = None,
    ):
        parsed = urllib.parse.urlparse(url)
        if parsed.scheme not in ("http", "https") or not parsed.netloc:
            raise ConfigError(f"schema registry {url!r}: give its API's URL, http://host:port/apis/ccompat/v7")
        if username and parsed.scheme == "http" and not is_loopback(parsed.hostname or ""):
            raise ConfigError(
                f"schema registry {url}: credentials would cross the network in clear over http://; give its https:// URL"
            )
        context = ssl.create_default_context(cafile=ca_file) if ca_file else None
        self._opener = urllib.request.build_opener(
            _SameOrigin(_origin(url)), urllib.request.HTTPSHandler(context=context)
        )
        self._authorization = (
            "Basic " + base64.b64encode(f"{username}:{password or ''}".encode()).decode() if username else None
        )
        self.url = url.rstrip("/")
        self.bound_s = bound_s
        self.timeout_s = timeout_s
        self._schemas: dict[int, str] = {}
        self._parsed: dict[int, Any] = {}
        self._registered: dict[tuple[str, str], int] = {}
        # per subject, the id of each version seen; ids the registry said it does not have
        self._versions: dict[str, dict[int, int]] = {}
        self._missing: set[int] = set()
        self._outside: dict[tuple[str, int], float] = {}
        self._lock = threading.Lock()

    def __repr__(self) -> str:
        return f"SchemaRegistry({self.url!r})"

    # -- reading -------------------------------------------------------------

    def schema(self, schema_id: int) -> str:
        """The schema of ``schema_id``, as JSON text (an ``UnknownSchemaError``
        when the registry does not have it: asked once per process)."""
        with self._lock:
            if schema_id in self._schemas:
                return self._schemas[schema_id]
            if schema_id in self._missing:
                raise UnknownSchemaError(f"schema id {schema_id} is not in the schema registry at {self.url}")
        try:
            answer = self._request("GET", f"/schemas/ids/{int(schema_id)}", missing=f"schema id {schema_id}")
        except UnknownSchemaError:
            with self._lock:
                self._missing.add(schema_id)
            raise
        text = _field(answer, "schema", str, f"schema id {schema_id}")
        with self._lock:
            self._schemas[schema_id] = text
        return text

    def parsed(self, schema_id: int) -> Any:
        """The schema of ``schema_id`` parsed by fastavro (a writer schema to
        read values with); a ``ValueError`` when it is not an Avro schema (a
        registry keeps JSON Schema and Protobuf too)."""
        with self._lock:
            if schema_id in self._parsed:
                return self._parsed[schema_id]
        text = self.schema(schema_id)
        try:
            parsed = fastavro.parse_schema(json.loads(text))
        except Exception as exc:  # JSON that is not Avro, or not JSON at all, or nested past the recursion limit
            raise ValueError(f"schema id {schema_id} is not an Avro schema: {type(exc).__name__}: {exc}") from exc
        unbounded = unbounded_items(parsed)
        if unbounded is not None:
            raise MalformedAnswer(
                f"schema id {schema_id} has {unbounded}: a value of a few bytes could declare billions of its "
                "items, each read from no bytes; values written with it are not read"
            )
        with self._lock:
            self._parsed[schema_id] = parsed
        return parsed

    def ids(self, subject: str, *, bound_s: float | None = None) -> list[int]:
        """The ids of every version of ``subject``, oldest first (none when it
        has none): one request for its versions, one more per version not
        seen before.  ``bound_s``: how long to wait for an unreachable
        registry (default: the client's bound)."""
        try:
            versions = self._request(
                "GET", f"/subjects/{_quote(subject)}/versions", missing=f"subject {subject}", bound_s=bound_s
            )
        except UnknownSchemaError:
            return []
        with self._lock:
            known = dict(self._versions.get(subject, {}))
        if not isinstance(versions, list) or not all(isinstance(v, int) and not isinstance(v, bool) for v in versions):
            raise MalformedAnswer(f"the versions of subject {subject} are not a list of numbers: {str(versions)[:200]}")
        for version in versions:
            if version in known:
                continue
            answer = self._request(
                "GET", f"/subjects/{_quote(subject)}/versions/{version}", missing=subject, bound_s=bound_s
            )
            what = f"version {version} of subject {subject}"
            schema_id = _field(answer, "id", int, what)
            known[version] = schema_id
            with self._lock:
                self._schemas.setdefault(schema_id, _field(answer, "schema", str, what))
        with self._lock:
            self._versions[subject] = known
        return [known[v] for v in versions]

    def writer(self, schema_id: int, subject: str) -> Any:
        """The parsed writer schema of ``schema_id``, which must be a version
        of ``subject`` (its versions asked again once when it is not among
        those seen): an ``UnknownSchemaError`` saying which it is not, a
        ``ValueError`` when it is not Avro."""
        outside = UnknownSchemaError(
            f"schema id {schema_id} is not a version of subject {subject} in the schema registry at {self.url}"
        )
        with self._lock:
            seen = schema_id in self._versions.get(subject, {}).values()
            # an id found outside the subject is asked about again only after a while, not per value
            asked_at = self._outside.get((subject, schema_id))
        if not seen:
            if asked_at is not None and time.monotonic() - asked_at < _ASK_AGAIN_S:
                raise outside
            if schema_id not in self.ids(subject):
                with self._lock:
                    self._outside[(subject, schema_id)] = time.monotonic()
                raise outside
        return self.parsed(schema_id)

    # -- writing -------------------------------------------------------------

    def register(self, subject: str, schema: str | dict) -> int:
        """The id of ``schema`` under ``subject``, registered if it is not yet
        (the registry's compatibility rule decides whether it may be)."""
        text = schema if isinstance(schema, str) else json.dumps(schema, sort_keys=True)
        with self._lock:
            if (subject, text) in self._registered:
                return self._registered[(subject, text)]
        answer = self._request("POST", f"/subjects/{_quote(subject)}/versions", body={"schema": text})
        schema_id = _field(answer, "id", int, f"the registration under {subject}")
        with self._lock:
            self._registered[(subject, text)] = schema_id
            self._schemas.setdefault(schema_id, text)
        return schema_id

    # -- the wire ------------------------------------------------------------

    def _request(
        self, method: str, path: str, *, body: Any = None, missing: str = "", bound_s: float | None = None
    ) -> Any:
        bound_s = self.bound_s if bound_s is None else bound_s
        data = None if body is None else json.dumps(body).encode()
        headers = {"Content-Type": _CONTENT_TYPE, "Accept": _CONTENT_TYPE}
        if self._authorization is not None:
            headers["Authorization"] = self._authorization
        request = urllib.request.Request(self.url + path, data=data, method=method, headers=headers)

        def once() -> Any:
            try:
                with self._opener.open(request, timeout=self.timeout_s) as response:
                    body = response.read(MAX_ANSWER_BYTES + 1)
            except urllib.error.HTTPError as exc:
                said = exc.read(300).decode(errors="replace")
                if exc.code == 404 and missing:
                    raise UnknownSchemaError(f"{missing} is not in the schema registry at {self.url}") from exc
                if exc.code >= 500:
                    raise ConnectionError(f"HTTP {exc.code}: {said}") from exc
                if exc.code in (401, 403):
                    given = "refused the credentials given" if self._authorization else "asks for credentials"
                    raise ConfigError(
                        f"schema registry {self.url}: {method} {path} refused (HTTP {exc.code}): it {given}; set "
                        f"{ENV['schema_registry_user']} and {ENV['schema_registry_password_file']} (the local "
                        "runtime's connection file names its registry's own)"
                    ) from exc
                raise ConfigError(
                    f"schema registry {self.url}: {method} {path} refused (HTTP {exc.code}): {said}"
                ) from exc
            if len(body) > MAX_ANSWER_BYTES:
                raise MalformedAnswer(f"{method} {path}: an answer over {MAX_ANSWER_BYTES} bytes (MAX_ANSWER_BYTES)")
            try:
                return json.loads(body or b"null")
            except (ValueError, RecursionError) as exc:
                raise MalformedAnswer(f"{method} {path}: the answer is no JSON this client reads: {exc}") from None

        try:
            return retry(
                once,
                bound_s,
                f"the schema registry at {self.url} answering {method} {path}",
                retry_on=(urllib.error.URLError, ConnectionError, TimeoutError),
                bound="REGISTRY_BOUND_S",
                first_s=0.5,
                max_s=8.0,
                logger=log,
            )
        except WaitTimeout as timeout:  # the wording names the last failure
            raise RegistryUnavailableError(
                f"the schema registry at {self.url} did not answer {method} {path} within {bound_s:g} s "
                f"(REGISTRY_BOUND_S): {timeout.__cause__}; is it running (spark-abs local status)?"
            ) from timeout.__cause__


def _field(answer: Any, name: str, kind: type, what: str) -> Any:
    """``answer[name]`` when ``answer`` is a JSON object with it, of ``kind``;
    a ``MalformedAnswer`` naming ``what`` was asked otherwise."""
    value = answer.get(name) if isinstance(answer, dict) else None
    if not isinstance(value, kind) or isinstance(value, bool):
        raise MalformedAnswer(f"the registry's answer for {what} has no {name} ({kind.__name__}): {str(answer)[:200]}")
    return value


def unbounded_items(schema: Any) -> str | None:
    """Where ``schema`` (as fastavro parses it) has an array or a map whose
    items take no bytes (``null``, a fixed of size 0, a record of such
    fields): a value could declare 2^62 of them in ten bytes, and a reader
    would count them all.  None when it has none; any other item takes a
    byte at least, so a count past the bytes left ends the read."""
    named: dict[str, Any] = {}

    def empty(node: Any, seen: frozenset[str]) -> bool:
        if isinstance(node, str):
            if node in named and node not in seen:
                return empty(named[node], seen | {node})
            return node == "null"
        if isinstance(node, list):  # a union: its branch index takes a byte
            return False
        if not isinstance(node, dict):
            return False
        kind = node.get("type")
        if isinstance(node.get("name"), str):
            named.setdefault(node["name"], node)
        if kind == "fixed":
            return node.get("size") == 0
        if kind in ("record", "error"):
            return all(empty(f.get("type"), seen) for f in node.get("fields", []))
        if kind in ("array", "map"):
            return False  # a count of zero takes a byte
        return empty(kind, seen) if isinstance(kind, (str, dict)) else False

    def walk(node: Any, path: str, depth: int) -> str | None:
        if depth > 200:
            return None
        if isinstance(node, list):
            return next((w for w in (walk(b, path, depth + 1) for b in node) if w), None)
        if not isinstance(node, dict):
            return None
        kind = node.get("type")
        if isinstance(node.get("name"), str):
            named.setdefault(node["name"], node)
        if kind in ("array", "map"):
            items = node.get("items" if kind == "array" else "values")
            if empty(items, frozenset()):
                shown = items.get("type") if isinstance(items, dict) else items
                return f"{kind}<{shown}> at {path or 'its top'}"
            return walk(items, f"{path}[]", depth + 1)
        if kind in ("record", "error"):
            for field in node.get("fields", []):
                found = walk(
                    field.get("type"), f"{path}.{field.get('name')}" if path else str(field.get("name")), depth + 1
                )
                if found:
                    return found
            return None
        return walk(kind, path, depth + 1) if isinstance(kind, (dict, list)) else None

    return walk(schema, "", 0)


def _origin(url: str) -> tuple[str, str]:
    parsed = urllib.parse.urlparse(url)
    return parsed.scheme.lower(), parsed.netloc.lower()


class _SameOrigin(urllib.request.HTTPRedirectHandler):
    """Follows a registry's redirects on its own scheme and host only."""

    def __init__(self, origin: tuple[str, str]):
        self.origin = origin

    def redirect_request(self, req: Any, fp: Any, code: int, msg: str, headers: Any, newurl: str) -> Any:
        target = urllib.parse.urljoin(req.full_url, newurl)
        if _origin(target) != self.origin:
            raise ConfigError(
                f"schema registry {self.origin[0]}://{self.origin[1]}: {req.get_method()} {req.full_url} was "
                f"redirected (HTTP {code}) to {target}, another scheme or host: refused, as a registry's answers "
                "come from the registry (give the URL it redirects to, if it is yours)"
            )
        return super().redirect_request(req, fp, code, msg, headers, newurl)


def _quote(subject: str) -> str:
    return urllib.parse.quote(subject, safe="")


_current: SchemaRegistry | None = None


def use_registry(url: str | None, environ: Mapping[str, str] | None = None) -> SchemaRegistry | None:
    """Make the registry at ``url`` (None or "": none) the one this process's
    decoders read writer schemas from, reached with the credentials and CA
    ``SPARK_ABS_SCHEMA_REGISTRY_USER``, ``_PASSWORD_FILE`` (a file only its
    owner may read) and ``_CA_FILE`` give; returns it."""
    environ = os.environ if environ is None else environ
    return _use(
        url,
        environ.get(ENV["schema_registry_user"]) or "",
        environ.get(ENV["schema_registry_password_file"]) or "",
        environ.get(ENV["schema_registry_ca_file"]) or "",
    )


def use_connection_registry(connection: Connection) -> SchemaRegistry | None:
    """``use_registry`` for the registry ``connection`` names, with the credentials and CA it names
    (the local runtime's registry asks for its own user and password)."""
    return _use(
        connection.schema_registry,
        connection.schema_registry_user,
        connection.schema_registry_password_file,
        connection.schema_registry_ca_file,
    )


def registry_of(connection: Connection) -> SchemaRegistry:
    """A client of the registry ``connection`` names, with its credentials (a ``ConfigError`` when
    it names none)."""
    if not connection.schema_registry:
        raise ConfigError("the connection names no schema registry (spark-abs local up --registry starts one)")
    registry = _client(
        connection.schema_registry,
        connection.schema_registry_user,
        connection.schema_registry_password_file,
        connection.schema_registry_ca_file,
    )
    assert registry is not None
    return registry


def _client(url: str | None, user: str, password_file: str, ca_file: str) -> SchemaRegistry | None:
    password = read_secret_file(Path(password_file), ENV["schema_registry_password_file"]) if password_file else None
    if user and password is None:
        raise ConfigError(f"{ENV['schema_registry_user']} is set: set {ENV['schema_registry_password_file']} too")
    return SchemaRegistry(url, username=user or None, password=password, ca_file=ca_file or None) if url else None


def _use(url: str | None, user: str, password_file: str, ca_file: str) -> SchemaRegistry | None:
    global _current
    _current = _client(url, user, password_file, ca_file)
    return _current


def current_registry(what: str) -> SchemaRegistry:
    """The registry this process uses, or a ``ConfigError`` saying that
    ``what`` needs one."""
    if _current is None:
        raise ConfigError(
            f"{what} needs a schema registry, but none is configured: "
            "set SPARK_ABS_SCHEMA_REGISTRY to its API (http://host:port/apis/ccompat/v7), or start the "
            "local runtime's (spark-abs local up --registry)"
        )
    return _current


def registry_users(pipeline: Pipeline) -> list[str]:
    """What of ``pipeline`` reads or writes Avro through a schema registry
    (an ingress with ``registry=True``, a Kafka sink with ``avro``), by
    name; none: it needs no registry."""
    users = [f"ingress {i.topic}" for i in pipeline.ingress if i.registry]
    users += [f"sink {s.sink.topic}" for s in pipeline.stages if s.sink is not None and s.sink.avro is not None]
    return users


def check_registry(pipeline: Pipeline, url: str) -> None:
    """A ``ConfigError`` when ``pipeline`` reads or writes Avro through a
    schema registry (``registry_users``) and ``url``, the connection's
    registry, is empty."""
    users = registry_users(pipeline)
    if users and not url:
        raise ConfigError(
            f"{', '.join(users)} of job {pipeline.job} use a schema registry, but the connection names none: "
            "set SPARK_ABS_SCHEMA_REGISTRY to its API (http://host:port/apis/ccompat/v7), or start the local "
            "runtime's (spark-abs local up --registry; spark-abs run starts it by itself)"
        )
