"""What the peers need on the machine, installed and started by the bench itself.

- The peers' Python packages go into a virtualenv of their own under
  ``~/.cache/orbit-bench-peers`` (``ORBIT_BENCH_PEERS_CACHE`` overrides it), created once per
  interpreter version and requirement list; Orbit's ``.venv`` never gets them.
- PostgreSQL and RabbitMQ come from apt-get when their binaries are missing (as root; otherwise
  the error says what to install). Each runs privately in a temporary directory on ports of its
  own, as the package's system user when the bench runs as root (PostgreSQL refuses root), with
  durable settings: PostgreSQL with ``fsync=on``, ``synchronous_commit=on`` and
  ``full_page_writes=on``; RabbitMQ as it ships (a durable queue and persistent messages are
  written to disk before a publisher confirm).
"""

from __future__ import annotations

import os
import secrets
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.common import free_port

REQUIREMENTS = ("pgqueuer==1.6.0", "asyncpg==0.32.0", "celery==5.7.0")


class PeerSetupError(RuntimeError):
    pass


def _cache() -> Path:
    return Path(os.environ.get("ORBIT_BENCH_PEERS_CACHE", "~/.cache/orbit-bench-peers")
                ).expanduser()


def peers_python() -> str:
    """The peers' interpreter: a virtualenv with :data:`REQUIREMENTS`, made on first use."""
    venv = _cache() / f"venv-py{sys.version_info.major}{sys.version_info.minor}"
    python = venv / "bin" / "python"
    stamp = venv / "orbit-requirements.txt"
    wanted = "\n".join(REQUIREMENTS) + "\n"
    if python.exists() and stamp.exists() and stamp.read_text() == wanted:
        return str(python)
    venv.parent.mkdir(parents=True, exist_ok=True)
    subprocess.run([sys.executable, "-m", "venv", "--clear", str(venv)], check=True)
    subprocess.run([str(python), "-m", "pip", "install", "--quiet", *REQUIREMENTS], check=True)
    stamp.write_text(wanted)
    return str(python)


def _apt_install(package: str) -> None:
    if os.geteuid() != 0:
        raise PeerSetupError(f"{package} is not installed; install it (apt-get install -y"
                             f" {package}) or run the bench as root")
    env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
    install = ["apt-get", "install", "-y", "--no-install-recommends", package]
    if subprocess.run(install, env=env, capture_output=True, check=False).returncode != 0:
        subprocess.run(["apt-get", "update"], env=env, capture_output=True, check=True)
        subprocess.run(install, env=env, capture_output=True, check=True)


def _ensure(find: Callable[[], Path | None], package: str) -> Path:
    found = find()
    if found is None:
        _apt_install(package)
        found = find()
    if found is None:
        raise PeerSetupError(f"{package} installed but its binary was not found")
    return found


def _postgres_bin() -> Path | None:
    """The newest PostgreSQL server's bin directory (Debian keeps one per major version)."""
    found = sorted(Path("/usr/lib/postgresql").glob("*/bin/initdb"),
                   key=lambda p: int(p.parts[-3]) if p.parts[-3].isdigit() else 0)
    if found:
        return found[-1].parent
    initdb = shutil.which("initdb")
    return Path(initdb).resolve().parent if initdb else None


def _rabbitmq_bin() -> Path | None:
    """The directory of ``rabbitmq-server`` itself (not Debian's wrapper, which ``su``s to the
    system node's user and directory)."""
    debian = Path("/usr/lib/rabbitmq/bin")
    if (debian / "rabbitmq-server").exists():
        return debian
    server = shutil.which("rabbitmq-server")
    return Path(server).parent if server else None


def _private_dir(owner: str) -> tuple[Path, list[str]]:
    """A fresh directory for a server and the argv prefix that runs a command as ``owner``
    (root only; otherwise the bench's own user runs the server)."""
    root = Path(tempfile.mkdtemp(prefix=f"orbit-bench-peers-{owner}-"))
    if os.geteuid() != 0:
        return root, []
    shutil.chown(root, owner, owner)
    return root, ["runuser", "-u", owner, "--"]


def _env_argv(env: dict[str, str]) -> list[str]:
    return ["env", *(f"{name}={value}" for name, value in env.items())]


def _wait_port(port: int, timeout: float) -> None:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            with socket.create_connection(("127.0.0.1", port), timeout=1):
                return
        except OSError:
            time.sleep(0.2)
    raise PeerSetupError(f"nothing listens on 127.0.0.1:{port} after {timeout} s")


class Postgres:
    """A private PostgreSQL cluster (``initdb`` in a temporary directory, its own port)."""

    def __init__(self) -> None:
        self.bin = _ensure(_postgres_bin, "postgresql")
        self.root, self.as_owner = _private_dir("postgres")
        self.data = self.root / "data"
        self.port = free_port()
        try:
            self._start()
        except BaseException:
            self.stop()
            raise

    def _start(self) -> None:
        self._run([str(self.bin / "initdb"), "-D", str(self.data), "-A", "trust", "-U",
                   "postgres", "-E", "UTF8"])
        settings = {
            "listen_addresses": "'127.0.0.1'", "port": str(self.port),
            "unix_socket_directories": f"'{self.root}'",
            # Durable, as shipped; stated so that no local default can weaken it.
            "fsync": "on", "synchronous_commit": "on", "full_page_writes": "on",
            "shared_buffers": "'1GB'",  # the MariaDB instance's buffer pool is 1G as well
            "max_connections": "100",
        }
        with (self.data / "postgresql.conf").open("a") as conf:
            conf.writelines(f"{name} = {value}\n" for name, value in settings.items())
        self._run([str(self.bin / "pg_ctl"), "-D", str(self.data), "-l",
                   str(self.root / "server.log"), "-w", "-t", "120", "start"])

    def _run(self, argv: list[str]) -> None:
        subprocess.run([*self.as_owner, *argv], check=True, capture_output=True)

    def dsn(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def sql(self, statement: str) -> str:
        """One statement through ``psql`` (as the cluster's superuser); its unaligned output."""
        return subprocess.run([str(self.bin / "psql"), self.dsn(), "-tAc", statement],
                              check=True, capture_output=True, text=True).stdout.strip()

    def stop(self) -> None:
        subprocess.run([*self.as_owner, str(self.bin / "pg_ctl"), "-D", str(self.data), "-m",
                        "fast", "-w", "stop"], check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)


class RabbitMQ:
    """A private RabbitMQ node: its own node name, AMQP, distribution and epmd ports, and its
    mnesia, log and cookie in a temporary directory."""

    def __init__(self) -> None:
        self.bin = _ensure(_rabbitmq_bin, "rabbitmq-server")
        self.root, self.as_owner = _private_dir("rabbitmq")
        self.port = free_port()
        self.node = f"orbitpeers{secrets.token_hex(3)}@localhost"
        config = self.root / "rabbitmq.conf"
        config.write_text(f"listeners.tcp.default = 127.0.0.1:{self.port}\n")
        if self.as_owner:
            shutil.chown(config, "rabbitmq", "rabbitmq")
        self.env = {
            "HOME": str(self.root),  # the Erlang cookie
            "RABBITMQ_NODENAME": self.node, "RABBITMQ_NODE_IP_ADDRESS": "127.0.0.1",
            "RABBITMQ_NODE_PORT": str(self.port), "RABBITMQ_DIST_PORT": str(free_port()),
            "ERL_EPMD_PORT": str(free_port()),
            "RABBITMQ_MNESIA_BASE": str(self.root / "mnesia"),
            "RABBITMQ_LOG_BASE": str(self.root / "log"),
            "RABBITMQ_CONFIG_FILE": str(config),
            "RABBITMQ_ENABLED_PLUGINS_FILE": str(self.root / "enabled_plugins"),
            "RABBITMQ_PID_FILE": str(self.root / "rabbitmq.pid"),
        }
        with (self.root / "server.log").open("wb") as log:
            self.process = subprocess.Popen(
                [*self.as_owner, *_env_argv(self.env), str(self.bin / "rabbitmq-server")],
                stdout=log, stderr=subprocess.STDOUT, cwd=str(self.root))
        try:
            _wait_port(self.port, 120)
            self._ctl("await_startup")
        except BaseException:
            self.stop()
            raise

    def _ctl(self, *args: str) -> None:
        subprocess.run([*self.as_owner, *_env_argv(self.env), str(self.bin / "rabbitmqctl"),
                        "-n", self.node, *args], check=True, capture_output=True, timeout=120)

    def version(self) -> str:
        return subprocess.run(
            [*self.as_owner, *_env_argv(self.env), str(self.bin / "rabbitmqctl"), "-n",
             self.node, "version"], check=True, capture_output=True, text=True, timeout=120
        ).stdout.strip()

    @property
    def url(self) -> str:
        return f"amqp://guest:guest@127.0.0.1:{self.port}//"

    def stop(self) -> None:
        if self.process.poll() is None:
            try:
                self._ctl("stop")
            except (subprocess.SubprocessError, OSError):
                self.process.terminate()
            try:
                self.process.wait(timeout=60)
            except subprocess.TimeoutExpired:
                self.process.kill()
        epmd = shutil.which("epmd") or next(
            (str(p) for p in Path("/usr/lib/erlang").glob("erts-*/bin/epmd")), None)
        if epmd:  # the node's private epmd outlives it
            subprocess.run([*self.as_owner, epmd, "-port", self.env["ERL_EPMD_PORT"], "-kill"],
                           check=False, capture_output=True)
        shutil.rmtree(self.root, ignore_errors=True)
