"""What a replay finds: plain data (picklable, for the figures' helper process),
shown by report.py."""

from __future__ import annotations

from dataclasses import dataclass, field


@dataclass
class Unreadable:
    """One line that is not a request: where, why, and its beginning."""

    file: str
    line: int
    reason: str
    text: str

    def __str__(self) -> str:
        return f"{self.file}:{self.line}: {self.reason}: {self.text!r}"


@dataclass
class Client:
    """One counter key of a rule (its descriptor's values)."""

    key: str
    requests: int
    denied: int
    peak: int  # most requests in one period


@dataclass
class AlgorithmResult:
    """What one algorithm, at the rule's limit, would have done."""

    algorithm: str
    denied: int
    clients_denied: int
    configured: bool
    #: clients it denied although they never exceeded the limit in any window of one period
    #: (a bucket smaller than the limit, the sliding counter's estimate)
    within_denied: int = 0
    burst: int | None = None
    delay: bool = False


@dataclass
class Timeline:
    """Requests per bucket: ``admitted[i]``, ``denied[i]`` in ``[start + i*width, start + (i+1)*width)``."""

    start: float
    width: float
    admitted: list[int]
    denied: list[int]


@dataclass
class Offender:
    client: Client
    #: its requests per bucket of the rule's timeline width, from its first denied session
    timeline: Timeline | None


@dataclass
class RuleResult:
    name: str
    path: str
    keys: tuple[str, ...]
    description: str
    algorithm: str
    unit: str
    requests_per_unit: int
    period: float
    burst: int | None
    shadow: bool
    unlimited: bool
    requests: int = 0
    denied: int = 0
    delayed: int = 0
    clients: int = 0
    clients_denied: int = 0
    #: requests of keys beyond max_clients (counted, not attributed)
    untracked: int = 0
    peaks: dict[str, int] = field(default_factory=dict)
    #: (peak, how many keys had it), ascending: the whole distribution, compactly
    peak_counts: list[tuple[int, int]] = field(default_factory=list)
    top: list[Client] = field(default_factory=list)
    compare: list[AlgorithmResult] = field(default_factory=list)
    timeline: Timeline | None = None
    offenders: list[Offender] = field(default_factory=list)

    @property
    def denied_pct(self) -> float:
        return 100.0 * self.denied / self.requests if self.requests else 0.0


@dataclass
class SimResult:
    config: str
    files: list[str]
    formats: list[str]
    lines: int = 0
    requests: int = 0
    unreadable: int = 0
    examples: list[Unreadable] = field(default_factory=list)
    first: float | None = None
    last: float | None = None
    #: requests an enforced (non-shadow) rule denied
    denied: int = 0
    #: requests no rule matched
    unmatched: int = 0
    #: states the memory store dropped because it was full (as the sidecar's would)
    evictions: int = 0
    rules: list[RuleResult] = field(default_factory=list)
    warnings: list[str] = field(default_factory=list)
    seconds: float = 0.0
