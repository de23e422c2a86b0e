"""Redis storage URLs: what ``http.storage`` and ``--redis`` accept, parsed once
for the config checks (``netlimit validate``) and for the store that connects.

    redis://[user:password@]host[:port][/db]           one server
    rediss://...                                         one server over TLS
    unix://[user:password@]/path/to/redis.sock[?db=N]    one server on a unix socket
    redis+cluster://[user:password@]host:port[,host:port...][/]
                                                         Redis Cluster: seed nodes (any
                                                         of them; the rest is learned)
    redis+sentinel://[user:password@]host:port[,host:port...]/service[/db]
                                                         Sentinel: the sentinels and
                                                         the monitored service's name
    rediss+cluster://..., rediss+sentinel://...          the same over TLS

Query options: ``ssl_ca_certs`` (a PEM file of trusted CAs), ``ssl_certfile`` /
``ssl_keyfile`` (a client certificate), ``ssl_cert_reqs`` (required, the
default; optional; none), ``ssl_check_hostname`` (true, the default, or false)
on TLS URLs; ``sentinel_username`` / ``sentinel_password`` for sentinels that
require AUTH (user and password of the URL are for the Redis servers).  A
single-server URL with other options is handed to redis-py as it is; a cluster
or sentinel URL with other options is an error.

Secrets need not be written in the file (docs/operations.md, "Secrets"):
``${NAME}`` anywhere in a URL is replaced by the environment variable NAME
(``${CREDENTIALS_DIRECTORY}``: systemd's LoadCredential= directory), and
``password_file=PATH`` / ``sentinel_password_file=PATH`` read the password from
the first line of a file.  A process that connects expands and reads them
(``secrets=True``, the default); ``netlimit validate`` checks the URL's shape
without them (``secrets=False``: an unset variable or an unreadable file is the
running service's business, not the shell's).

Only the standard library: the config package imports no engine.
"""

from __future__ import annotations

import os
import re
import ssl
from dataclasses import dataclass, field
from urllib.parse import parse_qs, unquote

EXAMPLE = (
    "expected 'memory' or a URL like redis://127.0.0.1:6379/0, "
    "redis+cluster://10.0.0.1:6379,10.0.0.2:6379/ or redis+sentinel://10.0.0.1:26379/mymaster"
)

SCHEMES = {
    "redis": ("single", False),
    "rediss": ("single", True),
    "unix": ("unix", False),
    "redis+cluster": ("cluster", False),
    "rediss+cluster": ("cluster", True),
    "redis+sentinel": ("sentinel", False),
    "rediss+sentinel": ("sentinel", True),
}
TLS_OPTIONS = ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile", "ssl_cert_reqs", "ssl_check_hostname")
SENTINEL_OPTIONS = ("sentinel_username", "sentinel_password")
CERT_REQS = ("none", "optional", "required")
BOOLS = {"true": True, "yes": True, "1": True, "false": False, "no": False, "0": False}
#: the most hosts one URL may name (seeds or sentinels)
MAX_HOSTS = 64
#: options naming a file that holds a password (its first line)
SECRET_FILES = {"password_file": "password", "sentinel_password_file": "sentinel_password"}
#: a password file is read up to this many bytes
MAX_SECRET_BYTES = 4096
#: the units' LoadCredential=netlimit:CREDENTIALS_SOURCE hands every file of that
#: directory to the service as $CREDENTIALS_DIRECTORY/netlimit_FILE
CREDENTIALS_SOURCE = "/etc/netlimit/credentials"
CREDENTIAL_PREFIX = "netlimit_"
NO_CREDENTIALS = (
    "${CREDENTIALS_DIRECTORY} is not set: this process has no systemd credentials "
    f"(they exist only in a service started by its unit, whose LoadCredential=netlimit:{CREDENTIALS_SOURCE} "
    "hands them over; docs/operations.md, Secrets)"
)
_VAR = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*)\}")
_PLACEHOLDER = "netlimit-unset"


def uses_secrets(url: str) -> bool:
    """Whether a URL takes its password (or anything) from the environment or a file."""
    return bool(_VAR.search(url)) or any(f"{name}=" in url for name in SECRET_FILES)


def inline_password(url: str) -> bool:
    """Whether a URL spells a password out (not through ${VAR} or a password file)."""
    try:
        u = parse_redis_url(url, secrets=False)
    except ValueError:
        return False
    scheme_less = url.partition("://")[2].partition("/")[0].partition("?")[0]
    userinfo = scheme_less.rpartition("@")[0] if "@" in scheme_less else ""
    pw = userinfo.partition(":")[2]
    if pw and not _VAR.fullmatch(pw):
        return True
    sp = u.options.get("sentinel_password")
    return bool(sp) and "${" not in url.partition("sentinel_password=")[2].partition("&")[0]


def _expand(text: str, secrets: bool, safe: str | None = None) -> str:
    """``${VAR}`` replaced by the variable's value, percent-encoded (but for ``safe``)
    where it goes into a part of the URL that is decoded (user, password, options)."""
    from urllib.parse import quote

    def sub(m: re.Match[str]) -> str:
        value = os.environ.get(m.group(1))
        if value is None:
            if secrets:
                if m.group(1) == "CREDENTIALS_DIRECTORY":
                    raise ValueError(NO_CREDENTIALS)
                raise ValueError(f"${{{m.group(1)}}} is not set in the environment")
            return _PLACEHOLDER
        return value if safe is None else quote(value, safe=safe)

    return _VAR.sub(sub, text)


def _expand_url(url: str, secrets: bool) -> str:
    """Each part of the URL expanded on its own, so that a password may hold any
    character (``@``, ``:``, ``/``, ``#``) without breaking the URL around it."""
    scheme, sep, rest = url.partition("://")
    rest, qm, query = rest.partition("?")
    rest, hashmark, fragment = rest.partition("#")
    netloc, slash, path = rest.partition("/")
    userinfo, at, hosts = netloc.rpartition("@")
    if at:
        user, colon, pw = userinfo.partition(":")
        userinfo = _expand(user, secrets, "") + colon + _expand(pw, secrets, "")
    netloc = userinfo + at + _expand(hosts, secrets)
    return (
        scheme + sep + netloc + slash + _expand(path, secrets) + qm + _expand(query, secrets, "/") + hashmark + fragment
    )


def _missing_credential(path: str, strerror: str) -> str | None:
    """What to do about a password file under ``$CREDENTIALS_DIRECTORY`` that is not
    there: the units load every file of CREDENTIALS_SOURCE as credential netlimit_FILE."""
    creds = os.environ.get("CREDENTIALS_DIRECTORY")
    if not creds or os.path.dirname(os.path.normpath(path)) != os.path.normpath(creds):
        return None
    name = os.path.basename(path)
    if not name.startswith(CREDENTIAL_PREFIX):
        return (
            f"password file {path!r}: cannot read it: {strerror} (the units load each file of "
            f"{CREDENTIALS_SOURCE} as $CREDENTIALS_DIRECTORY/{CREDENTIAL_PREFIX}FILE)"
        )
    return (
        f"systemd credential {name!r} is missing (not in $CREDENTIALS_DIRECTORY {creds}): put the password in "
        f"{CREDENTIALS_SOURCE}/{name[len(CREDENTIAL_PREFIX) :]} (mode 0600, root), then restart the unit"
    )


def read_secret(path: str) -> str:
    """The first line of a password file; ValueError saying why it cannot be read."""
    try:
        with open(path, "rb") as fh:
            raw = fh.read(MAX_SECRET_BYTES + 1)
    except OSError as exc:
        missing = _missing_credential(path, exc.strerror or str(exc)) if isinstance(exc, FileNotFoundError) else None
        raise ValueError(missing or f"password file {path!r}: cannot read it: {exc.strerror}") from None
    if len(raw) > MAX_SECRET_BYTES:
        raise ValueError(f"password file {path!r}: longer than {MAX_SECRET_BYTES} bytes")
    try:
        line = raw.decode("utf-8").split("\n", 1)[0].rstrip("\r")
    except UnicodeDecodeError:
        raise ValueError(f"password file {path!r}: not UTF-8 text") from None
    if not line:
        raise ValueError(f"password file {path!r}: its first line is empty")
    return line


@dataclass(frozen=True)
class RedisURL:
    """A parsed storage URL.  ``hosts`` are (host, port) pairs: one for a single
    server, the seeds of a cluster, the sentinels of a sentinel set-up."""

    kind: str  # single | unix | cluster | sentinel
    tls: bool
    hosts: tuple[tuple[str, int], ...] = ()
    path: str | None = None  # unix socket
    username: str | None = None
    password: str | None = None
    db: int = 0
    service: str | None = None  # sentinel: the monitored primary's name
    options: dict[str, str] = field(default_factory=dict, compare=False)  # the ones above
    other: tuple[str, ...] = ()  # names of options netlimit does not know (single server only)

    @property
    def check_hostname(self) -> bool:
        return BOOLS.get(self.options.get("ssl_check_hostname", "true").lower(), True)


def _port(text: str, where: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"port {text!r} of {where!r} is not a number")
    port = int(text)
    if port == 0:
        raise ValueError("port 0 is not a Redis port")
    if port > 65535:
        raise ValueError(f"port {port} of {where!r} is out of range 1-65535")
    return port


def _host_port(item: str, default: int) -> tuple[str, int]:
    """``host``, ``host:port``, ``[v6]`` or ``[v6]:port``."""
    if not item:
        raise ValueError("an empty host")
    if item.startswith("["):
        end = item.find("]")
        if end < 0:
            raise ValueError(f"unclosed '[' in {item!r}")
        host, rest = item[1:end], item[end + 1 :]
        if not host:
            raise ValueError(f"an empty IPv6 address in {item!r}")
        if not rest:
            return host, default
        if not rest.startswith(":"):
            raise ValueError(f"expected ':port' after ']' in {item!r}")
        return host, _port(rest[1:], item)
    if item.count(":") > 1:
        raise ValueError(f"an IPv6 address needs brackets: [{item}]")
    host, sep, port = item.partition(":")
    if not host:
        raise ValueError(f"no host in {item!r}")
    return host, _port(port, item) if sep else default


def parse_redis_url(url: str, *, secrets: bool = True) -> RedisURL:
    """Parse a storage URL; ValueError with a message saying what is wrong.
    ``secrets``: expand ``${VAR}`` and read password files (else placeholders)."""
    if uses_secrets(url):
        return _with_secrets(url, secrets)
    return _parse(url)


def _with_secrets(url: str, secrets: bool) -> RedisURL:
    u = _parse(_expand_url(url, secrets))
    if u.other:
        raise ValueError(
            "${VAR} and password files work with the options netlimit knows; "
            f"not with {', '.join(map(repr, u.other))}"
        )
    options = dict(u.options)
    password = u.password
    for opt, target in SECRET_FILES.items():
        path = options.pop(opt, None)
        if path is None:
            continue
        if target == "password" and password is not None:
            raise ValueError("a password in the URL and password_file: give one of them")
        if target in options:
            raise ValueError(f"{target} and {opt}: give one of them")
        if _PLACEHOLDER not in path and not os.path.isabs(path):
            raise ValueError(f"{opt} {path!r} must be an absolute path (or ${{CREDENTIALS_DIRECTORY}}/NAME)")
        secret = read_secret(path) if secrets else _PLACEHOLDER
        if target == "password":
            password = secret
        else:
            options[target] = secret
    from dataclasses import replace

    return replace(u, password=password, options=options)


def _parse(url: str) -> RedisURL:
    scheme, sep, rest = url.partition("://")
    if not sep or scheme.lower() not in SCHEMES:
        raise ValueError(EXAMPLE)
    scheme = scheme.lower()
    kind, tls = SCHEMES[scheme]
    rest, _, query = rest.partition("?")
    rest, _, _fragment = rest.partition("#")
    netloc, slash, path = rest.partition("/")
    path = slash + path
    username = password = None
    if "@" in netloc:
        userinfo, _, netloc = netloc.rpartition("@")
        user, colon, pw = userinfo.partition(":")
        username = unquote(user) or None
        password = unquote(pw) if colon else None
    options, other = _query_options(query)

    if kind == "unix":
        if netloc:
            raise ValueError(f"a unix:// URL has no host ({netloc!r}): unix:///run/redis/redis.sock")
        if not path or path == "/":
            raise ValueError("a unix:// URL needs the socket's path, e.g. unix:///run/redis/redis.sock")
        db = _db(options.pop("db", "0"), "?db=")
        _no_options(options, TLS_OPTIONS + SENTINEL_OPTIONS + ("sentinel_password_file",), "a unix:// URL")
        return RedisURL(
            "unix",
            False,
            path=unquote(path),
            username=username,
            password=password,
            db=db,
            options=options,
            other=tuple(other),
        )

    if not netloc:
        raise ValueError(f"no host; {EXAMPLE}")
    items = netloc.split(",")
    if len(items) > MAX_HOSTS:
        raise ValueError(f"{len(items)} hosts; at most {MAX_HOSTS}")
    default = 26379 if kind == "sentinel" else 6379
    hosts = tuple(_host_port(item, default) for item in items)
    if tls:
        _check_tls(options)
    else:
        _no_options(options, TLS_OPTIONS, f"a {scheme}:// URL (TLS options need rediss{scheme[5:]}://)")
    if kind != "sentinel":
        _no_options(options, SENTINEL_OPTIONS + ("sentinel_password_file",), f"a {scheme}:// URL")

    if kind == "single":
        if len(hosts) > 1:
            raise ValueError(
                f"{len(hosts)} hosts in a {scheme}:// URL: for a Redis Cluster use "
                f"{scheme}+cluster://{netloc}/, for Sentinel {scheme}+sentinel://{netloc}/<service>"
            )
        db = _db(path.strip("/") or options.get("db", "0"), f"{scheme}://host:6379/")
        options.pop("db", None)
        return RedisURL(
            "single",
            tls,
            hosts,
            username=username,
            password=password,
            db=db,
            options=options,
            other=tuple(other),
        )

    if other:
        raise ValueError(
            f"unknown option{'s' if len(other) > 1 else ''} {', '.join(map(repr, sorted(other)))} "
            f"(known: {', '.join(TLS_OPTIONS + (SENTINEL_OPTIONS if kind == 'sentinel' else ()))})"
        )
    if "db" in options:
        raise ValueError(
            "a Redis Cluster has only database 0: remove ?db="
            if kind == "cluster"
            else "the database of a sentinel URL goes in its path: .../<service>/<db>"
        )
    if kind == "cluster":
        if path.strip("/"):
            raise ValueError(f"a Redis Cluster has only database 0: remove {path!r} ({scheme}://{netloc}/)")
        return RedisURL("cluster", tls, hosts, username=username, password=password, options=options)

    service, db = _service_and_db(scheme, netloc, path)
    return RedisURL(
        "sentinel", tls, hosts, username=username, password=password, db=db, service=service, options=options
    )


def _query_options(query: str) -> tuple[dict[str, str], list[str]]:
    """The URL's known options (TLS, sentinel, secret files, db) and the names of the others."""
    try:
        opts = parse_qs(query, keep_blank_values=True, strict_parsing=False, max_num_fields=32)
    except ValueError as exc:
        raise ValueError(f"bad query string: {exc}") from None
    options: dict[str, str] = {}
    other: list[str] = []
    for name, values in opts.items():
        if len(values) > 1:
            raise ValueError(f"option {name!r} given {len(values)} times")
        if name in TLS_OPTIONS or name in SENTINEL_OPTIONS or name in SECRET_FILES or name == "db":
            options[name] = values[0]
        else:
            other.append(name)
    return options, other


def _service_and_db(scheme: str, netloc: str, path: str) -> tuple[str, int]:
    """A sentinel URL's path: ``/<service>[/db]``."""
    parts = [unquote(p) for p in path.strip("/").split("/")] if path.strip("/") else []
    if not parts:
        raise ValueError(
            f"no service name: {scheme}://{netloc}/<service>[/db], the name the sentinels monitor "
            "(sentinel monitor <service> ...)"
        )
    if len(parts) > 2:
        raise ValueError(f"{path!r}: expected /<service>[/db]")
    service = parts[0]
    if not service or any(c.isspace() for c in service):
        raise ValueError(f"service name {service!r} must be non-empty and without spaces")
    db = _db(parts[1], f"{scheme}://host:26379/{service}/") if len(parts) == 2 else 0
    return service, db


def _db(text: str, example: str) -> int:
    if not (text.isascii() and text.isdigit()):
        raise ValueError(f"the database {text!r} must be a number, e.g. {example}0")
    return int(text)


def _no_options(options: dict[str, str], names: tuple[str, ...], what: str) -> None:
    bad = sorted(set(options) & set(names))
    if bad:
        raise ValueError(f"{', '.join(map(repr, bad))} {'has' if len(bad) == 1 else 'have'} no meaning in {what}")


def _check_tls(options: dict[str, str]) -> None:
    reqs = options.get("ssl_cert_reqs", "required").lower()
    if reqs not in CERT_REQS:
        raise ValueError(f"ssl_cert_reqs {reqs!r}: expected one of {', '.join(CERT_REQS)}")
    check = options.get("ssl_check_hostname", "true").lower()
    if check not in BOOLS:
        raise ValueError(f"ssl_check_hostname {check!r}: expected true or false")
    if BOOLS[check] and reqs == "none":
        raise ValueError("ssl_check_hostname=true needs certificates checked: with ssl_cert_reqs=none set it false")
    for name in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile"):
        f = options.get(name)
        if f is not None and not os.access(f, os.R_OK):
            raise ValueError(f"{name} {f!r}: no such readable file")
    if "ssl_keyfile" in options and "ssl_certfile" not in options:
        raise ValueError("ssl_keyfile without ssl_certfile")
    # load them as the store will: a file that is not PEM is an error here, with its line
    try:
        ctx = ssl.create_default_context(cafile=options.get("ssl_ca_certs"))
        if "ssl_certfile" in options:
            ctx.load_cert_chain(options["ssl_certfile"], options.get("ssl_keyfile"))
    except (ssl.SSLError, OSError) as exc:
        names = [n for n in ("ssl_ca_certs", "ssl_certfile", "ssl_keyfile") if n in options]
        raise ValueError(f"{', '.join(names)}: cannot load them ({exc})") from None
