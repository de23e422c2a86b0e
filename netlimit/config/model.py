"""The config model: one file, three layers (network, bandwidth, http).

Field names here are the user interface (see README "The file format"):
fields may be added, never renamed. Values are parsed into canonical types
(Rate, PortRange, ip networks, bits/s, bytes) so the compiler never re-parses.
"""

from __future__ import annotations

import re
from typing import TYPE_CHECKING, Annotated, Any, Literal

from pydantic import BaseModel, BeforeValidator, ConfigDict, Field, field_validator, model_validator

from ..kernel.registry import BACKENDS
from ..limit.algorithms import CONFIG_ALGORITHMS, DEFAULT_ALGORITHM
from ..limit.algorithms import REGISTRY as ALGORITHM_REGISTRY
from .fields import (
    CIDR,
    COMMENT_MAX,  # noqa: F401  (re-exported: the field types' users import them from here)
    NAME_RE,
    BandwidthT,
    CommentT,
    DurationT,
    IPNetwork,
    PortT,
    RateT,
    SizeT,
)
from .units import format_duration

if TYPE_CHECKING:
    BackendName = str
else:  # the names the kernel registry knows (netlimit/kernel/registry.py), and auto
    BackendName = Literal[("auto", *BACKENDS)]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=True)


def _check_name(v: str) -> str:
    if not NAME_RE.match(v):
        raise ValueError(
            f"name {v!r} must be 1-48 characters of letters, digits, '-', '_' or '.', starting with a letter or digit"
        )
    return v


# --- escalation (a repeat offender banned at L3) ------------------------------------

BAN_MAX_SECONDS = 2_147_483  # ipset's longest timeout (about 24.8 days); nftables takes it too


class Repeat(Strict):
    """Recidive: a prefix banned again within its last ban's duration (counted from that
    ban's end) gets the last duration times `factor`, at most `max` (as fail2ban's
    bantime.increment); a prefix that stayed away that long starts again at `ban`."""

    factor: float = Field(2.0, gt=1, le=100, description="each repeat ban lasts the last one times this")
    max: DurationT = Field(description="the longest a repeat ban lasts, e.g. 1d (at most 24 days)")

    @property
    def as_tuple(self) -> tuple[float, float]:
        """(factor, max seconds): what a ban list's `add` takes as `repeat`."""
        return (float(self.factor), float(self.max))


class Escalate(Strict):
    """After `after` denials within `within`, the client's address (or its prefix) is
    banned at L3 on every host for `ban` (README: Escalation and bans)."""

    after: int = Field(
        ge=1,
        le=1_000_000,
        description="denials (http) or over-limit packets (network) within `within` that trigger a ban",
    )
    within: DurationT = Field(description="the window the denials are counted in, e.g. 1m")
    ban: DurationT = Field(description="how long the ban lasts, e.g. 15m (at most 24 days)")
    prefix4: int = Field(32, ge=8, le=32, description="ban the client's IPv4 /prefix4 (24: its /24)")
    prefix6: int = Field(128, ge=16, le=128, description="ban the client's IPv6 /prefix6 (64: its /64)")
    reason: str | None = Field(None, min_length=1, max_length=200, description="shown in `netlimit ban list`")
    repeat: Repeat | None = Field(
        None, description="a prefix banned again soon after its last ban gets a longer one: {factor: 2, max: 1d}"
    )

    @model_validator(mode="after")
    def _bounds(self) -> Escalate:
        if self.within > 86400:
            raise ValueError(f"within {format_duration(self.within)} is longer than a day: count over at most 1d")
        if self.ban > BAN_MAX_SECONDS:
            raise ValueError(f"ban {format_duration(self.ban)} is longer than the kernel keeps one (24 days)")
        if self.repeat is not None:
            if self.repeat.max > BAN_MAX_SECONDS:
                raise ValueError(
                    f"repeat max {format_duration(self.repeat.max)} is longer than the kernel keeps a ban (24 days)"
                )
            if self.repeat.max <= self.ban:
                raise ValueError(
                    f"repeat max {format_duration(self.repeat.max)} must be longer than ban "
                    f"{format_duration(self.ban)}: repeat bans grow from ban up to max"
                )
        return self

    def prefix(self, version: int) -> int:
        return self.prefix4 if version == 4 else self.prefix6


# --- network (iptables) -----------------------------------------------------------


class NetworkRule(Strict):
    """A packet-rate or connection limit enforced by nftables (or the legacy iptables/ip6tables)."""

    name: str = Field(description="unique rule name; tags kernel objects as netlimit:<name>")
    protocol: Literal["tcp", "udp", "icmp", "all"] = Field("all", description="tcp | udp | icmp | all")
    ports: list[PortT] = Field(default_factory=list, description="destination ports; ranges '8000-8100'")
    new_connections: bool = Field(False, description="count only new connections (SYN / ctstate NEW)")
    limit: RateT | None = Field(None, description="N/second|minute|hour|day")
    burst: int | None = Field(None, ge=1, description="packets allowed above the rate at once (hashlimit)")
    per: Literal["source", "destination", "source+port", "all"] = Field(
        "source",
        description="what gets its own bucket: source address, destination address, "
        "source address + destination port, or one bucket for all",
    )
    method: Literal["hashlimit", "recent"] = Field("hashlimit", description="hashlimit (default) | recent")
    action: Literal["drop", "reject", "log"] = Field(
        "drop", description="drop | reject | log (shadow: count + log, never block)"
    )
    source_prefix: int | None = Field(None, ge=0, le=32, description="group IPv4 sources by this prefix length")
    source_prefix6: int | None = Field(None, ge=0, le=128, description="group IPv6 sources by this prefix length")
    sources: list[CIDR] = Field(default_factory=list, description="only packets from these CIDRs")
    destinations: list[CIDR] = Field(default_factory=list, description="only packets to these CIDRs")
    max_connections: int | None = Field(None, ge=1, description="concurrent connections per source (connlimit)")
    chain: Literal["input", "forward"] = Field("input", description="input (to this host) | forward (routed)")
    interface: str | None = Field(None, description="only packets arriving on this interface")
    htable_size: int | None = Field(None, ge=1, le=1 << 20, description="hashlimit buckets in the hash table")
    htable_max: int | None = Field(None, ge=1, le=1 << 24, description="hashlimit max entries")
    htable_expire: int | None = Field(None, ge=1, description="hashlimit entry expiry in milliseconds")
    escalate: Escalate | None = Field(
        None, description="ban a source at L3 after this many over-limit packets (README: Escalation and bans)"
    )
    comment: CommentT | None = Field(
        None, description="a note for people: shown by `netlimit list`, written into the kernel rules' comment"
    )
    early: bool = Field(
        False,
        description="run this limit in the XDP program on xdp.interfaces instead of the input chain, before "
        "the kernel allocates the packet (needs `xdp:`; docs/xdp.md lists what an early rule may use)",
    )

    _v_name = field_validator("name")(classmethod(lambda cls, v: _check_name(v)))

    @property
    def families(self) -> tuple[int, ...]:
        return families_of(self.sources, self.destinations)

    @model_validator(mode="after")
    def _shape(self) -> NetworkRule:
        if self.limit is None and self.max_connections is None:
            raise ValueError("set 'limit' (a rate) or 'max_connections' (concurrent connections)")
        if self.limit is not None and self.max_connections is not None:
            raise ValueError("'limit' and 'max_connections' are separate rules: split them in two")
        return self


def families_of(*lists: list[IPNetwork]) -> tuple[int, ...]:
    """IP families a rule applies to: those its addresses name, else both."""
    fams = {n.version for lst in lists for n in lst}
    return tuple(sorted(fams)) if fams else (4, 6)


# --- bandwidth (tc) -------------------------------------------------------------


class BandwidthRule(Strict):
    """A bandwidth cap enforced by tc (TBF/HTB; ingress through an IFB device)."""

    name: str = Field(description="unique rule name")
    interface: str = Field(description="network interface, e.g. eth0")
    direction: Literal["egress", "ingress"] = Field("egress", description="egress | ingress (through an IFB device)")
    ports: list[PortT] = Field(
        default_factory=list, description="optional; on egress the local (source) port, on ingress the destination port"
    )
    protocol: Literal["tcp", "udp", "all"] = Field("all", description="protocol for port matches: tcp | udp | all")
    sources: list[CIDR] = Field(
        default_factory=list, description="optional CIDRs; on egress the destination address, on ingress the source"
    )
    rate: BandwidthT = Field(description="bit/kbit/mbit/gbit")
    burst: SizeT | None = Field(None, description="optional; a safe default is derived from rate")
    comment: CommentT | None = Field(
        None, description="a note for people: shown by `netlimit list` (tc objects have no comment field)"
    )

    _v_name = field_validator("name")(classmethod(lambda cls, v: _check_name(v)))

    @field_validator("interface")
    @classmethod
    def _iface(cls, v: str) -> str:
        if not re.match(r"^[A-Za-z0-9_.:@-]{1,15}$", v) or v in (".", ".."):
            raise ValueError(f"interface {v!r} is not a valid Linux interface name (1-15 characters, no '/' or spaces)")
        return v

    @property
    def whole_interface(self) -> bool:
        return not self.ports and not self.sources


# --- http (sidecar, Lyft ratelimit format) --------------------------------------

UNIT_SECONDS = {
    "second": 1,
    "minute": 60,
    "hour": 3600,
    "day": 86400,
    "week": 7 * 86400,
    "month": 30 * 86400,
    "year": 365 * 86400,
}
#: the algorithms a file can name, from the engine's registry (netlimit/limit/algorithms)
ALGORITHMS = CONFIG_ALGORITHMS
if TYPE_CHECKING:
    AlgorithmName = str
else:  # a Literal of the registry's names: the schema's enum, pydantic's literal_error
    AlgorithmName = Literal[CONFIG_ALGORITHMS]
#: requests_per_unit is a uint32 in Lyft's config and in Envoy's protocol
MAX_REQUESTS_PER_UNIT = 0xFFFFFFFF


def _lyft_rate_limit_schema(schema: dict[str, Any]) -> None:
    """The schema also admits Lyft's placement of ``unlimited`` / ``replaces``
    inside ``rate_limit`` (Descriptor moves them to the descriptor)."""
    props = schema.setdefault("properties", {})
    props["unlimited"] = {"type": "boolean", "description": "Lyft's placement of the descriptor's 'unlimited'"}
    props["replaces"] = {
        "type": "array",
        "description": "Lyft's placement of the descriptor's 'replaces'",
        "items": {
            "type": "object",
            "properties": {"name": {"type": "string"}},
            "required": ["name"],
            "additionalProperties": False,
        },
    }
    required = schema.pop("required", [])
    schema["anyOf"] = [
        {"required": required},
        {"required": ["unlimited"], "properties": {"unlimited": {"const": True}}},
    ]


class LyftText(BaseModel):
    """The Lyft parts keep text exactly as written (go-yaml does not strip a
    quoted value's spaces); the loader has already turned plain scalars such as
    ``1.10`` or ``NO`` back into their text (config/lyft.py ``lyft_text``)."""

    model_config = ConfigDict(extra="forbid", frozen=True, str_strip_whitespace=False)


class RateLimit(LyftText):
    model_config = ConfigDict(
        extra="forbid", frozen=True, str_strip_whitespace=False, json_schema_extra=_lyft_rate_limit_schema
    )

    unit: Literal["second", "minute", "hour", "day", "week", "month", "year"]
    requests_per_unit: int = Field(ge=0, le=MAX_REQUESTS_PER_UNIT)
    name: str | None = None

    @field_validator("unit", mode="before")
    @classmethod
    def _lower(cls, v: object) -> object:
        return v.lower() if isinstance(v, str) else v

    @property
    def period(self) -> int:
        return UNIT_SECONDS[self.unit]


class Replaces(LyftText):
    name: str | None = None


def _none_is_empty(v: object) -> object:
    """``descriptors:`` with nothing under it is an empty list (as go-yaml reads it)."""
    return [] if v is None else v


DescriptorList = Annotated[list["Descriptor"], BeforeValidator(_none_is_empty)]


class Descriptor(LyftText):
    """A node of the Lyft descriptor tree, plus netlimit's algorithm / burst / delay."""

    key: str = Field("", description="required (a missing or empty key is refused with Lyft's message)")
    value: str | None = None
    rate_limit: RateLimit | None = None
    algorithm: AlgorithmName = Field(
        DEFAULT_ALGORITHM, description=f"{DEFAULT_ALGORITHM} is Lyft's behaviour and the default"
    )
    count_denied: bool = Field(
        True,
        description="fixed_window: denied requests count toward the window, as Lyft counts them (false: only "
        "admitted requests count)",
    )
    burst: int | None = Field(
        None, ge=1, le=MAX_REQUESTS_PER_UNIT, description="token bucket capacity / leaky bucket queue depth"
    )
    delay: bool = Field(False, description="leaky_bucket: queue requests to their slot instead of rejecting")
    max_keys: int | None = Field(
        None,
        ge=1,
        description="memory store: most states (client keys) this rule keeps; default: its share of "
        "http.max_keys (docs/security.md, Budgets and overrides)",
    )
    lease: bool = Field(
        True,
        description="http.leases: off keeps this descriptor on one Redis round trip per decision, hot or not "
        "(docs/performance.md, Leased quota)",
    )
    unlimited: bool = False
    shadow_mode: bool = False
    quota_mode: bool = Field(
        False, description="over its limit, this descriptor makes the answer OVER_LIMIT only if every quota one is"
    )
    replaces: list[Replaces] = Field(default_factory=list)
    detailed_metric: bool = Field(False, description="metrics per request value (bounded by http.max_metric_values)")
    value_to_metric: bool = Field(False, description="metric names carry this level's request value")
    share_threshold: bool = Field(False, description="every value matching this wildcard shares one counter")
    metadata: dict[str, Any] | None = Field(None, description="kept with the limit; sent as Envoy dynamic metadata")
    escalate: Escalate | None = Field(
        None, description="ban the client (remote_address) at L3 after this many denials (README: Escalation and bans)"
    )
    descriptors: DescriptorList = Field(default_factory=list)

    @model_validator(mode="before")
    @classmethod
    def _lyft_placement(cls, data: Any) -> Any:
        """Lyft's ratelimit writes ``unlimited`` and ``replaces`` inside
        ``rate_limit``; netlimit on the descriptor.  Both are accepted: Lyft's
        are moved here (``rate_limit: {unlimited: true}`` is then no limit; a
        unit next to it is refused with Lyft's message by validate.py)."""
        if not isinstance(data, dict):
            return data
        rl = data.get("rate_limit")
        if not isinstance(rl, dict) or ("unlimited" not in rl and "replaces" not in rl):
            return data
        data, rl = dict(data), dict(rl)
        unlimited = rl.pop("unlimited", False)
        replaces = rl.pop("replaces", None)
        if replaces is not None:
            own = data.get("replaces")
            data["replaces"] = (
                [*own, *replaces]
                if isinstance(own, list) and isinstance(replaces, list)
                else replaces
                if own is None
                else own
            )
        if unlimited is not False:  # true, or a bad value the field check reports
            if data.get("unlimited") in (None, False):
                data["unlimited"] = unlimited
            if unlimited is True and "unit" not in rl:
                rl = None  # Lyft ignores the rest (name, requests_per_unit) of an unlimited limit
            elif unlimited is True:
                rl.setdefault("requests_per_unit", 0)  # so the unit is what _shape reports
        data["rate_limit"] = rl
        return data

    @field_validator("value", mode="before")
    @classmethod
    def _value_text(cls, v: object) -> object:
        # a number written in code (tests, the schema's examples) is text to Lyft;
        # YAML's plain scalars already arrive as the text written (config/lyft.py)
        if isinstance(v, (int, float)) and not isinstance(v, bool):
            return str(v)
        return v

    @model_validator(mode="after")
    def _shape(self) -> Descriptor:
        if self.unlimited and self.rate_limit is not None:
            raise ValueError(
                "should not specify rate limit unit when unlimited: write 'rate_limit: {unlimited: true}' "
                "(or 'unlimited: true' on the descriptor) without unit and requests_per_unit"
            )
        alg = ALGORITHM_REGISTRY[self.algorithm]
        if self.burst is not None and not alg.bucket:
            raise ValueError(f"'burst' applies to {_algorithms_with('bucket')}, not {self.algorithm}")
        if self.delay and not alg.queue:
            raise ValueError(f"'delay' applies to algorithm: {_algorithms_with('queue')} only")
        if not self.count_denied and not alg.admitted:
            raise ValueError(
                f"'count_denied' applies to algorithm: {_algorithms_with('admitted')}, not {self.algorithm}"
            )
        return self

    @property
    def engine_algorithm(self) -> str:
        """The engine's algorithm: fixed_window with ``count_denied: false`` is fixed_window_admitted."""
        if not self.count_denied:
            return ALGORITHM_REGISTRY[self.algorithm].admitted or self.algorithm
        return self.algorithm


def _algorithms_with(flag: str) -> str:
    """The algorithms a file can name that have ``flag`` (for messages: "a and b")."""
    return " and ".join(n for n in CONFIG_ALGORITHMS if getattr(ALGORITHM_REGISTRY[n], flag))


ACTION_RE = re.compile(r"^(remote_address|path|method|header:[!#$%&'*+.^_`|~0-9A-Za-z-]+|generic:[^=\s]+=\S*)$")


def _check_action(item: object) -> str:
    if not isinstance(item, str) or not ACTION_RE.match(item):
        raise ValueError(
            f"unknown action {item!r}: expected remote_address, path, method, header:<Name> or generic:<key>=<value>"
        )
    return item


ActionT = Annotated[str, BeforeValidator(_check_action)]
ActionList = Annotated[list[ActionT], Field(min_length=1)]


class ClientPrefix(Strict):
    """What one client is to ``remote_address``: an IPv4 address, or the IPv6 /64
    any host is given (2^64 addresses to rotate through)."""

    ipv4: int = Field(
        32, ge=0, le=32, description="IPv4 clients: the prefix length that is one client (32: the address)"
    )
    ipv6: int = Field(
        64, ge=0, le=128, description="IPv6 clients: the prefix length that is one client (64: a host's /64)"
    )


class PathMatch(Strict):
    """How the ``path`` action sees a path (over-counting is the safe side for a
    limiter): the variants an application routes to one handler are one path."""

    case: Literal["insensitive", "sensitive"] = Field(
        "insensitive", description="insensitive: /LOGIN and /Login are /login (paths and rule values lower-cased)"
    )
    trailing_slash: Literal["ignore", "keep"] = Field("ignore", description="ignore: /login/ is /login")
    params: Literal["strip", "keep"] = Field(
        "strip", description="strip: ;jsessionid=...-style matrix parameters are cut from each segment"
    )


class HttpConfig(Strict):
    domain: str = Field(
        "", description="Lyft domain of the descriptors (required unless lyft_config_dir holds the domains)"
    )
    storage: str = Field(
        "memory",
        description="memory | redis://host:6379/0 | redis+cluster://host:port,host:port/ | "
        "redis+sentinel://host:26379,host:26379/service[/db] (rediss... for TLS)",
    )
    password_file: str | None = Field(
        None,
        description="the Redis password: the first line of this file (absolute, or ${CREDENTIALS_DIRECTORY}/NAME "
        "under systemd's LoadCredential=), read when the sidecar connects; = ?password_file= in storage",
    )

    @model_validator(mode="before")
    @classmethod
    def _password_file(cls, data: Any) -> Any:
        return _password_file_into_url(data, "storage")

    actions: list[ActionList] = Field(
        default_factory=list,
        description="how a request becomes descriptor lists: remote_address, path, method, "
        "header:<Name>, generic:<key>=<value>",
    )
    descriptors: DescriptorList = Field(default_factory=list)
    trusted_proxies: list[CIDR] = Field(default_factory=list, description="peers whose X-Forwarded-For is believed")
    client_prefix: ClientPrefix = Field(
        default_factory=lambda: ClientPrefix.model_validate({}),
        description="remote_address is the client's network of this prefix length, written canonically "
        "(2001:db8:1:2::/64; an IPv4 address at 32): docs/security.md",
    )
    path_match: PathMatch = Field(
        default_factory=lambda: PathMatch.model_validate({}),
        description="how paths are matched: case, trailing slash, matrix parameters (docs/security.md)",
    )
    on_store_failure: Literal["open", "local", "closed"] = Field(
        "local", description="when Redis is slow or down: allow (open), decide locally (local), or deny (closed)"
    )
    store_timeout_ms: int = Field(50, ge=1, le=60000, description="per-call Redis timeout")
    leases: bool = Field(
        False,
        description="Redis: a key this sidecar sees hot reserves a little of its window's quota and is decided "
        "locally from it, still exact (fixed_window, sliding_window_counter, token_bucket, leaky_bucket without "
        "delay; docs/performance.md, Leased quota); takes effect at restart",
    )
    max_keys: int = Field(
        100_000,
        ge=1,
        description="memory store: most keys kept, split evenly among the rules without a max_keys of their "
        "own and the limit overrides (each rule evicts only its own keys)",
    )
    max_key_length: int = Field(256, ge=16, le=8192, description="longer keys are hashed")
    lyft_config_dir: str | None = Field(
        None,
        description="a directory of envoyproxy/ratelimit config files (*.yaml, *.yml), one domain each, served "
        "beside this file's domain and reloaded when they change; relative to this file",
    )
    merge_domains: bool = Field(
        False,
        description="Lyft's MERGE_DOMAIN_CONFIG: files of lyft_config_dir with the same domain make one tree "
        "(else a domain in two files is an error)",
    )
    shadow_mode: bool = Field(
        False, description="Lyft's SHADOW_MODE: every limit is counted and reported, no request is refused"
    )
    quota_mode: bool = Field(False, description="Lyft's QUOTA_MODE: every descriptor is a quota_mode one")
    near_limit_ratio: float = Field(
        0.8, gt=0, le=1, description="Lyft's NEAR_LIMIT_RATIO: allowed hits past this share of a limit are near_limit"
    )
    max_metric_values: int = Field(
        100,
        ge=0,
        le=100_000,
        description="detailed_metric / value_to_metric: distinct per-value metric names kept per rule (the rest "
        "are counted under '(other)')",
    )
    response_dynamic_metadata: bool = Field(
        False,
        description="Lyft's RESPONSE_DYNAMIC_METADATA: the gRPC answer carries the request and the metadata of "
        "the descriptors that passed as Envoy dynamic metadata",
    )

    @field_validator("storage")
    @classmethod
    def _storage(cls, v: str) -> str:
        if v == "memory":
            return v
        problem = redis_url_problem(v)
        if problem:
            raise ValueError(f"storage {v!r}: {problem}")
        return v


class LyftFile(LyftText):
    """One file of an envoyproxy/ratelimit config directory (``http.lyft_config_dir``):
    a domain and its descriptors, in Lyft's format (netlimit's descriptor fields too)."""

    domain: str = ""
    descriptors: DescriptorList = Field(default_factory=list)


def redis_url_problem(url: str, *, secrets: bool = False) -> str | None:
    """What is wrong with a storage URL (redis_url.py lists the forms), as a
    message; None when it can be used. ``secrets``: also expand ${VAR} and read the
    password files (a process about to connect); without, their shape only."""
    from .redis_url import parse_redis_url

    try:
        parse_redis_url(url, secrets=secrets)
    except ValueError as exc:
        return str(exc)
    return None


# --- bans ------------------------------------------------------------------------


MAX_BANS_DEFAULT = 100_000
#: entries of the static `deny:` list (one nftables interval set; one iptables rule each)
MAX_DENY = 100_000


def _password_file_into_url(data: Any, key: str) -> Any:
    """A section's ``password_file:`` becomes its URL's ``?password_file=`` option
    (redis_url.py reads it when a process connects)."""
    if not isinstance(data, dict) or data.get("password_file") is None:
        return data
    from urllib.parse import quote

    pf, url = data["password_file"], data.get(key)
    if not isinstance(pf, str) or not pf.strip():
        raise ValueError(f"password_file must be a path, got {pf!r}")
    if not isinstance(url, str) or "://" not in url:
        raise ValueError(f"password_file needs a Redis URL in {key} (it is {url or 'memory'!r})")
    if "password_file=" in url:
        raise ValueError(f"password_file is given twice: as a key and in {key}")
    sep = "&" if "?" in url else "?"
    return {**data, key: f"{url}{sep}password_file={quote(pf.strip(), safe='/${}')}"}


class BansConfig(Strict):
    """The ban list every host's netlimitd enforces in the kernel (README: Escalation and bans)."""

    store: str | None = Field(
        None,
        description="redis://host:6379/0 (shared by the fleet) or memory (this host's netlimitd keeps it); "
        "default: http.storage",
    )
    max_entries: int = Field(
        MAX_BANS_DEFAULT, ge=1, le=1_000_000, description="most bans kept; beyond it the soonest to expire goes first"
    )
    key_prefix: str = Field(
        "netlimit", pattern=r"^[A-Za-z0-9_.:-]{1,64}$", description="Redis key names: <key_prefix>:{bans}..."
    )
    socket: str = Field(
        "/run/netlimit/netlimitd.sock",
        min_length=1,
        description="memory store: the status socket of this host's netlimitd, which keeps the list",
    )
    password_file: str | None = Field(
        None, description="bans.store's Redis password: the first line of this file (as http.password_file)"
    )

    @model_validator(mode="before")
    @classmethod
    def _password_file(cls, data: Any) -> Any:
        return _password_file_into_url(data, "store")

    @field_validator("store")
    @classmethod
    def _store(cls, v: str | None) -> str | None:
        if v is None or v == "memory":
            return v
        problem = redis_url_problem(v)
        if problem:
            raise ValueError(f"store {v!r}: {problem}")
        return v


# --- ingress and XDP stages ----------------------------------------------------


def _stage_interfaces(v: list[str], why_not_lo: str) -> list[str]:
    """An ingress or XDP stage's interface list: Linux names, no loopback (``why_not_lo``), no repeats."""
    for name in v:
        if not re.match(r"^[A-Za-z0-9_.:@-]{1,15}$", name) or name in (".", ".."):
            raise ValueError(
                f"interface {name!r} is not a valid Linux interface name (1-15 characters, no '/' or spaces)"
            )
        if name == "lo":
            raise ValueError(f"interface 'lo': {why_not_lo}")
    if len(set(v)) != len(v):
        raise ValueError("an interface is listed twice")
    return v


class IngressConfig(Strict):
    """Match deny and the bans in an nftables ingress hook chain on these interfaces,
    before conntrack and routing (docs/xdp.md, "Stages"); nftables backend only."""

    interfaces: list[str] = Field(
        min_length=1,
        max_length=256,
        description="interfaces whose arriving packets meet deny and the bans at the ingress hook, e.g. [eth0]; "
        "loopback is never hooked; packets arriving on other interfaces still meet them in the input chain",
    )

    @field_validator("interfaces")
    @classmethod
    def _ifaces(cls, v: list[str]) -> list[str]:
        return _stage_interfaces(v, "loopback traffic is local and is never hooked at ingress")


# --- XDP stage -------------------------------------------------------------------


class XdpConfig(Strict):
    """Drop deny, the bans and the `early: true` network rules in a BPF program at the
    driver, before the kernel allocates the packet (docs/xdp.md)."""

    interfaces: list[str] = Field(
        min_length=1,
        max_length=256,
        description="interfaces whose arriving packets meet the XDP program, e.g. [eth0]; loopback is never attached",
    )
    mode: Literal["auto", "native", "generic"] = Field(
        "auto",
        description="native (in the driver: fastest, needs driver support) | generic (after the skb is built: "
        "works everywhere) | auto (native where the driver has it, else generic)",
    )

    @field_validator("interfaces")
    @classmethod
    def _ifaces(cls, v: list[str]) -> list[str]:
        return _stage_interfaces(v, "loopback traffic never passes a driver's XDP hook")


# --- the file ------------------------------------------------------------------


class Config(Strict):
    """A netlimit file. Every layer is optional."""

    model_config = ConfigDict(extra="forbid", frozen=True, title="netlimit configuration", str_strip_whitespace=True)

    version: Literal[1] = Field(description="file format version; must be 1")
    exempt: list[CIDR] = Field(default_factory=list, description="addresses never limited, matched before any rule")
    deny: list[CIDR] = Field(
        default_factory=list,
        max_length=MAX_DENY,
        description="addresses always dropped (a static ban that never expires), matched right after exempt",
    )
    network: list[NetworkRule] = Field(default_factory=list, description="L3/L4 packet and connection limits")
    bandwidth: list[BandwidthRule] = Field(default_factory=list, description="L3/L4 shaping (tc)")
    http: HttpConfig | None = Field(None, description="L7 sidecar rules")
    bans: BansConfig | None = Field(None, description="the shared ban list (README: Escalation and bans)")
    ingress: IngressConfig | None = Field(
        None,
        description="nftables: also match deny and the bans in an ingress hook chain on these interfaces, "
        "before conntrack (docs/xdp.md, Stages); without it they are matched in the input chain only",
    )
    xdp: XdpConfig | None = Field(
        None,
        description="drop deny, the bans and the `early: true` network rules in an XDP program on these "
        "interfaces, before the kernel allocates the packet (docs/xdp.md)",
    )
    on_stop: Literal["flush", "keep"] = Field(
        "flush", description="daemon stop: remove rules (flush) or leave them in place (keep)"
    )
    include: list[str] = Field(
        default_factory=list,
        description="more files whose exempt / network / bandwidth lists are appended, e.g. "
        "/etc/netlimit/conf.d/*.yaml (globs in name order; relative to this file)",
    )
    backend: BackendName = Field(
        "auto",
        description="how network rules reach the kernel: nftables (table inet netlimit), restore "
        "(iptables-legacy-restore) or python-iptables; auto picks nftables where the host's iptables is the "
        "nf_tables variant or legacy x_tables are unusable ($NETLIMIT_BACKEND and --backend override it)",
    )

    @property
    def escalating_descriptors(self) -> list[tuple[tuple[str, ...], Descriptor]]:
        """Every http descriptor with `escalate`, with the keys from the root to it."""
        out: list[tuple[tuple[str, ...], Descriptor]] = []

        def walk(descs: list[Descriptor], keys: tuple[str, ...]) -> None:
            for d in descs:
                if d.escalate is not None:
                    out.append((keys + (d.key,), d))
                walk(d.descriptors, keys + (d.key,))

        if self.http is not None:
            walk(self.http.descriptors, ())
        return out

    @property
    def bans_on(self) -> bool:
        """Whether the file uses bans: a `bans:` section or any `escalate`."""
        return (
            self.bans is not None
            or any(r.escalate is not None for r in self.network)
            or bool(self.escalating_descriptors)
        )

    @property
    def ban_store(self) -> str:
        """Where the ban list lives: bans.store, else http.storage, else memory."""
        if self.bans is not None and self.bans.store is not None:
            return self.bans.store
        return self.http.storage if self.http is not None else "memory"

    @property
    def max_bans(self) -> int:
        return self.bans.max_entries if self.bans is not None else MAX_BANS_DEFAULT
