"""What to cull and why: servers + Jupyter activity + GPU busyness + GPU pressure -> decisions.

Pure: no hub, Prometheus or Kubernetes calls, no clock. Times are POSIX
seconds; the caller passes ``now``. The rules, in order:

1. A server that is starting, stopping or not ready is skipped.
2. Exempt users and groups are skipped (admins too, unless admins are culled,
   which is the default).
3. A server younger than ``min_running`` is kept.
4. ``max_age`` culls a server whatever its activity (a backstop).
5. A server is idle since the *later* of its hub ``last_activity`` and the last
   time its GPUs were busy. A GPU server whose GPU data is missing, or when
   Prometheus did not answer, counts as busy: never cull on missing data.
6. It is culled when idle longer than the timeout of the first matching rule
   (profile / GPU type / GPU count), else ``default_timeout``. A rule's
   ``gpu_timeout`` (or ``default_gpu_timeout``) also culls a GPU server whose
   GPUs, with fresh data, were idle that long even though Jupyter reports
   activity: an open browser tab keeps ``last_activity`` fresh forever.
7. Pressure: for each request waiting for GPUs (queued or refused in the hub,
   a pod Pending in the scheduler, or a pod of the workload at the head of a
   Kueue ClusterQueue), idle servers of its GPU type (idle longer than the
   type's pressure timeout, busy by neither signal) are culled so that one
   node has enough free GPUs for it: on the node that needs the fewest GPUs
   freed, longest-idle first, and no more than needed. A request
   that fits already frees nothing; one no node could hold even then frees
   nothing either, and is reported as unserved.
8. With a warning period, a server is first warned and culled only on a later
   pass, at least ``warning_period`` after the warning, if it is still eligible.

Deadlines and keeps (a server's :class:`Deadline` and ``keep_until``):

* A server whose deadline (its ``max_runtime``, or its user's GPU-hours budget
  running out) has come is culled whatever its activity; ``warning_period``
  before it, it is warned (the warning's time is the deadline). A keep cannot
  put a deadline off, nor ``max_age``.
* A kept server (``keep_until`` ahead) is not culled for idleness (idle or GPU
  idle) until then; pressure mode still takes it unless ``keep_overrides_pressure``.
* The user's own idle timeout (chosen on the form) replaces the timeout of the
  rule that matches; the rule's GPU timeout stays.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field, replace

# Decision actions
CULL = "cull"
WARN = "warn"
KEEP = "keep"
SKIP = "skip"

# Reasons a server is culled
REASON_IDLE = "idle"
REASON_MAX_AGE = "max-age"
REASON_PRESSURE = "pressure"
REASON_GPU_IDLE = "gpu-idle"
REASON_MAX_RUNTIME = "max-runtime"
REASON_BUDGET = "budget"
#: Cull reasons with a fixed time, warned ahead of it: no keep puts them off.
DEADLINE_REASONS = (REASON_MAX_RUNTIME, REASON_BUDGET)

# Reasons a server is kept or skipped
REASON_PENDING = "pending"
REASON_NOT_READY = "not-ready"
REASON_EXEMPT = "exempt"
REASON_GROUPS_UNKNOWN = "groups-unknown"
REASON_ADMIN = "admin"
REASON_TOO_YOUNG = "too-young"
REASON_ACTIVE = "active"
REASON_NO_TIMEOUT = "no-timeout"
REASON_GPU_MISSING = "gpu-metrics-missing"
REASON_GPU_UNAVAILABLE = "prometheus-unavailable"
REASON_WARNED = "warned"
REASON_KEPT = "kept"

# GPU signal states, as reported in decisions and metrics
GPU_NOT_USED = "not-used"  # a CPU-only server, or Prometheus not configured
GPU_FRESH = "fresh"
GPU_MISSING = "missing"
GPU_UNAVAILABLE = "unavailable"


@dataclass(frozen=True)
class Deadline:
    """A time a server is stopped at whatever it does: its ``max_runtime``, or its user's budget.

    ``seconds``: the running time limit (max-runtime); ``detail``: the budget's period
    ("this week"), for the stop notice.
    """

    at: float
    reason: str
    seconds: float | None = None
    detail: str = ""


@dataclass(frozen=True)
class Server:
    """One running (or starting/stopping) server as the culler sees it."""

    user: str
    name: str = ""
    admin: bool = False
    #: None: the hub did not show the user's groups (no read:users:groups scope)
    groups: frozenset[str] | None = frozenset()
    ready: bool = True
    pending: str | None = None
    started: float | None = None
    last_activity: float | None = None
    profile: str | None = None
    gpu_type: str | None = None
    gpus: int = 0
    pod: str | None = None
    namespace: str | None = None
    #: The node its pod runs on (None: unknown; such a server is never freed for a request)
    node: str | None = None
    #: The idle timeout its user chose (seconds; None: the rules')
    idle_timeout: float | None = None
    #: Kept by its user until then (UTC epoch; None: not kept)
    keep_until: float | None = None
    #: The earliest time it is stopped whatever it does (None: none)
    deadline: Deadline | None = None
    #: The longest keep its user may choose, in seconds (0: none)
    max_keep: float = 0.0

    @property
    def key(self) -> tuple[str, str]:
        return (self.user, self.name)

    @property
    def display(self) -> str:
        """``alice`` for a default server, ``alice/exp1`` for a named one."""
        return f"{self.user}/{self.name}" if self.name else self.user


@dataclass(frozen=True)
class GPUSample:
    """A pod's GPU activity over the lookback window.

    ``last_busy`` is the last time a GPU of the pod was above the threshold
    inside the window (None: never inside it); ``window_start`` is where the
    window begins, so a pod with no busy sample has been GPU-idle at least since then.
    """

    last_busy: float | None
    window_start: float


@dataclass(frozen=True)
class GPUView:
    """What Prometheus said about every GPU pod this pass.

    ``enabled`` False: Prometheus is not configured, only Jupyter activity counts.
    ``ok`` False: Prometheus did not answer; every GPU server counts as busy.
    ``samples`` holds the pods with fresh data, by ``(namespace, pod)``.
    """

    enabled: bool = False
    ok: bool = True
    samples: Mapping[tuple[str, str], GPUSample] = field(default_factory=dict)


@dataclass(frozen=True)
class TimeoutRule:
    """An idle timeout for the servers it matches; unset keys match anything.

    ``gpu_type`` "none" matches CPU-only servers; ``min_gpus``/``max_gpus`` are inclusive.
    ``gpu_timeout``: cull after this long with idle GPUs whatever Jupyter says.
    """

    timeout: float | None
    gpu_timeout: float | None = None
    profile: str | None = None
    gpu_type: str | None = None
    min_gpus: int | None = None
    max_gpus: int | None = None

    def matches(self, server: Server) -> bool:
        if self.profile is not None and server.profile != self.profile:
            return False
        if self.gpu_type is not None:
            server_type = server.gpu_type if server.gpus > 0 else "none"
            if server_type != self.gpu_type:
                return False
        if self.min_gpus is not None and server.gpus < self.min_gpus:
            return False
        return not (self.max_gpus is not None and server.gpus > self.max_gpus)

    def describe(self) -> str:
        parts = []
        if self.profile is not None:
            parts.append(f"profile {self.profile}")
        if self.gpu_type is not None:
            parts.append(f"GPU type {self.gpu_type}")
        if self.min_gpus is not None and self.min_gpus == self.max_gpus:
            parts.append(f"{self.min_gpus} GPUs")
        else:
            if self.min_gpus is not None:
                parts.append(f"at least {self.min_gpus} GPUs")
            if self.max_gpus is not None:
                parts.append(f"at most {self.max_gpus} GPUs")
        return ", ".join(parts) or "every server"


_RULE_KEYS = {"timeout", "gpu_timeout", "profile", "gpu_type", "min_gpus", "max_gpus", "gpus"}


def parse_rule(raw: Mapping) -> TimeoutRule:
    """A rule from config: ``{"gpu_type": "h100", "min_gpus": 8, "timeout": 1800}``.

    ``gpus: N`` is short for ``min_gpus: N, max_gpus: N``. Raises ValueError
    with one sentence when the rule is malformed.
    """
    if not isinstance(raw, Mapping):
        raise ValueError(f"a timeout rule must be a dict, got {raw!r}")
    unknown = set(raw) - _RULE_KEYS
    if unknown:
        raise ValueError(
            f"timeout rule {dict(raw)!r} has unknown keys {sorted(unknown)}: "
            f"use {sorted(_RULE_KEYS)}"
        )
    seconds = {}
    for key in ("timeout", "gpu_timeout"):
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, (int, float)) or value <= 0:
            raise ValueError(f"timeout rule {dict(raw)!r}: {key} must be seconds above 0")
        seconds[key] = float(value)
    if not seconds:
        raise ValueError(f"timeout rule {dict(raw)!r} needs a timeout or gpu_timeout in seconds")
    counts = {}
    for key in ("gpus", "min_gpus", "max_gpus"):
        value = raw.get(key)
        if value is None:
            continue
        if isinstance(value, bool) or not isinstance(value, int) or value < 0:
            raise ValueError(f"timeout rule {dict(raw)!r}: {key} must be a whole number >= 0")
        counts[key] = value
    min_gpus = counts.get("min_gpus", counts.get("gpus"))
    max_gpus = counts.get("max_gpus", counts.get("gpus"))
    for key in ("profile", "gpu_type"):
        if raw.get(key) is not None and not isinstance(raw[key], str):
            raise ValueError(f"timeout rule {dict(raw)!r}: {key} must be a string")
    return TimeoutRule(
        timeout=seconds.get("timeout"),
        gpu_timeout=seconds.get("gpu_timeout"),
        profile=raw.get("profile"),
        gpu_type=raw.get("gpu_type"),
        min_gpus=min_gpus,
        max_gpus=max_gpus,
    )


@dataclass(frozen=True)
class Policy:
    rules: tuple[TimeoutRule, ...] = ()
    default_timeout: float | None = 3600.0
    default_gpu_timeout: float | None = None
    max_age: float | None = None
    min_running: float = 0.0
    exempt_users: frozenset[str] = frozenset()
    exempt_groups: frozenset[str] = frozenset()
    cull_admin_users: bool = True
    pressure_timeouts: Mapping[str, float] = field(default_factory=dict)
    default_pressure_timeout: float | None = None
    warning_period: float = 0.0
    #: The keeps a user may choose, in seconds (each at most the server's max_keep).
    keep_choices: tuple[float, ...] = (3600.0, 14400.0)
    #: A kept server is not freed for waiting requests either.
    keep_overrides_pressure: bool = False

    def timeout_for(self, server: Server) -> tuple[float | None, float | None, str]:
        """The idle and GPU-idle timeouts that apply to a server, and which rule gave them.

        The user's own idle timeout replaces the matching rule's (a rule that gives only a
        GPU timeout keeps it).
        """
        timeout, gpu_timeout, rule = self.default_timeout, self.default_gpu_timeout, "default"
        for r in self.rules:
            if r.matches(server):
                timeout, gpu_timeout, rule = r.timeout, r.gpu_timeout, r.describe()
                break
        if server.idle_timeout is not None:
            return server.idle_timeout, gpu_timeout, "the idle timeout its user chose"
        return timeout, gpu_timeout, rule

    def keep_choices_for(self, server: Server) -> tuple[float, ...]:
        """The keeps its user may choose: the culler's choices up to the server's max_keep."""
        return tuple(c for c in self.keep_choices if 0 < c <= server.max_keep)

    def pressure_timeout_for(self, gpu_type: str) -> float | None:
        return self.pressure_timeouts.get(gpu_type, self.default_pressure_timeout)


@dataclass(frozen=True)
class Decision:
    server: Server
    action: str
    reason: str
    idle_seconds: float | None = None
    timeout: float | None = None
    gpu_state: str = GPU_NOT_USED
    detail: str = ""

    @property
    def gpus_reclaimed(self) -> int:
        return self.server.gpus if self.action == CULL else 0


def _duration(seconds: float | None) -> str:
    if seconds is None:
        return "unknown"
    seconds = int(seconds)
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours:
        return f"{hours}h{minutes:02d}m"
    if minutes:
        return f"{minutes}m{secs:02d}s"
    return f"{secs}s"


def idle_since(server: Server, gpu: GPUView) -> tuple[float | None, str]:
    """When the server became idle by both signals, and the GPU signal's state.

    None means "busy": the GPU data is missing or Prometheus did not answer.
    """
    jupyter = server.last_activity if server.last_activity is not None else server.started
    if server.gpus <= 0 or not gpu.enabled:
        return jupyter, GPU_NOT_USED
    if not gpu.ok:
        return None, GPU_UNAVAILABLE
    if server.pod is None or server.namespace is None:
        return None, GPU_MISSING
    sample = gpu.samples.get((server.namespace, server.pod))
    if sample is None:
        return None, GPU_MISSING
    gpu_since = sample.last_busy if sample.last_busy is not None else sample.window_start
    candidates = [t for t in (jupyter, gpu_since, server.started) if t is not None]
    return max(candidates), GPU_FRESH


def _skip_reason(server: Server, policy: Policy) -> str | None:
    if server.pending:
        return REASON_PENDING
    if not server.ready:
        return REASON_NOT_READY
    if server.user in policy.exempt_users:
        return REASON_EXEMPT
    if policy.exempt_groups:
        if server.groups is None:
            # the user might be in an exempt group: never cull on missing data
            return REASON_GROUPS_UNKNOWN
        if server.groups & policy.exempt_groups:
            return REASON_EXEMPT
    if server.admin and not policy.cull_admin_users:
        return REASON_ADMIN
    return None


def decide_one(server: Server, now: float, policy: Policy, gpu: GPUView) -> Decision:
    """The decision for one server, without pressure or warnings."""
    skip = _skip_reason(server, policy)
    if skip is not None:
        return Decision(server, SKIP, skip, detail=f"skipped ({skip})")
    age = None if server.started is None else now - server.started
    since, gpu_state = idle_since(server, gpu)
    idle = None if since is None else max(0.0, now - since)
    deadline = server.deadline
    # a deadline is hard: before min_running, missing GPU data and any keep
    if deadline is not None and now >= deadline.at:
        return Decision(
            server,
            CULL,
            deadline.reason,
            idle_seconds=idle,
            timeout=deadline.seconds,
            gpu_state=gpu_state,
            detail=_deadline_text(deadline, "reached"),
        )
    if age is not None and age < policy.min_running:
        decision = Decision(
            server,
            KEEP,
            REASON_TOO_YOUNG,
            detail=f"running {_duration(age)}, under the minimum {_duration(policy.min_running)}",
        )
    else:
        decision = _decide_idle(server, now, policy, gpu, age, since, gpu_state, idle)
    warn_deadline = deadline is not None and now >= deadline.at - policy.warning_period
    # max_age is as hard as a deadline and comes first: its own warning stands
    if warn_deadline and not (decision.action == CULL and decision.reason == REASON_MAX_AGE):
        return Decision(
            server,
            WARN,
            deadline.reason,
            idle_seconds=idle,
            timeout=deadline.seconds,
            gpu_state=gpu_state,
            detail=_deadline_text(deadline, f"in {_duration(deadline.at - now)}"),
        )
    return decision


def _deadline_text(deadline: Deadline, when: str) -> str:
    what = (
        f"maximum running time {_duration(deadline.seconds)}"
        if deadline.reason == REASON_MAX_RUNTIME
        else f"its user's GPU-hours budget {deadline.detail or ''}".rstrip()
    )
    return f"{what} {when}"


def _kept(decision: Decision, now: float) -> Decision:
    """An idle or GPU-idle cull of a kept server becomes a keep until its keep ends."""
    until = decision.server.keep_until
    if decision.action != CULL or until is None or until <= now:
        return decision
    return replace(
        decision,
        action=KEEP,
        reason=REASON_KEPT,
        detail=f"{decision.detail}; kept by its user for {_duration(until - now)} more",
    )


def _decide_idle(
    server: Server,
    now: float,
    policy: Policy,
    gpu: GPUView,
    age: float | None,
    since: float | None,
    gpu_state: str,
    idle: float | None,
) -> Decision:
    """The decision by max_age and the idle rules (a keep applied)."""
    if policy.max_age is not None and age is not None and age >= policy.max_age:
        return Decision(
            server,
            CULL,
            REASON_MAX_AGE,
            idle_seconds=idle,
            timeout=policy.max_age,
            gpu_state=gpu_state,
            detail=f"running {_duration(age)}, over max_age {_duration(policy.max_age)}",
        )
    if since is None:
        reason = REASON_GPU_UNAVAILABLE if gpu_state == GPU_UNAVAILABLE else REASON_GPU_MISSING
        what = (
            "Prometheus did not answer"
            if gpu_state == GPU_UNAVAILABLE
            else f"no fresh GPU metrics for pod {server.namespace}/{server.pod}"
        )
        return Decision(
            server, KEEP, reason, gpu_state=gpu_state, detail=f"counted as busy: {what}"
        )
    timeout, gpu_timeout, rule = policy.timeout_for(server)
    if gpu_state == GPU_FRESH and gpu_timeout is not None:
        sample = gpu.samples[(server.namespace, server.pod)]
        gpu_since = sample.last_busy if sample.last_busy is not None else sample.window_start
        if server.started is not None:
            gpu_since = max(gpu_since, server.started)
        gpu_idle = max(0.0, now - gpu_since)
        if gpu_idle >= gpu_timeout:
            return _kept(
                Decision(
                    server,
                    CULL,
                    REASON_GPU_IDLE,
                    idle_seconds=idle,
                    timeout=gpu_timeout,
                    gpu_state=gpu_state,
                    detail=(
                        f"GPUs idle {_duration(gpu_idle)}, over the {_duration(gpu_timeout)} "
                        f"GPU timeout ({rule}), though Jupyter was active {_duration(idle)} ago"
                    ),
                ),
                now,
            )
    if timeout is None:
        return Decision(
            server,
            KEEP,
            REASON_NO_TIMEOUT,
            idle_seconds=idle,
            gpu_state=gpu_state,
            detail="no idle timeout applies",
        )
    if idle >= timeout:
        return _kept(
            Decision(
                server,
                CULL,
                REASON_IDLE,
                idle_seconds=idle,
                timeout=timeout,
                gpu_state=gpu_state,
                detail=f"idle {_duration(idle)}, over the {_duration(timeout)} timeout ({rule})",
            ),
            now,
        )
    return Decision(
        server,
        KEEP,
        REASON_ACTIVE,
        idle_seconds=idle,
        timeout=timeout,
        gpu_state=gpu_state,
        detail=f"idle {_duration(idle)} of {_duration(timeout)} ({rule})",
    )


def _words(seconds: float) -> str:
    """A timeout in words: ``90 s``, ``60 min``, ``8 h``, ``2 h 30 min``."""
    seconds = round(seconds)
    if seconds < 120:
        return f"{seconds} s"
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    if hours < 2:
        text = f"{seconds // 60} min"
        return f"{text} {secs} s" if secs else text
    parts = (
        [f"{hours} h"] + ([f"{minutes} min"] if minutes else []) + ([f"{secs} s"] if secs else [])
    )
    return " ".join(parts)


@dataclass(frozen=True)
class StopForecast:
    """When the culler's rules would first find a server over a timeout, if nothing changes.

    ``due`` is that time (before rounding to a pass); ``rule`` says which rule, in words.
    """

    due: float
    reason: str
    rule: str


def stop_forecast(server: Server, policy: Policy, gpu: GPUView) -> StopForecast | None:
    """The earliest time a rule of ``decide_one`` would cull ``server`` if it stays as idle as
    ``gpu`` and its ``last_activity`` say; None when no rule would (exempt, no timeout, or its
    GPU data missing, which counts as busy).

    The same rules as :func:`decide_one`, from the same helpers: ``max_age`` counts from the
    start, a GPU-idle timeout from the GPUs' last busy time (at the earliest the start), the
    idle timeout from :func:`idle_since` (the later of Jupyter's and the GPUs' activity); none
    comes before ``min_running``, and no idle rule before a keep ends. A deadline
    (``max_runtime``, the budget) is its own time. Pressure is left out: it depends on who
    else waits.
    """
    if _skip_reason(server, policy) is not None:
        return None
    earliest = server.started + policy.min_running if server.started is not None else None
    candidates: list[StopForecast] = []
    deadlines: list[StopForecast] = []
    if server.deadline is not None:
        d = server.deadline
        rule = (
            f"maximum running time of {_words(d.seconds)}"
            if d.reason == REASON_MAX_RUNTIME and d.seconds is not None
            else f"GPU-hours budget {d.detail}".rstrip()
            if d.reason == REASON_BUDGET
            else d.reason
        )
        deadlines.append(StopForecast(d.at, d.reason, rule))
    if policy.max_age is not None and server.started is not None:
        candidates.append(
            StopForecast(
                server.started + policy.max_age,
                REASON_MAX_AGE,
                f"maximum age of {_words(policy.max_age)}",
            )
        )
    since, gpu_state = idle_since(server, gpu)
    if since is not None:
        timeout, gpu_timeout, _ = policy.timeout_for(server)
        if gpu_state == GPU_FRESH and gpu_timeout is not None:
            sample = gpu.samples[(server.namespace, server.pod)]
            gpu_since = sample.last_busy if sample.last_busy is not None else sample.window_start
            if server.started is not None:
                gpu_since = max(gpu_since, server.started)
            candidates.append(
                StopForecast(
                    max(gpu_since + gpu_timeout, server.keep_until or 0),
                    REASON_GPU_IDLE,
                    f"GPU idle timeout of {_words(gpu_timeout)}",
                )
            )
        if timeout is not None:
            candidates.append(
                StopForecast(
                    max(since + timeout, server.keep_until or 0),
                    REASON_IDLE,
                    f"idle timeout of {_words(timeout)}",
                )
            )
    if earliest is not None:
        candidates = [replace(f, due=max(f.due, earliest)) for f in candidates]
    # a deadline comes first on a tie, then decide_one's order (max_age, GPU idle, idle)
    candidates = deadlines + candidates
    if not candidates:
        return None
    return min(candidates, key=lambda f: f.due)


def next_pass(t: float, last_pass: float, cull_every: float) -> float:
    """The first pass after ``last_pass`` at or after ``t``: culls happen on passes only.

    Passes come every ``cull_every`` seconds from ``last_pass``; a time at or before
    ``last_pass`` is the next pass's (the last one did not cull).
    """
    if cull_every <= 0:
        return max(t, last_pass)
    passes = max(1, -(-(t - last_pass) // cull_every))
    return last_pass + passes * cull_every


def stop_at(
    server: Server,
    policy: Policy,
    gpu: GPUView,
    last_pass: float,
    cull_every: float,
) -> StopForecast | None:
    """When the culler would stop ``server`` if it stays as it is: the pass at or after
    :func:`stop_forecast`'s time, and with a warning period, the first pass at or after the
    period's end counted from that pass's warning (``due`` rounded so); None when no rule would.
    A deadline is warned ahead of its time: the pass at or after it.
    """
    forecast = stop_forecast(server, policy, gpu)
    if forecast is None:
        return None
    at = next_pass(forecast.due, last_pass, cull_every)
    if policy.warning_period > 0 and forecast.reason not in DEADLINE_REASONS:
        at = next_pass(at + policy.warning_period, at, cull_every)
    return replace(forecast, due=at)


# Where waiting requests come from, in the order they are served: the hub's queue, pods
# the scheduler cannot place (they hold their quota already), the heads of Kueue's
# ClusterQueues (culler.kueuedemand), then requests the hub refused lately.
SOURCES = ("queued", "pending", "kueue", "refused")
#: The source of a request waiting in Kueue's queue (gpuspawner.culler.kueuedemand).
KUEUE_SOURCE = "kueue"


@dataclass(frozen=True)
class Request:
    """A request waiting for ``gpus`` GPUs of ``gpu_type`` on one node."""

    gpu_type: str
    gpus: int
    source: str = "pending"  # "queued" or "refused" in the hub, a "pending" pod, or "kueue"

    @property
    def describe(self) -> str:
        return f"{self.gpus} x {self.gpu_type} ({self.source})"


@dataclass(frozen=True)
class Pressure:
    """The requests waiting for GPUs and the GPUs free now on each node, per type.

    A type (or node) missing from ``free`` counts as having none free: the
    culler then frees only what alone makes a request fit.
    """

    requests: tuple[Request, ...] = ()
    free: Mapping[str, Mapping[str, int]] = field(default_factory=dict)


@dataclass(frozen=True)
class PressureOutcome:
    """What pressure mode did for one request this pass."""

    request: Request
    node: str | None  # where it fits now or after the culls; None: unserved
    freed: tuple[tuple[str, str], ...] = ()  # servers culled (or warned) for it
    why: str = ""  # for an unserved request: why nothing was freed

    @property
    def served(self) -> bool:
        return self.node is not None


def _request_order(request: Request) -> tuple[int, int]:
    # Queued before pending before refused; larger requests first, since they
    # are the hardest to place once smaller ones have taken a node's GPUs.
    rank = SOURCES.index(request.source) if request.source in SOURCES else len(SOURCES)
    return (rank, -request.gpus)


def _pressure_candidates(
    decisions: list[Decision],
    gpu_type: str,
    timeout: float,
    taken: set[int],
    policy: Policy,
    now: float | None,
) -> dict[str, list[int]]:
    """Node -> indexes of the servers pressure may stop there, longest-idle first.

    A kept server is one unless ``keep_overrides_pressure``.
    """
    by_node: dict[str, list[int]] = {}
    for i, d in enumerate(decisions):
        until = d.server.keep_until
        kept = until is not None and now is not None and until > now
        if (
            i not in taken
            and d.action == KEEP
            and d.reason in (REASON_ACTIVE, REASON_NO_TIMEOUT, REASON_KEPT)
            and not (kept and policy.keep_overrides_pressure)
            and d.server.gpus > 0
            and d.server.gpu_type == gpu_type
            and d.server.node
            and d.idle_seconds is not None
            and d.idle_seconds >= timeout
        ):
            by_node.setdefault(d.server.node, []).append(i)
    for indexes in by_node.values():
        indexes.sort(key=lambda i: (-decisions[i].idle_seconds, decisions[i].server.key))
    return by_node


def apply_pressure(
    decisions: list[Decision],
    policy: Policy,
    pressure: Pressure,
    now: float | None = None,
) -> tuple[list[Decision], list[PressureOutcome]]:
    """Free GPUs so that each waiting request fits on one node; return the decisions and
    what was done for each request.

    Per request: if a node has enough free GPUs (those freed by this pass's
    other culls included), it fits already and takes them. Otherwise, on each
    node, idle servers of the type (busy by neither signal, idle longer than
    the type's pressure timeout) are taken longest-idle first until the node
    has enough; the node needing the fewest GPUs freed (then the fewest
    servers, then the longest idle) wins. If no node gets there, nothing is
    freed for the request: stopping servers that cannot make it fit would
    help nobody. A server its user keeps (``keep_until`` after ``now``) is freed too,
    unless the policy's ``keep_overrides_pressure``.

    A request from Kueue's queue (source ``kueue``) waits for quota, which the
    nodes' free GPUs do not show (nor do they count other namespaces' pods): only
    GPUs this pass frees count for it.
    """
    result = list(decisions)
    free: dict[str, dict[str, int]] = {t: dict(nodes) for t, nodes in pressure.free.items()}
    # What this pass frees, per type and node: all that counts for a request from Kueue.
    freed_now: dict[str, dict[str, int]] = {}
    for d in result:
        if d.action == CULL and d.server.gpus > 0 and d.server.gpu_type and d.server.node:
            for counted in (free, freed_now):
                nodes = counted.setdefault(d.server.gpu_type, {})
                nodes[d.server.node] = nodes.get(d.server.node, 0) + d.server.gpus
    taken: set[int] = set()
    outcomes: list[PressureOutcome] = []
    for request in sorted(pressure.requests, key=_request_order):
        if request.gpus <= 0:
            continue
        from_kueue = request.source == KUEUE_SOURCE
        nodes = (freed_now if from_kueue else free).setdefault(request.gpu_type, {})
        fitting = [n for n, f in nodes.items() if f >= request.gpus]
        if fitting:
            node = min(fitting, key=lambda n: (nodes[n], n))
            _take(free, freed_now, request.gpu_type, node, request.gpus)
            outcomes.append(PressureOutcome(request, node))
            continue
        timeout = policy.pressure_timeout_for(request.gpu_type)
        if timeout is None:
            outcomes.append(
                PressureOutcome(request, None, why="no pressure timeout is set for its GPU type")
            )
            continue
        best: tuple[tuple, str, list[int], int] | None = None
        for node, indexes in _pressure_candidates(
            result, request.gpu_type, timeout, taken, policy, now
        ).items():
            have, chosen = nodes.get(node, 0), []
            for i in indexes:
                if have >= request.gpus:
                    break
                chosen.append(i)
                have += result[i].server.gpus
            if have < request.gpus:
                continue
            freed = sum(result[i].server.gpus for i in chosen)
            idle = sum(result[i].idle_seconds or 0 for i in chosen)
            rank = (freed, len(chosen), -idle, node)
            if best is None or rank < best[0]:
                best = (rank, node, chosen, have)
        if best is None:
            outcomes.append(
                PressureOutcome(
                    request,
                    None,
                    why=(
                        f"no node would have {request.gpus} free {request.gpu_type} GPUs even "
                        f"if its idle servers were stopped"
                    ),
                )
            )
            continue
        _, node, chosen, have = best
        for counted in (free, freed_now):
            counted.setdefault(request.gpu_type, {}).setdefault(node, 0)
            counted[request.gpu_type][node] += sum(result[i].server.gpus for i in chosen)
        _take(free, freed_now, request.gpu_type, node, request.gpus)
        for i in chosen:
            taken.add(i)
            d = result[i]
            result[i] = replace(
                d,
                action=CULL,
                reason=REASON_PRESSURE,
                timeout=timeout,
                detail=(
                    f"idle {_duration(d.idle_seconds)}, over the pressure timeout "
                    f"{_duration(timeout)}; its GPUs on {node} let a waiting request for "
                    f"{request.gpus} {request.gpu_type} GPUs ({request.source}) start"
                ),
            )
        outcomes.append(
            PressureOutcome(request, node, freed=tuple(result[i].server.key for i in chosen))
        )
    return result, outcomes


def _take(
    free: dict[str, dict[str, int]],
    freed_now: dict[str, dict[str, int]],
    gpu_type: str,
    node: str,
    gpus: int,
) -> None:
    """A request takes ``gpus`` on ``node``: first of what this pass freed there."""
    now_there = freed_now.setdefault(gpu_type, {}).get(node, 0)
    freed_now[gpu_type][node] = max(now_there - gpus, 0)
    free.setdefault(gpu_type, {})[node] = free[gpu_type].get(node, 0) - gpus


@dataclass(frozen=True)
class WarningMark:
    """A server warned that it will be culled, and when."""

    warned_at: float
    reason: str


def apply_warnings(
    decisions: list[Decision],
    warned: Mapping[tuple[str, str], WarningMark],
    now: float,
    warning_period: float,
) -> tuple[list[Decision], dict[tuple[str, str], WarningMark]]:
    """Turn culls into warnings until a server has been warned ``warning_period`` ago.

    Returns the decisions and the warnings to keep for the next pass: a
    server that is no longer eligible loses its warning, so it must be found
    idle again, on fresh data, before it is culled.

    A deadline is warned by :func:`decide_one` ahead of its time, which its mark
    carries (warned ``warning_period`` before it), and culled at it.
    """
    if warning_period <= 0:
        return list(decisions), {}
    result = []
    still: dict[tuple[str, str], WarningMark] = {}
    for d in decisions:
        if d.reason in DEADLINE_REASONS and d.server.deadline is not None:
            if d.action == WARN:
                still[d.server.key] = WarningMark(d.server.deadline.at - warning_period, d.reason)
            result.append(d)
            continue
        if d.action != CULL:
            result.append(d)
            continue
        mark = warned.get(d.server.key)
        if mark is not None and now - mark.warned_at >= warning_period:
            result.append(d)
            continue
        mark = mark or WarningMark(warned_at=now, reason=d.reason)
        still[d.server.key] = mark
        remaining = warning_period - (now - mark.warned_at)
        result.append(
            replace(
                d,
                action=WARN,
                detail=f"{d.detail}; warned, culled in {_duration(remaining)} if still idle",
            )
        )
    return result, still


@dataclass(frozen=True)
class PassResult:
    """One pass's decisions, the warnings to carry to the next, and what pressure did."""

    decisions: list[Decision]
    warned: dict[tuple[str, str], WarningMark]
    pressure: list[PressureOutcome] = field(default_factory=list)


def decide_pass(
    servers: Iterable[Server],
    now: float,
    policy: Policy,
    gpu: GPUView | None = None,
    pressure: Pressure | None = None,
    warned: Mapping[tuple[str, str], WarningMark] | None = None,
) -> PassResult:
    """Every server's decision for this pass, the warnings to carry, and the pressure outcomes."""
    gpu = gpu or GPUView()
    decisions = [decide_one(s, now, policy, gpu) for s in servers]
    outcomes: list[PressureOutcome] = []
    if pressure is not None and pressure.requests:
        decisions, outcomes = apply_pressure(decisions, policy, pressure, now)
    decisions, still = apply_warnings(decisions, warned or {}, now, policy.warning_period)
    return PassResult(decisions, still, outcomes)


def decide(
    servers: Iterable[Server],
    now: float,
    policy: Policy,
    gpu: GPUView | None = None,
    pressure: Pressure | None = None,
    warned: Mapping[tuple[str, str], WarningMark] | None = None,
) -> tuple[list[Decision], dict[tuple[str, str], WarningMark]]:
    """Every server's decision for this pass, and the warnings to carry to the next."""
    result = decide_pass(servers, now, policy, gpu=gpu, pressure=pressure, warned=warned)
    return result.decisions, result.warned


def log_line(decision: Decision, dry_run: bool = False) -> str:
    """One line per cull or warning (or, in a dry run, would-cull and would-warn): user,
    server, GPUs reclaimed, idle time and reason."""
    s = decision.server
    verb = {
        CULL: "would cull" if dry_run else "culling",
        WARN: "would warn" if dry_run else "warning",
    }.get(decision.action, decision.action)
    gpus = f"{s.gpus} x {s.gpu_type}" if s.gpus > 0 else "no GPUs"
    return (
        f"{verb} {s.display!r} (user {s.user!r}, server {s.name!r}, profile "
        f"{s.profile or '-'}, {gpus}): reason {decision.reason}, idle "
        f"{_duration(decision.idle_seconds)}; {decision.detail}"
    )
