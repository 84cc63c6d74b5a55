"""Configuration: defaults < TOML file < environment variables (docs/configuration.md).

The TOML file is named by ``--config`` or ``ORBIT_CONFIG``. Every key has an environment variable
``ORBIT_<SECTION>_<KEY>`` (``ORBIT_DATABASE_URL`` for the database). Unknown keys are an error:
a typo in production config must not be silently ignored.
"""

from __future__ import annotations

import os
import tomllib
from pathlib import Path
from typing import Any

import attrs
import cattrs

from orbit_common.db.pool import DatabaseUrl, SessionSettings
from orbit_common.model.endpoints import EndpointPolicy
from orbit_common.model.sealing import Sealer, SealingError


@attrs.frozen(kw_only=True)
class DatabaseConfig:
    url: str = attrs.field(default="", repr=False)
    pool_min: int = 1
    pool_max: int = 20
    # The daemons' sessions (docs/runbooks/liveness.md): a lock wait longer than this fails
    # with 1205 and the transaction runner re-runs the transaction (jittered, bounded); a write
    # transaction whose client stays silent this long is rolled back by the server (MariaDB;
    # 0 turns it off). Orbit's transactions never wait on anything but the database between two
    # statements, so a writer silent for a whole second is a frozen process.
    lock_wait_timeout_s: int = 2
    idle_transaction_timeout_s: int = 1

    def parsed(self) -> DatabaseUrl:
        if not self.url:
            raise ConfigError("no database configured: set ORBIT_DATABASE_URL or [database].url")
        return DatabaseUrl.parse(self.url)

    def session(self) -> SessionSettings:
        try:
            return SessionSettings(lock_wait_timeout_s=self.lock_wait_timeout_s,
                                   idle_transaction_timeout_s=self.idle_transaction_timeout_s)
        except ValueError as exc:
            raise ConfigError(f"invalid [database] setting: {exc}") from exc


@attrs.frozen(kw_only=True)
class ApiConfig:
    host: str = "127.0.0.1"
    port: int = 8080
    max_body_bytes: int = 1024 * 1024
    public_url: str = ""
    # A subscription stream's first ack/fail frame waits this long for others to join its
    # settle transaction (docs/api/subscriptions.md, "WebSocket").
    stream_settle_window_ms: int = attrs.field(default=2, validator=[
        attrs.validators.ge(0), attrs.validators.le(5_000)])


# 960 KiB: a result at the limit fits a 1 MiB message with its envelope (ids, token, report id).
MAX_RESULT_BYTES = 960 * 1024
# Results are MEDIUMTEXT (16 MiB - 1 byte) and a result event's snapshot holds the result, the
# error (at most 64 KiB) and a task summary: no setting may let a result reach the column size.
RESULT_BYTES_CEILING = 15 * 1024 * 1024


@attrs.frozen(kw_only=True)
class HttpConfig:
    """Connection limits of every HTTP listener: the API, the worker gateway and the health
    listener (docs/configuration.md, ``[http]``). A slow or greedy client costs one client."""

    # The whole request head must arrive within header_timeout_s of the connection's accept
    # (or, on a keep-alive connection, of the next request's first byte); the body within
    # body_timeout_s of its head. Otherwise 408 request_timeout and the connection closes.
    header_timeout_s: float = 10.0
    body_timeout_s: float = 30.0
    # An idle keep-alive connection (no request in progress) is closed after this long.
    keepalive_timeout_s: float = 75.0
    # Open connections per client address (IPv6: per /64); 0 is no limit. Worker WebSockets
    # count, and behind a reverse proxy every connection is the proxy's.
    max_connections_per_client: int = 256

    def checked(self) -> HttpConfig:
        """This configuration, or a :class:`ConfigError` naming the key that is out of range."""
        for name in ("header_timeout_s", "body_timeout_s", "keepalive_timeout_s"):
            if not 0 < getattr(self, name) <= 86400:
                raise ConfigError(f"invalid [http] setting: {name} must be in (0, 86400]")
        if self.max_connections_per_client < 0:
            raise ConfigError("invalid [http] setting: max_connections_per_client must be >= 0")
        return self


@attrs.frozen(kw_only=True)
class DispatcherConfig:
    """The worker gateway (``orbit dispatcher``)."""

    host: str = "127.0.0.1"
    port: int = 8081
    claim_batch: int = 32  # tasks per claim transaction
    # The claim pool (docs/fair-dispatch.md): an empty claim marks its queue empty for
    # empty_probe_ms (0: idle_poll_min_ms), doubling while it stays empty up to idle_poll_max_ms.
    idle_poll_min_ms: int = 5  # first empty-probe TTL unless empty_probe_ms is set
    idle_poll_max_ms: int = 500  # empty-probe TTL cap; also the pause after a database error
    empty_probe_ms: int = 0  # first empty-probe TTL; 0 means idle_poll_min_ms
    claim_concurrency: int = 2  # claim transactions in flight per dispatcher process
    recovery_interval_s: float = 1.0  # lease-expiry / deadline / session scan period
    max_offer_lapses: int = 10  # consecutive lapsed offers of one task, then FAILED
    gauge_interval_s: float = 15.0  # usage gauges (queue lag, permits held) refresh period
    # Renewals and session heartbeats run on their own small pool, so they never queue for a
    # connection behind claims and finishes (docs/runbooks/liveness.md).
    renew_pool_size: int = 2
    # Every dispatcher writes a heartbeat row this often (database time); a gap longer than
    # outage_threshold_s in the fleet's heartbeats is an outage, and live leases are extended
    # by its length before anything decides on them (docs/runbooks/liveness.md).
    heartbeat_interval_s: float = 1.0
    outage_threshold_s: float = 2.0
    node: str = ""  # observability label; defaults to host:pid
    # How often the open WebSocket sessions' credentials are re-read: a revoked credential's
    # (or disabled application's) sessions are closed within this many seconds.
    credential_check_s: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))
    # Worker-protocol limits (docs/api/worker.md#6-限制): the largest message (a WebSocket text
    # frame, or a request body on the dispatcher's HTTP routes), the largest results and errors
    # one finish may store together (below what one statement may carry: the database's
    # max_allowed_packet must exceed 2 x max_result_bytes + 1 MiB, docs/configuration.md), and
    # the flood limits per WebSocket (past either, the socket is closed with 1008).
    max_message_bytes: int = attrs.field(
        default=1024 * 1024, validator=[attrs.validators.ge(64 * 1024),
                                        attrs.validators.le(64 * 1024 * 1024)])
    max_result_bytes: int = attrs.field(
        default=MAX_RESULT_BYTES, validator=[attrs.validators.ge(1024),
                                             attrs.validators.le(RESULT_BYTES_CEILING)])
    max_frames_per_second: int = attrs.field(default=2000, validator=attrs.validators.ge(1))
    max_invalid_frames: int = attrs.field(default=10, validator=attrs.validators.ge(1))


@attrs.frozen(kw_only=True)
class SchedulerConfig:
    """The schedule firing daemon (``orbit scheduler``)."""

    batch: int = 64  # schedules locked per firing transaction
    concurrency: int = 2  # firing transactions in flight per scheduler process
    poll_min_ms: int = 10  # shortest sleep when nothing is due
    poll_max_ms: int = 200  # longest sleep: bounds the delay before a new schedule is seen


@attrs.frozen(kw_only=True)
class DeliveryConfig:
    """Result subscriptions and their deliveries (docs/configuration.md, ``[delivery]``)."""

    # Base64 of 32 random bytes: the AES-256-GCM key that seals webhook signing secrets at rest
    # (orbit_common/model/sealing.py). Needed by the API (create, rotate) and the pump (sign);
    # without it, webhook subscriptions cannot be created.
    secret_key: str = attrs.field(default="", repr=False)
    # The endpoint policy (orbit_common/model/endpoints.py): http endpoints, private and
    # loopback addresses are refused unless allowed; a non-empty allow-list limits the hosts.
    allow_http: bool = False
    allow_private_networks: bool = False
    allow_loopback: bool = False
    endpoint_allow_list: tuple[str, ...] = ()
    # The pump (``orbit delivery``, docs/configuration.md): fan-out passes, webhook sending,
    # endpoint circuits, lapse recovery and gauges.
    fanout_batch: int = attrs.field(default=500, validator=attrs.validators.ge(1))
    fanout_subscriptions: int = attrs.field(default=50, validator=attrs.validators.ge(1))
    lease_batch: int = attrs.field(default=50, validator=[attrs.validators.ge(1),
                                                          attrs.validators.le(500)])
    subscriptions_in_flight: int = attrs.field(default=32, validator=attrs.validators.ge(1))
    batches_per_subscription: int = attrs.field(default=2, validator=attrs.validators.ge(1))
    targets_limit: int = attrs.field(default=1000, validator=attrs.validators.ge(1))
    poll_min_ms: int = attrs.field(default=10, validator=attrs.validators.ge(1))
    poll_max_ms: int = attrs.field(default=200, validator=attrs.validators.ge(1))
    recovery_interval_s: float = attrs.field(default=1.0, validator=attrs.validators.gt(0))
    gauge_interval_s: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))
    send_concurrency: int = attrs.field(default=64, validator=attrs.validators.ge(1))
    endpoint_concurrency: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    connect_timeout_s: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))
    timeout_s: float = attrs.field(default=15.0, validator=attrs.validators.gt(0))
    max_response_bytes: int = attrs.field(default=4096, validator=attrs.validators.ge(0))
    circuit_failure_threshold: int = attrs.field(default=5, validator=attrs.validators.ge(1))
    circuit_open_s: float = attrs.field(default=30.0, validator=attrs.validators.gt(0))
    probe_window_s: float = attrs.field(default=60.0, validator=attrs.validators.gt(0))
    release_delay_ms: int = attrs.field(default=1000, validator=attrs.validators.ge(0))
    # false: no series names a namespace or subscription (the backlog gauge is the sum and the
    # largest one); true: attempts, exhaustion, lag and backlog gain tenant labels.
    metrics_tenant_labels: bool = False

    def policy(self) -> EndpointPolicy:
        return EndpointPolicy(allow_http=self.allow_http,
                              allow_private_networks=self.allow_private_networks,
                              allow_loopback=self.allow_loopback,
                              allow_list=self.endpoint_allow_list)

    def sealer(self) -> Sealer | None:
        """The configured sealer, None without a key; a malformed key is a ConfigError."""
        if not self.secret_key:
            return None
        try:
            return Sealer.from_config(self.secret_key)
        except SealingError as exc:
            raise ConfigError(f"invalid [delivery] setting: secret_key: {exc}") from exc


@attrs.frozen(kw_only=True)
class ServiceConfig:
    """Settings every daemon shares."""

    log_level: str = "INFO"
    log_format: str = "json"  # json | text
    drain_timeout_s: float = 30.0
    readiness_interval_s: float = 5.0
    # The operator listener (docs/configuration.md): every daemon serves /metrics, the detailed
    # /readyz and /healthz here, never on its public port. Port 0 picks a free port (logged).
    metrics_host: str = "127.0.0.1"
    metrics_port: int = 0
    # false: the usage gauges' namespace and queue labels collapse to one "_all" series
    # (ages are the maximum, counts the sum), so no tenant's name appears in /metrics.
    metrics_tenant_labels: bool = True


@attrs.frozen(kw_only=True)
class WeaveConfig:
    """The workflow engine ``orbit weave`` (docs/configuration.md, ``[weave]``)."""

    # The engine replica's lease owner (weave_inbox.lease_owner, at most 128 characters);
    # empty: ``hostname:pid``. Two live replicas must not share one.
    owner: str = ""
    # How long a lease on an inbox row or pending advance holds before another replica may
    # take it (a killed engine's rows come back after this).
    lease_ms: int = attrs.field(default=30_000, validator=attrs.validators.ge(100))
    # Rows leased per round, of each kind (inbox rows, pending advances); a round advances them
    # in up to ``concurrency`` transactions of ``per_transaction`` instances at once.
    batch: int = attrs.field(default=128, validator=[attrs.validators.ge(1),
                                                    attrs.validators.le(500)])
    # Instances advanced together in one transaction at most (each instance's advance is whole
    # in it; a batch that fails is retried instance by instance). As large as a round by
    # default: a transaction's statements serve all its instances, so a busy engine's cost per
    # step falls with it (bench/RESULTS.md, 2026-12-03 second session).
    per_transaction: int = attrs.field(default=128, validator=[attrs.validators.ge(1),
                                                              attrs.validators.le(500)])
    # Advance transactions at once within a round (each its own connection: keep it below
    # [database] pool_max).
    concurrency: int = attrs.field(default=4, validator=attrs.validators.ge(1))
    # Rounds whose advances may run at once: the next lease starts while up to this many
    # rounds are still advancing (1: each round's advances end before the next lease). 1 by
    # default: under load the next lease then takes what ended during the advance, one large
    # round instead of many small ones (bench/RESULTS.md, 2026-12-03 second session).
    rounds_in_flight: int = attrs.field(default=1, validator=[attrs.validators.ge(1),
                                                              attrs.validators.le(16)])
    # Idle polling backs off from poll_min_ms to poll_max_ms; a full round loops at once.
    poll_min_ms: int = attrs.field(default=10, validator=attrs.validators.ge(1))
    poll_max_ms: int = attrs.field(default=200, validator=attrs.validators.ge(1))
    # The scan for lapsed leases runs in at most one lease transaction per this many seconds
    # (0: in every one); a killed replica's rows come back after lease_ms plus at most this.
    recover_interval_s: float = attrs.field(default=1.0, validator=attrs.validators.ge(0))
    gauge_interval_s: float = attrs.field(default=5.0, validator=attrs.validators.gt(0))


@attrs.frozen(kw_only=True)
class ConsoleConfig:
    """The operator console served by ``orbit api`` under ``/console/`` (docs/console.md)."""

    # A session ends after this long without a request (idle) and this long after its login
    # (absolute), whichever comes first; both judged by database time.
    idle_timeout_s: int = attrs.field(default=1800, validator=[attrs.validators.ge(10),
                                                              attrs.validators.le(86_400)])
    absolute_timeout_s: int = attrs.field(default=43_200, validator=[
        attrs.validators.ge(10), attrs.validators.le(30 * 86_400)])
    # After this many consecutive failed logins, every login is refused for login_lockout_s.
    login_max_failures: int = attrs.field(default=5, validator=[attrs.validators.ge(1),
                                                                attrs.validators.le(100)])
    login_lockout_s: int = attrs.field(default=300, validator=[attrs.validators.ge(1),
                                                              attrs.validators.le(86_400)])
    # The cookie is marked Secure when the request came over HTTPS; set this when a proxy
    # terminates TLS in front of the API (the API then sees plain HTTP).
    cookie_secure: bool = False


@attrs.frozen(kw_only=True)
class OrbitConfig:
    database: DatabaseConfig = attrs.field(factory=DatabaseConfig)
    api: ApiConfig = attrs.field(factory=ApiConfig)
    http: HttpConfig = attrs.field(factory=HttpConfig)
    dispatcher: DispatcherConfig = attrs.field(factory=DispatcherConfig)
    scheduler: SchedulerConfig = attrs.field(factory=SchedulerConfig)
    delivery: DeliveryConfig = attrs.field(factory=DeliveryConfig)
    weave: WeaveConfig = attrs.field(factory=WeaveConfig)
    console: ConsoleConfig = attrs.field(factory=ConsoleConfig)
    service: ServiceConfig = attrs.field(factory=ServiceConfig)


class ConfigError(ValueError):
    pass


def _int(value: Any, _type: Any) -> int:
    # TOML gives ints; the environment gives strings. A float (1.9) or a bool is a typo, not 1.
    if isinstance(value, bool) or not isinstance(value, int | str):
        raise TypeError(f"{value!r} is not an integer")
    return int(value)


def _float(value: Any, _type: Any) -> float:
    if isinstance(value, bool) or not isinstance(value, int | float | str):
        raise TypeError(f"{value!r} is not a number")
    return float(value)


_BOOLEANS = {"true": True, "1": True, "yes": True, "on": True,
             "false": False, "0": False, "no": False, "off": False}


def _bool(value: Any, _type: Any) -> bool:
    # TOML gives booleans; the environment gives strings (bool("false") would be True).
    if isinstance(value, bool):
        return value
    if isinstance(value, str) and value.strip().lower() in _BOOLEANS:
        return _BOOLEANS[value.strip().lower()]
    raise TypeError(f"{value!r} is not a boolean (true or false)")


def _str_list(value: Any, _type: Any) -> tuple[str, ...]:
    # TOML gives a list; the environment a comma-separated string.
    if isinstance(value, str):
        return tuple(part.strip() for part in value.split(",") if part.strip())
    if isinstance(value, list) and all(isinstance(v, str) for v in value):
        return tuple(value)
    raise TypeError(f"{value!r} is not a list of strings")


def _str(value: Any, _type: Any) -> str:
    if not isinstance(value, str):
        raise TypeError(f"{value!r} is not a string")
    return value


_converter = cattrs.Converter(forbid_extra_keys=True)
_converter.register_structure_hook(int, _int)
_converter.register_structure_hook(float, _float)
_converter.register_structure_hook(str, _str)
_converter.register_structure_hook(bool, _bool)
_converter.register_structure_hook_func(lambda t: t == tuple[str, ...], _str_list)

SECTIONS: dict[str, type[Any]] = {
    "database": DatabaseConfig,
    "api": ApiConfig,
    "http": HttpConfig,
    "dispatcher": DispatcherConfig,
    "scheduler": SchedulerConfig,
    "delivery": DeliveryConfig,
    "weave": WeaveConfig,
    "console": ConsoleConfig,
    "service": ServiceConfig,
}
def _env_overrides(environ: dict[str, str]) -> dict[str, dict[str, Any]]:
    """``ORBIT_<SECTION>_<KEY>`` variables; an empty variable counts as unset (so an exported
    but empty ``ORBIT_DATABASE_URL`` does not hide the config file's URL)."""
    result: dict[str, dict[str, Any]] = {}
    for section, section_type in SECTIONS.items():
        for field in attrs.fields(section_type):
            name = f"ORBIT_{section.upper()}_{field.name.upper()}"
            if environ.get(name, "") != "":
                result.setdefault(section, {})[field.name] = environ[name]
    return result


def _format_error(exc: BaseException, type_: type | None) -> str:
    """cattrs' wording, plus what an attrs validator said (``'max_result_bytes' must be …``)."""
    text = cattrs.v.format_exception(exc, type_)
    if type(exc) is ValueError and str(exc).startswith("'"):
        return f"{text}: {exc}"
    return text


def load_config(path: Path | None = None, environ: dict[str, str] | None = None) -> OrbitConfig:
    """Load the configuration (see the module docstring)."""
    environ = dict(os.environ) if environ is None else environ
    path = path or (Path(environ["ORBIT_CONFIG"]) if environ.get("ORBIT_CONFIG") else None)
    data: dict[str, dict[str, Any]] = {}
    if path is not None:
        try:
            data = tomllib.loads(path.read_text())
        except (OSError, tomllib.TOMLDecodeError) as exc:
            raise ConfigError(f"cannot read config {path}: {exc}") from exc
    for section, values in _env_overrides(environ).items():
        data.setdefault(section, {}).update(values)
    try:
        return _converter.structure(data, OrbitConfig)
    except cattrs.BaseValidationError as exc:
        messages = "; ".join(cattrs.transform_error(exc, format_exception=_format_error))
        raise ConfigError(f"invalid configuration: {messages}") from exc
