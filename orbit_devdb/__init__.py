"""A private MariaDB/MySQL instance owned by Orbit (local stack, test runs and benchmarks).

A development tool beside the daemons: ``orbit dev``, ``script/test``, the tests and ``bench``
use it; it imports nothing of Orbit (``python -m orbit_devdb start|stop|url --dir DIR``).

The instance lives in its own directory (data, socket, pid, error log), listens on 127.0.0.1 and
a Unix socket only, and runs with durable settings (``innodb_flush_log_at_trx_commit=1``, no
binary log). Its credentials are written to ``<dir>/db.json`` with mode 0600. It is never the
production database: production uses ``ORBIT_DATABASE_URL``.

Two identities, as in production (docs/runbooks/migrations.md): the instance's administrator
``orbit`` creates databases and applies migrations; the daemons of the local stack connect as
:data:`RUNTIME_USER`, which :func:`ensure_runtime_user` creates with only
:data:`RUNTIME_PRIVILEGES` on one database (no CREATE, DROP, ALTER, INDEX or TRIGGER). Database
and user names are checked against strict patterns (:func:`database_identifier`,
:func:`check_user`) before they reach a statement, where they are identifiers, not parameters.
"""

from __future__ import annotations

import fcntl
import json
import os
import re
import secrets
import shutil
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import attrs
import pymysql

SERVER_NAMES = ("mariadbd", "mysqld")
INSTALL_NAMES = ("mariadb-install-db", "mysql_install_db")
SEARCH_PATH = os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/usr/local/sbin"])


class DevDbError(RuntimeError):
    pass


class InvalidName(DevDbError):
    """A database or user name outside the strict pattern; nothing was executed."""


# Names this module puts into statements: letters, digits and underscores only, so a name is
# written as `name` or 'name'@'host' with nothing to escape (no backtick, quote, space or dot).
DATABASE_NAME = re.compile(r"\A[A-Za-z0-9_]{1,64}\Z")
USER_NAME = re.compile(r"\A[A-Za-z0-9_]{1,32}\Z")  # 32: MySQL 8.4's account name limit

RUNTIME_USER = "orbit_runtime"
# What the daemons need (docs/runbooks/migrations.md, "权限"): rows only. Triggers on the
# append-only tables run with their definer's (the migration identity's) privileges.
RUNTIME_PRIVILEGES = "SELECT, INSERT, UPDATE, DELETE"
ACCOUNT_HOSTS = ("localhost", "127.0.0.1")  # the Unix socket and loopback TCP


def database_identifier(name: str) -> str:
    """``name`` as a quoted identifier, after checking it against :data:`DATABASE_NAME`."""
    if not isinstance(name, str) or not DATABASE_NAME.match(name):
        raise InvalidName(f"invalid database name {name!r}: use 1-64 ASCII letters, digits or "
                          "underscores")
    return f"`{name}`"


def check_user(name: str) -> str:
    """``name`` itself, after checking it against :data:`USER_NAME`."""
    if not isinstance(name, str) or not USER_NAME.match(name):
        raise InvalidName(f"invalid user name {name!r}: use 1-32 ASCII letters, digits or "
                          "underscores")
    return name


def find_binary(names: tuple[str, ...]) -> str | None:
    for name in names:
        found = shutil.which(name, path=SEARCH_PATH)
        if found:
            return found
    return None


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


@attrs.frozen(kw_only=True)
class Instance:
    root: Path
    port: int
    user: str
    password: str = attrs.field(repr=False)
    # The runtime identity's password (RUNTIME_USER), once ensure_runtime_user has created it.
    runtime_password: str | None = attrs.field(default=None, repr=False)

    @property
    def datadir(self) -> Path:
        return self.root / "data"

    @property
    def socket(self) -> Path:
        return self.root / "mysqld.sock"

    @property
    def pidfile(self) -> Path:
        return self.root / "mysqld.pid"

    @property
    def tmpdir(self) -> Path:
        return self.root / "tmp"

    def url(self, database: str = "") -> str:
        """The administrator's URL (databases, users, migrations)."""
        return self._url(self.user, self.password, database)

    def runtime_url(self, database: str) -> str:
        """The runtime identity's URL (the daemons); see :func:`ensure_runtime_user`."""
        if self.runtime_password is None:
            raise DevDbError("no runtime user yet: call ensure_runtime_user first")
        return self._url(RUNTIME_USER, self.runtime_password, database)

    def _url(self, user: str, password: str, database: str) -> str:
        from urllib.parse import quote

        return (
            f"mysql://{quote(user, safe='')}:{quote(password, safe='')}"
            f"@127.0.0.1:{self.port}/{database}"
        )

    def connect(self, database: str | None = None) -> pymysql.connections.Connection[Any]:
        return pymysql.connect(
            unix_socket=str(self.socket),
            user=self.user,
            password=self.password,
            database=database,
            autocommit=True,
            connect_timeout=5,
        )


def _config_path(root: Path) -> Path:
    return root / "db.json"


def load(root: Path) -> Instance | None:
    path = _config_path(root)
    if not path.exists():
        return None
    data = json.loads(path.read_text())
    return Instance(root=root, port=data["port"], user=data["user"], password=data["password"],
                    runtime_password=data.get("runtime_password"))


def _save(instance: Instance) -> None:
    path = _config_path(instance.root)
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o600)
    with os.fdopen(fd, "w") as f:
        doc: dict[str, Any] = {"port": instance.port, "user": instance.user,
                               "password": instance.password}
        if instance.runtime_password is not None:
            doc["runtime_password"] = instance.runtime_password
        json.dump(doc, f)


def _server_args(instance: Instance, extra: list[str]) -> list[str]:
    server = find_binary(SERVER_NAMES)
    if server is None:
        raise DevDbError("no mariadbd/mysqld found: install mariadb-server (script/bootstrap)")
    args = [
        server,
        "--no-defaults",
        f"--datadir={instance.datadir}",
        f"--socket={instance.socket}",
        f"--pid-file={instance.pidfile}",
        # Its own temporary directory: a server starting up deletes every "#sql*" file in
        # its tmpdir, including the temporary tables of other servers sharing /tmp.
        f"--tmpdir={instance.tmpdir}",
        f"--log-error={instance.root / 'error.log'}",
        f"--port={instance.port}",
        "--bind-address=127.0.0.1",
        "--skip-name-resolve",
        "--innodb-flush-log-at-trx-commit=1",
        "--character-set-server=utf8mb4",
        "--collation-server=utf8mb4_unicode_ci",
        "--max-connections=500",
        # What deploy/mysql/orbit.cnf sets (MySQL 8.4's default; MariaDB's is 16M): a finish
        # needs 2 x [dispatcher].max_result_bytes + 1 MiB (docs/configuration.md).
        "--max-allowed-packet=64M",
        # Room for a benchmark's working set: with the 128 MiB / 96 MiB defaults a second
        # 20,000-task phase ran a quarter slower than the first, flushing and checkpointing.
        "--innodb-buffer-pool-size=1G",
        "--innodb-log-file-size=512M",
    ]
    if os.geteuid() == 0:
        args.append("--user=root")
    return args + extra


def _initialise(root: Path) -> None:
    installer = find_binary(INSTALL_NAMES)
    if installer is None:
        raise DevDbError("no mariadb-install-db found: install mariadb-server (script/bootstrap)")
    (root / "data").mkdir(parents=True, exist_ok=True)
    (root / "tmp").mkdir(mode=0o700, exist_ok=True)
    args = [
        installer,
        "--no-defaults",
        f"--datadir={root / 'data'}",
        f"--tmpdir={root / 'tmp'}",  # see _server_args
        "--auth-root-authentication-method=normal",
        "--skip-test-db",
    ]
    if os.geteuid() == 0:
        args.append("--user=root")
    result = subprocess.run(args, capture_output=True, text=True, check=False)
    if result.returncode != 0:
        raise DevDbError(f"mariadb-install-db failed:\n{result.stdout}\n{result.stderr}")


def is_running(instance: Instance) -> bool:
    try:
        pid = int(instance.pidfile.read_text().strip())
        os.kill(pid, 0)
    except (FileNotFoundError, ValueError, ProcessLookupError, PermissionError):
        return False
    return True


def _listening(path: Path) -> bool:
    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as probe:
        try:
            probe.connect(str(path))
        except OSError:
            return False
    return True


def _wait_ready(instance: Instance, user: str, password: str, timeout_s: float) -> None:
    # Probe the socket ourselves first: PyMySQL leaks a socket when a handshake fails halfway.
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline and not _listening(instance.socket):
        time.sleep(0.05)
    last: Exception | None = None
    while time.monotonic() < deadline:
        try:
            pymysql.connect(
                unix_socket=str(instance.socket), user=user, password=password, connect_timeout=2
            ).close()
            return
        except pymysql.err.MySQLError as exc:
            last = exc
            time.sleep(0.1)
    log = instance.root / "error.log"
    tail = log.read_text()[-2000:] if log.exists() else ""
    raise DevDbError(f"database did not become ready: {last}\n{tail}")


def start(
    root: Path, *, port: int | None = None, extra_args: list[str] | None = None
) -> Instance:
    """Initialise (first time) and start the instance in ``root``; idempotent.

    An exclusive file lock serialises concurrent callers (two test runs starting at once), so
    a directory never gets two servers.
    """
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    os.chmod(root, 0o700)
    with (root / "start.lock").open("w") as lock:
        fcntl.flock(lock, fcntl.LOCK_EX)
        return _start_locked(root, port, extra_args)


def _start_locked(root: Path, port: int | None, extra_args: list[str] | None) -> Instance:
    existing = load(root)
    if existing is not None and is_running(existing):
        return existing
    fresh = existing is None
    if existing is None:
        _initialise(root)
        instance = Instance(
            root=root, port=port or free_port(), user="orbit", password=secrets.token_urlsafe(24)
        )
    else:
        instance = existing
    # Detach: a shell starts the server in the background and exits, so the server outlives
    # this process and no Popen object is left waiting on it.
    instance.tmpdir.mkdir(mode=0o700, exist_ok=True)
    launcher = 'exec "$@" </dev/null >/dev/null 2>&1 &'
    subprocess.run(
        ["/bin/sh", "-c", launcher, "sh", *_server_args(instance, extra_args or [])],
        check=True,
        start_new_session=True,
    )
    if fresh:
        _wait_ready(instance, "root", "", 60)
        conn = pymysql.connect(unix_socket=str(instance.socket), user="root", autocommit=True)
        with conn.cursor() as cur:
            for host in ("localhost", "127.0.0.1"):
                cur.execute(
                    f"CREATE USER IF NOT EXISTS 'orbit'@'{host}' IDENTIFIED BY %s",
                    (instance.password,),
                )
                cur.execute(f"GRANT ALL PRIVILEGES ON *.* TO 'orbit'@'{host}' WITH GRANT OPTION")
            # root keeps no password-less access once the instance is set up.
            cur.execute("ALTER USER 'root'@'localhost' IDENTIFIED BY %s", (instance.password,))
        conn.close()
        _save(instance)
    _wait_ready(instance, instance.user, instance.password, 60)
    return instance


def stop(root: Path, *, timeout_s: float = 60) -> None:
    """Stop the instance cleanly (SIGTERM, then wait for the process to exit)."""
    instance = load(root.resolve())
    if instance is None or not is_running(instance):
        return
    pid = int(instance.pidfile.read_text().strip())
    os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return
        time.sleep(0.1)
    os.kill(pid, signal.SIGKILL)


def create_database(instance: Instance, database: str) -> None:
    """``CREATE DATABASE IF NOT EXISTS`` on the instance (utf8mb4); a name outside
    :data:`DATABASE_NAME` raises :class:`InvalidName` before anything is sent."""
    identifier = database_identifier(database)
    conn = instance.connect()
    try:
        with conn.cursor() as cur:
            cur.execute(
                f"CREATE DATABASE IF NOT EXISTS {identifier} "  # checked: [A-Za-z0-9_]{1,64}
                "CHARACTER SET utf8mb4 COLLATE utf8mb4_unicode_ci"
            )
    finally:
        conn.close()


def grant_runtime(conn: pymysql.connections.Connection[Any], database: str, user: str,
                  password: str) -> None:
    """Create (or re-key) ``user`` at :data:`ACCOUNT_HOSTS` with ``password`` and grant it
    :data:`RUNTIME_PRIVILEGES` on ``database``, over an administrator's connection. Both names
    are checked first (:class:`InvalidName`)."""
    identifier, user = database_identifier(database), check_user(user)
    with conn.cursor() as cur:
        for host in ACCOUNT_HOSTS:
            account = f"'{user}'@'{host}'"  # checked: [A-Za-z0-9_]{1,32} and a fixed host
            cur.execute(f"CREATE USER IF NOT EXISTS {account} IDENTIFIED BY %s", (password,))
            cur.execute(f"ALTER USER {account} IDENTIFIED BY %s", (password,))
            cur.execute(f"GRANT {RUNTIME_PRIVILEGES} ON {identifier}.* TO {account}")


def ensure_runtime_user(instance: Instance, database: str) -> Instance:
    """The instance with its runtime identity (:data:`RUNTIME_USER`) able to use ``database``:
    created with a fresh password the first time (saved in ``db.json``), granted rows only."""
    password = instance.runtime_password or secrets.token_urlsafe(24)
    instance = attrs.evolve(instance, runtime_password=password)
    conn = instance.connect()
    try:
        grant_runtime(conn, database, RUNTIME_USER, password)
    finally:
        conn.close()
    _save(instance)
    return instance


def main(argv: list[str] | None = None) -> None:
    import argparse

    parser = argparse.ArgumentParser(prog="python -m orbit_devdb")
    parser.add_argument("action", choices=["start", "stop", "url"])
    parser.add_argument("--dir", required=True, type=Path)
    parser.add_argument("--database", default="")
    args = parser.parse_args(argv)
    if args.action == "start":
        print(start(args.dir).url(args.database))
    elif args.action == "url":
        instance = load(args.dir.resolve())
        if instance is None:
            raise SystemExit("no instance")
        print(instance.url(args.database))
    else:
        stop(args.dir)
