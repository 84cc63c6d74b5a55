"""``orbit dev``: the local stack.

``orbit dev up`` starts Orbit's private database (unless ``ORBIT_DATABASE_URL`` is set), applies
migrations, bootstraps once (``.orbit/bootstrap.json``, mode 0600) and runs every daemon as a
supervised child process until Ctrl-C, restarting a daemon that dies. State lives in ``.orbit/``
and survives a restart. Webhooks work out of the box: unless ``ORBIT_DELIVERY_SECRET_KEY`` is
set, a key made on first use is kept in ``.orbit/delivery.key`` (mode 0600; the API and the pump
share it), and unless set otherwise loopback and ``http://`` endpoints are allowed (a receiver on
this machine). On the private database the migrations run as the instance's
administrator and the bootstrap and the daemons as the least-privileged runtime user
(``orbit_devdb.RUNTIME_USER``: rows only, no DDL); with ``ORBIT_DATABASE_URL`` everything uses
that URL.

``orbit dev up --examples`` (``script/server --examples``) also runs the workflow examples of the
source checkout once the API is ready: each example's ``setup`` (its queues, definition and
latest version, as the bootstrap's credential; each is idempotent) and then its worker as one more
supervised child process (``python -m examples.<name> worker``, restarted like a daemon). On
Ctrl-C the example workers drain first, then the daemons stop.
"""

from __future__ import annotations

import functools
import json
import os
import signal
import subprocess
import sys
import time
import urllib.error
import urllib.request
from collections.abc import Callable
from pathlib import Path
from typing import Any

import attrs
import click

import orbit_devdb as devdb
from orbit_cli.files import write_secret_file
from orbit_common.db import migrator
from orbit_common.db.pool import DatabaseUrl

# Every daemon that exists today; later capabilities add theirs.
DAEMONS = ("api", "dispatcher", "scheduler", "delivery", "weave")
# The workflow examples ``--examples`` runs (packages under examples/ with ``setup`` and
# ``worker`` commands): an order with a parallel block, a payment with a signal and a poll, a
# transfer whose settlement is polled.
EXAMPLES = ("order_workflow", "payment_confirmation", "settlement_poll")
SETUP_TIMEOUT_S = 60.0


@click.group()
def dev() -> None:
    """The local development stack."""


@dev.group("db")
def dev_db() -> None:
    """Orbit's private database instance."""


@dev_db.command("start")
@click.option("--dir", "root", default=".orbit/mysql", type=click.Path(path_type=Path))
@click.option("--database", default="orbit")
def db_start(root: Path, database: str) -> None:
    """Start (initialising on first use) the private instance; prints its URL."""
    try:
        devdb.database_identifier(database)  # refused before the instance is even started
    except devdb.InvalidName as exc:
        raise click.BadParameter(str(exc), param_hint="--database") from exc
    instance = devdb.start(root)
    devdb.create_database(instance, database)
    click.echo(instance.url(database))


@dev_db.command("stop")
@click.option("--dir", "root", default=".orbit/mysql", type=click.Path(path_type=Path))
def db_stop(root: Path) -> None:
    devdb.stop(root)


def _wait_http(url: str, timeout_s: float) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        try:
            with urllib.request.urlopen(url, timeout=2) as response:  # noqa: S310 - loopback
                if response.status == 200:
                    return True
        except (urllib.error.URLError, ConnectionError, TimeoutError):
            pass
        time.sleep(0.2)
    return False


@dev.command("up")
@click.option("--dir", "root", default=".orbit", type=click.Path(path_type=Path),
              show_default=True, help="State directory of the local stack.")
@click.option("--api-port", type=int, default=lambda: int(os.environ.get("ORBIT_API_PORT", "8080")),
              show_default="8080 or $ORBIT_API_PORT")
@click.option("--dispatcher-port", type=int,
              default=lambda: int(os.environ.get("ORBIT_DISPATCHER_PORT", "0")) or None,
              show_default="API port + 1 or $ORBIT_DISPATCHER_PORT")
@click.option("--operator-port", type=int,
              default=lambda: int(os.environ.get("ORBIT_SERVICE_METRICS_PORT", "0")),
              show_default="0 or $ORBIT_SERVICE_METRICS_PORT",
              help="First operator-listener port (/metrics, detailed /readyz): the API gets it, "
                   "the next daemons the ports after it; 0 lets each daemon pick a free one.")
@click.option("--examples", is_flag=True,
              help="Also set up the workflow examples (" + ", ".join(EXAMPLES) + ") and run "
                   "their workers under the supervisor (needs the source checkout).")
def dev_up(root: Path, api_port: int, dispatcher_port: int | None, operator_port: int,
           examples: bool) -> None:
    """Run the whole stack locally until Ctrl-C."""
    source = examples_source() if examples else None
    root = root.resolve()
    root.mkdir(parents=True, exist_ok=True)
    instance: devdb.Instance | None = None
    url = runtime_url = os.environ.get("ORBIT_DATABASE_URL", "")
    if not url:
        click.echo(f"starting the private database in {root / 'mysql'} …")
        instance = devdb.start(root / "mysql")
    try:
        if instance is not None:
            devdb.create_database(instance, "orbit")
            instance = devdb.ensure_runtime_user(instance, "orbit")
            url, runtime_url = instance.url("orbit"), instance.runtime_url("orbit")
        parsed = DatabaseUrl.parse(url)
        click.echo(f"database: {parsed.render()}")
        if runtime_url != url:
            click.echo(f"daemons:  {DatabaseUrl.parse(runtime_url).render()} "
                       f"({devdb.RUNTIME_PRIVILEGES} only)")
        applied = migrator.Migrator(parsed).up(log=click.echo)
        click.echo(f"migrations: applied {len(applied)}" if applied else "migrations: up to date")
        api_url = f"http://127.0.0.1:{api_port}"
        ports = Ports(api=api_port, dispatcher=dispatcher_port or api_port + 1,
                      operator=operator_port)
        _bootstrap_once(root, runtime_url, api_url, ports.dispatcher_url)
        _supervise(root, runtime_url, ports, source)
    finally:
        if instance is not None:
            click.echo("stopping the private database …")
            devdb.stop(root / "mysql")


@attrs.frozen
class Ports:
    api: int
    dispatcher: int
    operator: int = 0  # the first operator-listener port; 0: each daemon picks a free one

    def operator_port(self, daemon: str) -> int:
        return self.operator + DAEMONS.index(daemon) if self.operator else 0

    @property
    def api_url(self) -> str:
        return f"http://127.0.0.1:{self.api}"

    @property
    def dispatcher_url(self) -> str:
        return f"http://127.0.0.1:{self.dispatcher}"


def _bootstrap_once(root: Path, url: str, api_url: str, dispatcher_url: str) -> None:
    path = root / "bootstrap.json"
    if path.exists():
        doc = json.loads(path.read_text())
        if doc.get("api_url") != api_url or doc.get("dispatcher_url") != dispatcher_url:
            doc["api_url"] = api_url
            doc["dispatcher_url"] = dispatcher_url
            write_secret_file(path, doc)
        click.echo(f"bootstrap: already done ({path}; namespace {doc.get('namespace')!r})")
        return
    env = {**os.environ, "ORBIT_DATABASE_URL": url}
    result = subprocess.run(
        [sys.executable, "-m", "orbit_cli", "admin", "--actor", "orbit-dev", "bootstrap",
         "--output", str(path), "--api-url", api_url],
        env=env, capture_output=True, text=True, check=False,
    )
    if result.returncode != 0:
        raise click.ClickException(
            f"bootstrap failed: {result.stderr.strip()}\nIf the database was bootstrapped "
            "before without .orbit/bootstrap.json, create a credential with "
            "`orbit admin credential create`."
        )
    doc = json.loads(path.read_text())
    doc["dispatcher_url"] = dispatcher_url
    write_secret_file(path, doc)
    click.echo("bootstrap: created application, namespace and an all-access API key:")
    click.echo(f"  api_key   = {doc['api_key']}   (shown once; saved in {path}, mode 0600)")
    click.echo(f"  namespace = {doc['namespace']}")


def _spawn(name: str, env: dict[str, str], ports: Ports) -> subprocess.Popen[Any]:
    env = {**env, "ORBIT_SERVICE_METRICS_PORT": str(ports.operator_port(name))}
    return subprocess.Popen([sys.executable, "-m", "orbit_cli", name], env=env)


def _operator_note(ports: Ports) -> str:
    if not ports.operator:
        return "each daemon's operator listener on a free port (see its log)"
    return ", ".join(f"{name} http://127.0.0.1:{ports.operator_port(name)}/metrics"
                     for name in DAEMONS)


def _console_note(root: Path) -> str:
    """How to get into the console: the set-password command for the bootstrap credential."""
    try:
        prefix = json.loads((root / "bootstrap.json").read_text()).get("credential_prefix", "")
    except (OSError, ValueError):
        prefix = ""
    return ("first time: orbit admin console set-password --credential "
            f"{prefix or '<credential prefix>'}; docs/runbooks/console-admin.md")


def delivery_env(root: Path, environ: dict[str, str]) -> dict[str, str]:
    """The [delivery] settings of the local stack: the sealing key (made once, kept in
    ``root/delivery.key``) and loopback http endpoints, each unless the environment sets it."""
    from orbit_common.model.sealing import new_key_text

    env: dict[str, str] = {}
    if not environ.get("ORBIT_DELIVERY_SECRET_KEY"):
        path = root / "delivery.key"
        if not path.exists():
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
            with os.fdopen(fd, "w") as out:
                out.write(new_key_text() + "\n")
        env["ORBIT_DELIVERY_SECRET_KEY"] = path.read_text().strip()
    for name in ("ORBIT_DELIVERY_ALLOW_LOOPBACK", "ORBIT_DELIVERY_ALLOW_HTTP"):
        if not environ.get(name):
            env[name] = "true"
    return env


def examples_source() -> Path:
    """The source checkout holding ``examples/`` (this package's parent directory): the
    examples are not installed with Orbit."""
    source = Path(__file__).resolve().parents[1]
    missing = [name for name in EXAMPLES
               if not (source / "examples" / name / "__main__.py").is_file()]
    if missing:
        raise click.ClickException(
            f"--examples needs the source checkout: no examples/{missing[0]} under {source}")
    return source


def example_env(source: Path, root: Path, ports: Ports, environ: dict[str, str]
                ) -> dict[str, str]:
    """The environment of the examples' commands: the local API and dispatcher, the
    bootstrap's key and namespace (``root/bootstrap.json``), the checkout on the path."""
    doc = json.loads((root / "bootstrap.json").read_text())
    path = environ.get("PYTHONPATH")
    return {**{k: v for k, v in environ.items() if not k.startswith("ORBIT_")},
            "ORBIT_API_URL": ports.api_url, "ORBIT_DISPATCHER_URL": ports.dispatcher_url,
            "ORBIT_API_KEY": doc["api_key"], "ORBIT_NAMESPACE": doc["namespace"],
            "PYTHONPATH": str(source) if not path else f"{source}{os.pathsep}{path}"}


def setup_example(name: str, source: Path, env: dict[str, str]) -> str | None:
    """Run ``python -m examples.<name> setup`` once the API is ready (the caller waits on
    ``/readyz``), at most ``SETUP_TIMEOUT_S``: its output line, or None (said on the console;
    nothing is retried blindly -- a setup that fails against a ready API fails again)."""
    try:
        done = subprocess.run([sys.executable, "-m", f"examples.{name}", "setup"],
                              cwd=source, env=env, capture_output=True, text=True,
                              timeout=SETUP_TIMEOUT_S, check=False)
    except subprocess.TimeoutExpired:
        failure = f"setup did not finish within {SETUP_TIMEOUT_S:.0f} s"
    else:
        if done.returncode == 0:
            return done.stdout.strip()
        failure = done.stderr.strip()[-2000:]
    click.echo(f"example {name}: setup failed, its worker is not started:\n{failure}")
    return None


def _spawn_example(name: str, source: Path, env: dict[str, str]) -> subprocess.Popen[Any]:
    return subprocess.Popen([sys.executable, "-m", f"examples.{name}", "worker"], cwd=source,
                            env=env)


def _stop(children: dict[str, subprocess.Popen[Any]]) -> None:
    """SIGTERM to each running child (they drain), then wait; kill after 40 s."""
    for child in children.values():
        if child.poll() is None:
            child.send_signal(signal.SIGTERM)
    for child in children.values():
        try:
            child.wait(timeout=40)
        except subprocess.TimeoutExpired:
            child.kill()


def _restart_exited(group: dict[str, subprocess.Popen[Any]],
                    spawners: dict[str, Callable[[], subprocess.Popen[Any]]],
                    restarts: dict[str, int], due: dict[str, float]) -> None:
    """Restart the children of ``group`` that exited, each after a growing delay kept as a due
    time (``due``), so the supervisor goes on watching the others and Ctrl-C meanwhile."""
    now = time.monotonic()
    for name, child in list(group.items()):
        code = child.poll()
        if code is None:
            continue
        if name not in due:
            restarts[name] += 1
            delay = min(30, 2 ** min(restarts[name], 5))
            click.echo(f"{name} exited with {code}; restarting in {delay}s")
            due[name] = now + delay
        elif now >= due[name]:
            del due[name]
            group[name] = spawners[name]()


def _supervise(root: Path, url: str, ports: Ports, examples: Path | None = None) -> None:
    """Run the daemons (and, with ``examples``, the examples' workers) until SIGINT/SIGTERM,
    restarting a child that exits with a growing delay."""
    api_url = ports.api_url
    env = {**os.environ, "ORBIT_DATABASE_URL": url, "ORBIT_API_PORT": str(ports.api),
           "ORBIT_DISPATCHER_PORT": str(ports.dispatcher),
           **delivery_env(root, dict(os.environ))}
    stopping = False

    def request_stop(_signum: int, _frame: Any) -> None:
        nonlocal stopping
        stopping = True

    previous = {s: signal.signal(s, request_stop) for s in (signal.SIGINT, signal.SIGTERM)}
    spawners: dict[str, Callable[[], subprocess.Popen[Any]]] = {
        name: functools.partial(_spawn, name, env, ports) for name in DAEMONS}
    children = {name: spawn() for name, spawn in spawners.items()}
    workers: dict[str, subprocess.Popen[Any]] = {}
    restarts = dict.fromkeys(DAEMONS, 0)
    try:
        if _wait_http(f"{api_url}/readyz", 30):
            click.echo(f"\nOrbit is up.\n  API:    {api_url}  (try: curl -H 'Authorization: "
                       f"Bearer <api_key>' {api_url}/v1/whoami)\n"
                       f"  console: {api_url}/console/  ({_console_note(root)})\n"
                       f"  health: {api_url}/readyz\n"
                       f"  workers: {ports.dispatcher_url}  (docs/api/worker.md)\n"
                       f"  metrics: {_operator_note(ports)}\n"
                       f"  webhooks: loopback http endpoints allowed; key in"
                       f" {root / 'delivery.key'} unless ORBIT_DELIVERY_SECRET_KEY is set\n"
                       f"  key:    {root / 'bootstrap.json'}\nPress Ctrl-C to stop.")
            if examples is not None:
                example_environ = example_env(examples, root, ports, dict(os.environ))
                for name in EXAMPLES:
                    if stopping:
                        break
                    done = setup_example(name, examples, example_environ)
                    if done is not None:
                        click.echo(f"example {name}: set up {done}; worker started")
                        key = f"example:{name}"
                        spawners[key] = functools.partial(_spawn_example, name, examples,
                                                          example_environ)
                        workers[key] = spawners[key]()
                        restarts[key] = 0
        else:
            click.echo("warning: the API did not become ready within 30 s; see its logs above")
        due: dict[str, float] = {}
        while not stopping:
            for group in (children, workers):
                _restart_exited(group, spawners, restarts, due)
            time.sleep(0.2)
    finally:
        _stop(workers)  # first, while the dispatcher still takes their last reports
        _stop(children)
        for s, handler in previous.items():
            signal.signal(s, handler)


__all__ = ["dev"]
