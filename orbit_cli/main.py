"""The ``orbit`` command (and its ``orbit-migrate`` / ``orbit-admin`` aliases)."""

from __future__ import annotations

import asyncio
import getpass
import json
import socket
import sys
from collections.abc import Awaitable, Callable
from pathlib import Path
from typing import Any, TypeVar

import click
import pymysql

from orbit_cli.files import write_secret_file
from orbit_common import errors
from orbit_common.db import migrator
from orbit_common.db.pool import Database, DatabaseUrl, open_database
from orbit_common.model import ids, jsondoc
from orbit_common.platform import admin as admin_tx
from orbit_common.platform import authz, commands
from orbit_common.platform import console as console_tx
from orbit_common.platform.audit import Actor
from orbit_common.platform.namespaces import NamespaceState
from orbit_common.pulse import control, queries, quotas
from orbit_common.relay import operator as relay_operator
from orbit_common.relay.model import BUDGET_ADD_MAX, SubscriptionState
from orbit_common.service.config import ConfigError, OrbitConfig, load_config
from orbit_common.weave import controls as weave_controls
from orbit_common.weave import instance_tasks as weave_instance_tasks
from orbit_common.weave import instances as weave_instances
from orbit_common.weave import operator as weave_operator
from orbit_common.weave import recovery as weave_recovery
from orbit_common.weave import signals as weave_signals
from orbit_common.weave import stops as weave_stops
from orbit_common.weave import timeline as weave_timeline
from orbit_common.weave import wait_recovery

T = TypeVar("T")


def _config(ctx: click.Context) -> OrbitConfig:
    obj = ctx.ensure_object(dict)
    if "config" not in obj:
        try:
            obj["config"] = load_config(obj.get("config_path"))
        except ConfigError as exc:
            raise click.ClickException(str(exc)) from exc
    config: OrbitConfig = obj["config"]
    return config


def _url(ctx: click.Context) -> DatabaseUrl:
    try:
        return _config(ctx).database.parsed()
    except (ConfigError, ValueError) as exc:
        raise click.ClickException(str(exc)) from exc


def _default_actor() -> str:
    return f"{getpass.getuser()}@{socket.gethostname()}"


def _with_db(ctx: click.Context, fn: Callable[[Database], Awaitable[T]]) -> T:
    async def main() -> T:
        db = await open_database(_url(ctx), minsize=1, maxsize=2)
        try:
            return await fn(db)
        finally:
            await db.close()

    try:
        return asyncio.run(main())
    except errors.OrbitError as exc:
        raise click.ClickException(f"{exc.code}: {exc.detail}") from exc


def _echo_json(value: Any) -> None:
    click.echo(json.dumps(value, ensure_ascii=False, indent=2))


@click.group()
@click.option("--config", "config_path", type=click.Path(path_type=Path, dir_okay=False),
              help="TOML configuration file (default: $ORBIT_CONFIG).")
@click.pass_context
def cli(ctx: click.Context, config_path: Path | None) -> None:
    """Orbit: reliable task execution and workflow orchestration."""
    ctx.ensure_object(dict)["config_path"] = config_path


# --- migrations ------------------------------------------------------------------------------


@cli.group()
def migrate() -> None:
    """Apply or inspect schema migrations (docs/runbooks/migrations.md)."""


@migrate.command("up")
@click.option("--lock-timeout", default=120, show_default=True,
              help="Seconds to wait for another migrator to finish.")
@click.pass_context
def migrate_up(ctx: click.Context, lock_timeout: int) -> None:
    """Apply every pending migration (one migrator at a time; refuses when dirty)."""
    m = migrator.Migrator(_url(ctx), lock_timeout_s=lock_timeout)
    try:
        applied = m.up(log=click.echo)
    except migrator.MigrationError as exc:
        raise click.ClickException(str(exc)) from exc
    except pymysql.err.MySQLError as exc:  # unreachable server, missing privilege, …
        raise click.ClickException(f"database error: {exc}") from exc
    click.echo(f"applied {len(applied)} migration(s)" if applied else "schema is up to date")


@migrate.command("status")
@click.option("--json", "as_json", is_flag=True, help="Machine-readable output.")
@click.pass_context
def migrate_status(ctx: click.Context, as_json: bool) -> None:
    """List migrations and their state; exits 1 when any is dirty, edited, missing or pending.

    ``ahead`` (applied by a newer version, unknown to this one) is reported but not an error.
    """
    try:
        entries = migrator.Migrator(_url(ctx)).status()
    except pymysql.err.MySQLError as exc:
        raise click.ClickException(f"database error: {exc}") from exc
    if as_json:
        _echo_json([{"id": e.id, "status": e.status.value, "detail": e.detail,
                     "finished_at": e.finished_at.isoformat() if e.finished_at else None}
                    for e in entries])
    else:
        for e in entries:
            when = e.finished_at.isoformat(sep=" ", timespec="seconds") if e.finished_at else ""
            click.echo(f"{e.status.value:8} {e.id:40} {when} {e.detail}".rstrip())
    if any(e.status not in {migrator.Status.APPLIED, migrator.Status.AHEAD} for e in entries):
        sys.exit(1)


@migrate.command("manifest")
@click.option("--write", is_flag=True, help="Rewrite migrations/CHECKSUMS (new migrations only).")
def migrate_manifest(write: bool) -> None:
    """Check (or, for a new migration, write) the committed checksum manifest."""
    directory = migrator.migrations_dir()
    files = migrator.discover(directory)
    problems = migrator.check_manifest(files, directory)
    if write:
        recorded = migrator.read_manifest(directory)
        edited = [f.path.name for f in files
                  if f.path.name in recorded and recorded[f.path.name] != f.checksum]
        if edited:
            raise click.ClickException(
                f"refusing to rewrite: {edited} changed after being recorded; "
                "applied migrations are immutable"
            )
        (directory / migrator.MANIFEST).write_text(migrator.render_manifest(files))
        click.echo(f"wrote {migrator.MANIFEST} with {len(files)} entries")
        return
    for problem in problems:
        click.echo(problem)
    if problems:
        sys.exit(1)
    click.echo("manifest matches")


# --- administration --------------------------------------------------------------------------


@cli.group()
@click.option("--actor", default=_default_actor, show_default="user@host",
              help="Operator identity recorded in the audit log.")
@click.pass_context
def admin(ctx: click.Context, actor: str) -> None:
    """Applications, namespaces, credentials, the dispatch freeze, worker sessions, result
    subscriptions, tasks (read only) and workflows."""
    ctx.ensure_object(dict)["actor"] = Actor.operator(actor)


def _actor(ctx: click.Context) -> Actor:
    actor: Actor = ctx.ensure_object(dict)["actor"]
    return actor


def _grants(raw: str | None) -> tuple[authz.Grant, ...]:
    if raw is None:
        return authz.ALL_ACCESS
    try:
        # Strict like the API: a repeated key ({"namespaces": [..], "namespaces": ["*"]}) must not
        # silently widen a grant to its last value.
        return authz.parse_grants(jsondoc.loads_strict(raw))
    except errors.BadRequest as exc:
        raise click.BadParameter(f"{exc.code}: {exc.detail}", param_hint="--grants") from exc
    except authz.GrantError as exc:
        raise click.BadParameter(str(exc), param_hint="--grants") from exc


@admin.command("bootstrap")
@click.option("--application", default="default", show_default=True)
@click.option("--namespace", default="default", show_default=True)
@click.option("--credential", default="bootstrap", show_default=True)
@click.option("--output", type=click.Path(path_type=Path, dir_okay=False),
              help="Also write the result (with the API key) to this file, mode 0600.")
@click.option("--api-url", default="", help="Recorded as api_url in --output.")
@click.pass_context
def admin_bootstrap(  # noqa: PLR0917 - one parameter per click option
    ctx: click.Context, application: str, namespace: str, credential: str,
    output: Path | None, api_url: str,
) -> None:
    """Create an application, a namespace and an all-access credential; prints the key once."""
    result = _with_db(ctx, lambda db: commands.bootstrap(
        db, application=application, namespace=namespace, credential=credential,
        actor=_actor(ctx)))
    doc = {
        "api_url": api_url,
        "api_key": result.issued.api_key,
        "application": result.application.name,
        "namespace": result.namespace.name,
        "credential_prefix": result.issued.credential.prefix,
    }
    if output is not None:
        write_secret_file(output, doc)
    _echo_json(doc)


@admin.group("app")
def admin_app() -> None:
    """Applications."""


@admin_app.command("create")
@click.argument("name")
@click.pass_context
def app_create(ctx: click.Context, name: str) -> None:
    app = _with_db(ctx, lambda db: admin_tx.create_application(db, name=name, actor=_actor(ctx)))
    _echo_json(app.summary())


@admin_app.command("list")
@click.pass_context
def app_list(ctx: click.Context) -> None:
    for app in _with_db(ctx, admin_tx.list_applications):
        click.echo(f"{app.id.hex()}  {app.state.value:8}  {app.name}")


@admin_app.command("disable")
@click.argument("name")
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.pass_context
def app_disable(ctx: click.Context, name: str, reason: str) -> None:
    """Disable an application: all its credentials stop working at once."""
    app = _with_db(ctx, lambda db: admin_tx.disable_application(
        db, name=name, actor=_actor(ctx), reason=reason))
    _echo_json(app.summary())


@admin_app.group("resources")
def app_resources() -> None:
    """The application's shared quotas (docs/flow-control.md)."""


UNLIMITED = "none"


class LimitType(click.ParamType[int | str]):
    """A limit: a positive integer, or ``none`` (unlimited, returned as :data:`UNLIMITED`)."""

    name = "N|none"

    def convert(self, value: Any, param: click.Parameter | None,
                ctx: click.Context | None) -> int | str:
        if isinstance(value, int):
            return value
        text = str(value).strip().lower()
        if text in {"none", "null", "unlimited"}:
            return UNLIMITED
        if not (text.isascii() and text.isdigit() and len(text) <= 10):
            self.fail(f"{value!r} is neither a positive integer nor 'none'", param, ctx)
        return int(text)


LIMIT = LimitType()


@app_resources.command("show")
@click.argument("name")
@click.pass_context
def app_resources_show(ctx: click.Context, name: str) -> None:
    """Limits, counters and the start window of application NAME."""
    _echo_json(_with_db(ctx, lambda db: quotas.operator_show(db, application=name)))


@app_resources.command("set")
@click.argument("name")
@click.option("--max-unfinished-tasks", type=LIMIT,
              help="Unfinished tasks of all namespaces together ('none': unlimited).")
@click.option("--max-active-attempts", type=LIMIT,
              help="Attempts OFFERED or RUNNING together ('none': unlimited).")
@click.option("--max-reserved-attempts", type=LIMIT,
              help="Attempts granted and not yet started ('none': unlimited).")
@click.option("--max-starts-per-second", type=LIMIT,
              help="Start approvals per second together ('none': unlimited).")
@click.option("--revision", type=click.IntRange(min=1), default=None,
              help="Change only if the resources are still at this revision (compare-and-set)."
              " Default: the revision read in the same transaction.")
@click.option("--reason", default=None, help="Why; recorded in the audit log.")
@click.pass_context
def app_resources_set(  # noqa: PLR0917 - one parameter per click option
    ctx: click.Context, name: str, max_unfinished_tasks: int | str | None,
    max_active_attempts: int | str | None, max_reserved_attempts: int | str | None,
    max_starts_per_second: int | str | None, revision: int | None,
    reason: str | None,
) -> None:
    """Change the limits of application NAME; options left out keep their value.

    Lowering a limit below the current usage is allowed: it refuses new work until usage
    falls, and never deletes tasks or revokes grants.
    """
    given = {"max_unfinished_tasks": max_unfinished_tasks,
             "max_active_attempts": max_active_attempts,
             "max_reserved_attempts": max_reserved_attempts,
             "max_starts_per_second": max_starts_per_second}
    def field(value: int | str | None) -> quotas.Field:
        if value is None:  # left out: unchanged
            return quotas.UNSET
        return None if isinstance(value, str) else value  # "none": unlimited

    patch = quotas.LimitsPatch(**{k: field(v) for k, v in given.items()})
    _echo_json(_with_db(ctx, lambda db: quotas.operator_set(
        db, application=name, actor=_actor(ctx), patch=patch, revision=revision,
        reason=reason)))


@admin.group("namespace")
def admin_namespace() -> None:
    """Namespaces."""


@admin_namespace.command("create")
@click.argument("name")
@click.option("--application", required=True)
@click.option("--description", default="")
@click.pass_context
def namespace_create(ctx: click.Context, name: str, application: str, description: str) -> None:
    ns = _with_db(ctx, lambda db: admin_tx.create_namespace(
        db, name=name, application=application, description=description, actor=_actor(ctx)))
    _echo_json(commands.namespace_view(ns))


@admin_namespace.command("list")
@click.option("--application", required=True)
@click.pass_context
def namespace_list(ctx: click.Context, application: str) -> None:
    for ns in _with_db(ctx, lambda db: admin_tx.list_namespaces(db, application=application)):
        click.echo(f"{ns.id.hex()}  {ns.state.value:8}  {ns.name}")


def _set_namespace_state(ctx: click.Context, name: str, to: NamespaceState,
                         reason: str) -> None:
    ns = _with_db(ctx, lambda db: admin_tx.set_namespace_state(
        db, name=name, to=to, actor=_actor(ctx), reason=reason))
    _echo_json(commands.namespace_view(ns))


@admin_namespace.command("disable")
@click.argument("name")
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.pass_context
def namespace_disable(ctx: click.Context, name: str, reason: str) -> None:
    """Disable a namespace: its API answers namespace_not_found, workers can neither register
    nor claim, its schedules do not fire. Its data are kept; idempotent."""
    _set_namespace_state(ctx, name, NamespaceState.DISABLED, reason)


@admin_namespace.command("enable")
@click.argument("name")
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.pass_context
def namespace_enable(ctx: click.Context, name: str, reason: str) -> None:
    """Enable a disabled namespace again; idempotent."""
    _set_namespace_state(ctx, name, NamespaceState.ACTIVE, reason)


@admin.group("credential")
def admin_credential() -> None:
    """API credentials."""


@admin_credential.command("create")
@click.argument("name")
@click.option("--application", required=True)
@click.option("--grants", help='JSON list, e.g. [{"namespaces":["prod-*"],"actions":["*"]}]. '
              "Default: all access.")
@click.pass_context
def credential_create(ctx: click.Context, name: str, application: str,
                      grants: str | None) -> None:
    """Create a credential; the API key is printed once and stored only as a digest."""
    parsed = _grants(grants)
    issued = _with_db(ctx, lambda db: admin_tx.create_credential(
        db, name=name, application=application, grants=parsed, actor=_actor(ctx)))
    _echo_json({**issued.credential.summary(), "api_key": issued.api_key})


@admin_credential.command("list")
@click.option("--application", required=True)
@click.pass_context
def credential_list(ctx: click.Context, application: str) -> None:
    for c in _with_db(ctx, lambda db: admin_tx.list_credentials(db, application=application)):
        click.echo(f"{c.prefix}  {c.state.value:8}  {c.name}")


@admin_credential.command("revoke")
@click.argument("prefix")
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.pass_context
def credential_revoke(ctx: click.Context, prefix: str, reason: str) -> None:
    """Revoke a credential by its public prefix; it stops working at once."""
    c = _with_db(ctx, lambda db: admin_tx.revoke_credential(
        db, prefix=prefix, actor=_actor(ctx), reason=reason))
    _echo_json(c.summary())


@admin.group("console")
def admin_console() -> None:
    """The operator console's administrator account (docs/runbooks/console-admin.md)."""


@admin_console.command("set-password")
@click.option("--name", help="The administrator's login name: 'admin' when creating it; "
              "given on a reset, it renames the account (default: keep the name).")
@click.option("--credential", "credential_prefix",
              help="Prefix of the API credential the console acts as (required the first "
                   "time; given later, it rebinds the account).")
@click.option("--password-stdin", is_flag=True,
              help="Read the password from the first line of standard input (no prompt).")
@click.pass_context
def console_set_password(ctx: click.Context, name: str | None, credential_prefix: str | None,
                         password_stdin: bool) -> None:
    """Create the console's one administrator, or reset its password.

    bcrypt, cost 12; 12 characters to 72 UTF-8 bytes. Every console session is revoked and the
    login throttle cleared, in the same audited transaction.
    """
    if password_stdin:
        password = sys.stdin.readline().rstrip("\r\n")
    else:
        password = click.prompt("New console password", hide_input=True,
                                confirmation_prompt=True)
    try:
        console_tx.check_password(password)
    except errors.ValidationFailed as exc:
        raise click.BadParameter(exc.errors[0]["message"], param_hint="password") from exc
    summary = _with_db(ctx, lambda db: console_tx.set_password(
        db, name=name, password=password, credential_prefix=credential_prefix,
        actor=_actor(ctx)))
    _echo_json(summary)


@admin.group("dispatch")
def admin_dispatch() -> None:
    """The platform-wide dispatch freeze (docs/runbooks/restore.md)."""


@admin_dispatch.command("status")
@click.pass_context
def dispatch_status(ctx: click.Context) -> None:
    """Whether dispatch is frozen, since when, by whom and why; the last fence-all."""
    _echo_json(_with_db(ctx, control.read).summary())


@admin_dispatch.command("freeze")
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.pass_context
def dispatch_freeze(ctx: click.Context, reason: str) -> None:
    """Stop dispatch everywhere: no claim grants, no start is approved (dispatch_frozen).

    Renewals, finishes, the recovery scan and submits go on. Freezing a frozen platform
    changes nothing.
    """
    controls, changed = _with_db(ctx, lambda db: control.freeze(db, actor=_actor(ctx),
                                                                 reason=reason))
    _echo_json({**controls.summary(), "changed": changed})


@admin_dispatch.command("thaw")
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.pass_context
def dispatch_thaw(ctx: click.Context, reason: str) -> None:
    """Resume dispatch after a freeze."""
    controls, changed = _with_db(ctx, lambda db: control.thaw(db, actor=_actor(ctx),
                                                               reason=reason))
    _echo_json({**controls.summary(), "changed": changed})


@admin.group("sessions")
def admin_sessions() -> None:
    """Worker sessions."""


@admin_sessions.command("fence-all")
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.pass_context
def sessions_fence_all(ctx: click.Context, reason: str) -> None:
    """Fence every worker session and expire every live lease (needs dispatch frozen).

    The recovery scan then decides each task by the usual rules: back to WAITING only when
    re-running is safe, else NEEDS_REVIEW. For after restoring a backup.
    """
    report = _with_db(ctx, lambda db: control.fence_all(db, actor=_actor(ctx), reason=reason))
    _echo_json(report.to_json())


@admin.group("subscriptions")
def admin_subscriptions() -> None:
    """Result subscriptions and their deliveries (docs/runbooks/delivery-backlog.md)."""


@admin_subscriptions.command("list")
@click.option("--namespace", required=True)
@click.option("--after", default="", help="Start after this name.")
@click.option("--limit", type=click.IntRange(1, relay_operator.LIST_MAX), default=100,
              show_default=True)
@click.pass_context
def subscriptions_list(ctx: click.Context, namespace: str, after: str, limit: int) -> None:
    """One JSON line per subscription: name, kind, state, backlog, circuit."""
    for view in _with_db(ctx, lambda db: relay_operator.list_subscriptions(
            db, namespace=namespace, after=after, limit=limit)):
        click.echo(json.dumps({k: view[k] for k in (
            "name", "kind", "state", "backlog", "scan_after_sequence", "circuit", "revision")},
            ensure_ascii=False))


@admin_subscriptions.command("get")
@click.argument("name")
@click.option("--namespace", required=True)
@click.pass_context
def subscriptions_get(ctx: click.Context, name: str, namespace: str) -> None:
    """A subscription (never its secret)."""
    _echo_json(_with_db(ctx, lambda db: relay_operator.get_subscription(
        db, namespace=namespace, name=name)))


def _subscription_state(ctx: click.Context, name: str, namespace: str,
                        target: SubscriptionState, reason: str) -> None:
    _echo_json(_with_db(ctx, lambda db: relay_operator.set_state(
        db, namespace=namespace, name=name, target=target, actor=_actor(ctx), reason=reason)))


@admin_subscriptions.command("pause")
@click.argument("name")
@click.option("--namespace", required=True)
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.pass_context
def subscriptions_pause(ctx: click.Context, name: str, namespace: str, reason: str) -> None:
    """Pause: no scanning, no leasing; the backlog and leases in flight are kept."""
    _subscription_state(ctx, name, namespace, SubscriptionState.PAUSED, reason)


@admin_subscriptions.command("resume")
@click.argument("name")
@click.option("--namespace", required=True)
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.pass_context
def subscriptions_resume(ctx: click.Context, name: str, namespace: str, reason: str) -> None:
    """Resume a paused subscription."""
    _subscription_state(ctx, name, namespace, SubscriptionState.ACTIVE, reason)


@admin_subscriptions.command("disable")
@click.argument("name")
@click.option("--namespace", required=True)
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.pass_context
def subscriptions_disable(ctx: click.Context, name: str, namespace: str, reason: str) -> None:
    """Disable (final): nothing more is scanned or delivered; deliveries and history stay."""
    _subscription_state(ctx, name, namespace, SubscriptionState.DISABLED, reason)


@admin_subscriptions.command("add-budget")
@click.argument("name")
@click.argument("delivery_id")
@click.option("--namespace", required=True)
@click.option("--attempts", type=click.IntRange(1, BUDGET_ADD_MAX), default=1,
              show_default=True)
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.pass_context
def subscriptions_add_budget(  # noqa: PLR0917 - one parameter per click option
    ctx: click.Context, name: str, delivery_id: str, namespace: str, attempts: int,
    reason: str,
) -> None:
    """Give an EXHAUSTED delivery more attempts: PENDING and due now, history kept."""
    try:
        raw_id = ids.from_hex(delivery_id)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="DELIVERY_ID") from exc
    _echo_json(_with_db(ctx, lambda db: relay_operator.add_budget(
        db, namespace=namespace, name=name, delivery_id=raw_id, attempts=attempts,
        actor=_actor(ctx), reason=reason)))


def _echo_document(value: Any) -> None:
    """A view holding stored JSON (definition documents, inputs, results) as JSON."""
    click.echo(json.dumps(json.loads(jsondoc.dumps(value)), ensure_ascii=False, indent=2))


def _echo_line(value: Any) -> None:
    click.echo(jsondoc.dumps(value))


@admin.group("workflows")
def admin_workflows() -> None:
    """Workflow definitions, versions and instances (docs/api/workflows.md); pause, resume and
    cancel of an instance (docs/weave/pause.md, docs/weave/stop.md); manual recovery of held
    steps (docs/weave/recovery.md)."""



def _workflow_control(ctx: click.Context, instance_id: str, namespace: str, reason: str,
                      control_revision: int | None, *, paused: bool) -> None:
    view = _with_db(ctx, lambda db: weave_controls.operator_set_paused(
        db, namespace=namespace, instance_id=instance_id, paused=paused, actor=_actor(ctx),
        reason=reason, control_revision=control_revision))
    _echo_line({k: view[k] for k in ("id", "definition", "version", "state", "paused",
                                     "control_revision", "checkpoints")})


@admin_workflows.command("pause")
@click.argument("instance_id")
@click.option("--namespace", required=True)
@click.option("--reason", required=True, help="Why (kept in the audit record and the event).")
@click.option("--control-revision", type=click.IntRange(min=1),
              help="Only if the instance's control revision is still this one.")
@click.pass_context
def workflows_pause(ctx: click.Context, instance_id: str, namespace: str, reason: str,
                    control_revision: int | None) -> None:
    """Pause an instance: its gate closes (no new grant or start for its tasks), results are
    recorded and parked, nothing advances until the resume (docs/weave/pause.md)."""
    _workflow_control(ctx, instance_id, namespace, reason, control_revision, paused=True)


@admin_workflows.command("resume")
@click.argument("instance_id")
@click.option("--namespace", required=True)
@click.option("--reason", required=True, help="Why (kept in the audit record and the event).")
@click.option("--control-revision", type=click.IntRange(min=1),
              help="Only if the instance's control revision is still this one.")
@click.pass_context
def workflows_resume(ctx: click.Context, instance_id: str, namespace: str, reason: str,
                     control_revision: int | None) -> None:
    """Resume a paused instance: its gate opens and the engine replays the parked checkpoints
    in order, once."""
    _workflow_control(ctx, instance_id, namespace, reason, control_revision, paused=False)


@admin_workflows.command("cancel")
@click.argument("instance_id")
@click.option("--namespace", required=True)
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.option("--control-revision", type=click.IntRange(1), default=None,
              help="Compare-and-set on the instance's control revision (as read).")
@click.pass_context
def workflows_cancel(ctx: click.Context, instance_id: str, namespace: str, reason: str,
                     control_revision: int | None) -> None:
    """Cancel an instance: the stop intent CANCEL, its gate closed for good, its unfinished
    tasks asked to stop; the engine settles it CANCELLED once no step is in flight. Prints the
    instance (STOPPING; unchanged when it was already stopping)."""
    _, view = _with_db(ctx, lambda db: weave_stops.operator_cancel(
        db, namespace=namespace, instance_id=instance_id, reason=reason, actor=_actor(ctx),
        control_revision=control_revision))
    _echo_document(view)


@admin_workflows.group("definitions")
def workflows_definitions() -> None:
    """Workflow definitions and their published versions."""


@workflows_definitions.command("list")
@click.option("--namespace", required=True)
@click.option("--after", default="", help="Start after this name.")
@click.option("--limit", type=click.IntRange(1, 100), default=100, show_default=True)
@click.pass_context
def workflows_definitions_list(ctx: click.Context, namespace: str, after: str,
                               limit: int) -> None:
    """One JSON line per definition: name, revision, latest version."""
    for view in _with_db(ctx, lambda db: weave_operator.list_definitions(
            db, namespace=namespace, after=after, limit=limit)):
        _echo_line({k: view[k] for k in ("name", "revision", "latest_version", "updated_at")})


@workflows_definitions.command("get")
@click.argument("name")
@click.option("--namespace", required=True)
@click.pass_context
def workflows_definitions_get(ctx: click.Context, name: str, namespace: str) -> None:
    """A definition with its versions (number, digest, publisher, time)."""
    _echo_document(_with_db(ctx, lambda db: weave_operator.get_definition(
        db, namespace=namespace, name=name)))


@workflows_definitions.command("version")
@click.argument("name")
@click.argument("version", type=click.IntRange(1, 2**31 - 1))
@click.option("--namespace", required=True)
@click.pass_context
def workflows_definitions_version(ctx: click.Context, name: str, version: int,
                                  namespace: str) -> None:
    """One published version with its document."""
    _echo_document(_with_db(ctx, lambda db: weave_operator.get_version(
        db, namespace=namespace, name=name, version=version)))


@admin_workflows.group("instances")
def workflows_instances() -> None:
    """Workflow instances with their steps and activations."""


@workflows_instances.command("list")
@click.option("--namespace", required=True)
@click.option("--definition", help="Only this definition's instances.")
@click.option("--state", type=click.Choice(weave_instances.STATES))
@click.option("--business-key", help="Only instances with this business key (exact).")
@click.option("--version", type=click.IntRange(1, weave_instances.VERSION_MAX),
              help="Only instances pinned to this version (needs --definition).")
@click.option("--limit", type=click.IntRange(1, weave_instances.LIST_MAX), default=100,
              show_default=True)
@click.pass_context
def workflows_instances_list(  # noqa: PLR0917 - one parameter per click option
    ctx: click.Context, namespace: str, definition: str | None, state: str | None,
    business_key: str | None, version: int | None, limit: int,
) -> None:
    """One JSON line per instance, newest first: id, definition, version, state, key."""
    page = _with_db(ctx, lambda db: weave_operator.list_instances(
        db, namespace=namespace, definition=definition, state=state, business_key=business_key,
        limit=limit, version=version))
    for view in page.items:
        _echo_line({k: view[k] for k in ("id", "definition", "version", "state",
                                         "business_key", "created_at", "completed_at")})


@workflows_instances.command("get")
@click.argument("instance_id")
@click.option("--namespace", required=True)
@click.option("--all-activations", is_flag=True,
              help="Every activation of each step, historical ones too (default: current).")
@click.pass_context
def workflows_instances_get(ctx: click.Context, instance_id: str, namespace: str,
                            all_activations: bool) -> None:
    """An instance with its steps, activations and what each task's result has become."""
    _echo_document(_with_db(ctx, lambda db: weave_operator.get_instance(
        db, namespace=namespace, instance_id=instance_id, all_activations=all_activations)))


@workflows_instances.command("timeline")
@click.argument("instance_id")
@click.option("--namespace", required=True)
@click.option("--newest-first", is_flag=True, help="Newest event first (default: oldest).")
@click.option("--limit", type=click.IntRange(1, weave_timeline.LIMIT_MAX), default=100,
              show_default=True)
@click.pass_context
def workflows_instances_timeline(ctx: click.Context, instance_id: str, namespace: str,
                                 newest_first: bool, limit: int) -> None:
    """One JSON line per event of the instance's timeline (its own and its signals' events)
    in database-time order: a history view, not a consumption watermark."""
    page = _with_db(ctx, lambda db: weave_operator.instance_timeline(
        db, namespace=namespace, instance_id=instance_id,
        order="desc" if newest_first else "asc", limit=limit))
    for view in page.items:
        _echo_line(view)


@workflows_instances.command("waits")
@click.argument("instance_id")
@click.option("--namespace", required=True)
@click.pass_context
def workflows_instances_waits(ctx: click.Context, instance_id: str, namespace: str) -> None:
    """One JSON line per wait of the instance (TIMER and SIGNAL), oldest first: state,
    deadlines, generation, when it fired and how late."""
    for view in _with_db(ctx, lambda db: weave_operator.instance_waits(
            db, namespace=namespace, instance_id=instance_id)):
        _echo_line(view)


@workflows_instances.command("tasks")
@click.argument("instance_id")
@click.option("--namespace", required=True)
@click.option("--limit", type=click.IntRange(1, weave_instance_tasks.LIST_MAX), default=100,
              show_default=True)
@click.pass_context
def workflows_instances_tasks(ctx: click.Context, instance_id: str, namespace: str,
                              limit: int) -> None:
    """One JSON line per task the instance created (task id order): its state, step,
    activation sequence and state, POLL round, and whether the link was verified both ways."""
    page = _with_db(ctx, lambda db: weave_operator.list_instance_tasks(
        db, namespace=namespace, instance_id=instance_id, limit=limit))
    for view in page.items:
        _echo_line(view)


@admin_workflows.group("signals")
def workflows_signals() -> None:
    """Signals sent to workflow instances, with their dispositions."""


@workflows_signals.command("list")
@click.argument("instance_id")
@click.option("--namespace", required=True)
@click.option("--limit", type=click.IntRange(1, weave_signals.LIST_MAX), default=100,
              show_default=True)
@click.pass_context
def workflows_signals_list(ctx: click.Context, instance_id: str, namespace: str,
                           limit: int) -> None:
    """One JSON line per signal of the instance, newest first."""
    page = _with_db(ctx, lambda db: weave_signals.operator_signals(
        db, namespace=namespace, instance_id=instance_id, limit=limit))
    for view in page.items:
        _echo_line({k: view[k] for k in ("id", "name", "correlation_key", "payload_version",
                                         "state", "disposition", "accepted_at",
                                         "resolved_at")})


@workflows_signals.command("get")
@click.argument("instance_id")
@click.argument("signal_id")
@click.option("--namespace", required=True)
@click.pass_context
def workflows_signals_get(ctx: click.Context, instance_id: str, signal_id: str,
                          namespace: str) -> None:
    """One signal with its payload, state, disposition and the wait it won."""
    _echo_document(_with_db(ctx, lambda db: weave_signals.operator_signal(
        db, namespace=namespace, instance_id=instance_id, signal_id=signal_id)))


@admin.group("tasks")
def admin_tasks() -> None:
    """Tasks (read only)."""


@admin_tasks.command("get")
@click.argument("task_id")
@click.option("--namespace", required=True)
@click.pass_context
def tasks_get(ctx: click.Context, task_id: str, namespace: str) -> None:
    """A task's detail with its verified source (a workflow's task names its instance, step
    and activation)."""
    _echo_document(_with_db(ctx, lambda db: queries.operator_task(
        db, namespace=namespace, task_id=task_id)))


@admin_workflows.group("steps")
def workflows_steps() -> None:
    """Manual recovery of a step (docs/weave/recovery.md): retry a TASK step, resolve a step,
    re-arm a SIGNAL wait, continue a POLL step. Recorded with the operator's identity (--actor)
    and the reason in the audit log."""


def _recovery_request(check: Callable[[], T]) -> T:
    try:
        return check()
    except errors.ValidationFailed as exc:
        raise click.BadParameter("; ".join(f"{p['path']}: {p['message']}"
                                           for p in exc.errors)) from exc


@workflows_steps.command("retry")
@click.argument("instance_id")
@click.argument("step")
@click.option("--namespace", required=True)
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.option("--step-revision", type=int, required=True,
              help="The step's revision as read (compare-and-set).")
@click.option("--evidence-ref", default=None,
              help="The evidence judged (required when the task is in NEEDS_REVIEW).")
@click.option("--execution-ended", is_flag=True,
              help="Declare that the old task's execution has ended (required when it is in "
                   "NEEDS_REVIEW).")
@click.option("--additional-attempts", type=click.IntRange(0, weave_recovery.ADDITIONAL_MAX),
              default=0, show_default=True, help="Attempts granted beyond the original budget.")
@click.pass_context
def workflows_steps_retry(  # noqa: PLR0917 - one parameter per click option
    ctx: click.Context, instance_id: str, step: str, namespace: str, reason: str,
    step_revision: int, evidence_ref: str | None, execution_ended: bool,
    additional_attempts: int,
) -> None:
    """Retry a TASK step: a new activation with a new task, the budget left and the original
    absolute deadline. Prints the step with every activation."""
    request = _recovery_request(lambda: weave_recovery.RetryRequest.check(
        reason=reason, step_revision=step_revision, evidence_ref=evidence_ref,
        execution_ended=True if execution_ended else None,
        additional_attempts=additional_attempts))
    _echo_document(_with_db(ctx, lambda db: weave_recovery.operator_retry(
        db, namespace=namespace, instance_id=instance_id, step=step, request=request,
        actor=_actor(ctx))))


@workflows_steps.command("resolve")
@click.argument("instance_id")
@click.argument("step")
@click.option("--namespace", required=True)
@click.option("--reason", required=True, help="Why; recorded in the audit log.")
@click.option("--evidence-ref", required=True, help="The evidence the conclusion rests on.")
@click.option("--step-revision", type=int, required=True,
              help="The step's revision as read (compare-and-set).")
@click.option("--conclusion", type=click.Choice(weave_recovery.CONCLUSIONS), required=True)
@click.option("--output", "output_json", default=None,
              help="JSON: the step's result (conclusion succeeded).")
@click.option("--error", "error_code", default=None,
              help="The error code (conclusion failed).")
@click.option("--task-decision", type=click.Choice(weave_recovery.CONCLUSIONS), default=None,
              help="The task's execution conclusion (required when it is in NEEDS_REVIEW).")
@click.option("--execution-ended", is_flag=True,
              help="Declare that the task's execution has ended (required when it is in "
                   "NEEDS_REVIEW).")
@click.pass_context
def workflows_steps_resolve(  # noqa: PLR0917 - one parameter per click option
    ctx: click.Context, instance_id: str, step: str, namespace: str, reason: str,
    evidence_ref: str, step_revision: int, conclusion: str, output_json: str | None,
    error_code: str | None, task_decision: str | None, execution_ended: bool,
) -> None:
    """Record a step's logical conclusion (and, for a task in NEEDS_REVIEW, the task's
    review); the engine advances the step with it. Prints the step."""
    output = None
    if output_json is not None:
        try:
            output = jsondoc.loads_strict(output_json)
        except errors.BadRequest as exc:
            raise click.BadParameter(f"{exc.code}: {exc.detail}", param_hint="--output") from exc
    request = _recovery_request(lambda: weave_recovery.ResolveRequest.check(
        reason=reason, evidence_ref=evidence_ref, step_revision=step_revision,
        conclusion=conclusion, output=output, has_output=output_json is not None,
        error=error_code, task_decision=task_decision,
        execution_ended=True if execution_ended else None))
    _echo_document(_with_db(ctx, lambda db: weave_recovery.operator_resolve(
        db, namespace=namespace, instance_id=instance_id, step=step, request=request,
        actor=_actor(ctx))))


@workflows_steps.command("rearm")
@click.argument("instance_id")
@click.argument("step")
@click.option("--namespace", required=True)
@click.option("--reason", required=True, help="Why; recorded in the audit log and the event.")
@click.option("--step-revision", type=click.IntRange(1), required=True,
              help="The step's revision as read (stale_revision when it moved).")
@click.option("--timeout-ms", type=click.IntRange(wait_recovery.TIMEOUT_MIN_MS,
                                                   wait_recovery.TIMEOUT_MAX_MS),
              required=True, help="The new wait's timeout from now.")
@click.pass_context
def workflows_steps_rearm(  # noqa: PLR0917 - one parameter per click option
    ctx: click.Context, instance_id: str, step: str, namespace: str, reason: str,
    step_revision: int, timeout_ms: int,
) -> None:
    """Re-arm a SIGNAL wait held after its timeout: a new activation and wait generation
    (the first deadline kept); prints the step with every activation."""
    _echo_document(_with_db(ctx, lambda db: wait_recovery.operator_rearm(
        db, namespace=namespace, instance_id=instance_id, step=step, reason=reason,
        step_revision=step_revision, timeout_ms=timeout_ms, actor=_actor(ctx))))


@workflows_steps.command("continue")
@click.argument("instance_id")
@click.argument("step")
@click.option("--namespace", required=True)
@click.option("--reason", required=True, help="Why; recorded in the audit log and the event.")
@click.option("--step-revision", type=click.IntRange(1), required=True,
              help="The step's revision as read (stale_revision when it moved).")
@click.option("--rounds", type=click.IntRange(1, wait_recovery.ROUNDS_MAX), required=True,
              help="Rounds granted beyond the definition's max_rounds.")
@click.option("--deadline-ms", type=click.IntRange(1, wait_recovery.TIMEOUT_MAX_MS),
              help="A new query deadline from now (the first one is kept).")
@click.pass_context
def workflows_steps_continue(  # noqa: PLR0917 - one parameter per click option
    ctx: click.Context, instance_id: str, step: str, namespace: str, reason: str,
    step_revision: int, rounds: int, deadline_ms: int | None,
) -> None:
    """Continue a POLL step held after it exhausted or after a round task failed (a cut-short
    round gets only its remaining attempts); prints the step with every activation."""
    _echo_document(_with_db(ctx, lambda db: wait_recovery.operator_continue(
        db, namespace=namespace, instance_id=instance_id, step=step, reason=reason,
        step_revision=step_revision, rounds=rounds, deadline_ms=deadline_ms,
        actor=_actor(ctx))))


# --- daemons ---------------------------------------------------------------------------------


def _run_daemon(ctx: click.Context, service: Any, name: str) -> None:
    """Run one daemon on the process runner with the command line's configuration."""
    from orbit_common.service import runner

    config = _config(ctx)
    _url(ctx)
    runner.run(service, config, name)


@cli.command("api")
@click.pass_context
def api_command(ctx: click.Context) -> None:
    """Run the HTTP API daemon."""
    from orbit_api.app import ApiService

    _run_daemon(ctx, ApiService, "api")


@cli.command("dispatcher")
@click.pass_context
def dispatcher_command(ctx: click.Context) -> None:
    """Run the dispatcher daemon (worker sessions, leases, recovery)."""
    from orbit_dispatcher.service import DispatcherService

    _run_daemon(ctx, DispatcherService, "dispatcher")


@cli.command("scheduler")
@click.pass_context
def scheduler_command(ctx: click.Context) -> None:
    """Run the scheduler daemon (fires due schedules; run any number of replicas)."""
    from orbit_scheduler.service import SchedulerService

    _run_daemon(ctx, SchedulerService, "scheduler")


@cli.command("delivery")
@click.pass_context
def delivery_command(ctx: click.Context) -> None:
    """Run the delivery pump (fan-out, webhooks, lapse recovery; run any number of replicas)."""
    from orbit_delivery.service import DeliveryService

    _run_daemon(ctx, DeliveryService, "delivery")


@cli.command("weave")
@click.pass_context
def weave_command(ctx: click.Context) -> None:
    """Run the workflow engine (advances workflow instances; run any number of replicas)."""
    from orbit_weave.service import WeaveService

    _run_daemon(ctx, WeaveService, "weave")


def _bench_module(name: str) -> Any:
    """``bench.<name>`` from the source checkout this command runs in (the benchmarks are not
    part of the installed package)."""
    import importlib

    root = Path(__file__).resolve().parents[1]
    if not (root / "bench" / (name.replace(".", "/") + ".py")).exists():
        raise click.ClickException("orbit bench runs from a source checkout")
    sys.path.insert(0, str(root))
    return importlib.import_module(f"bench.{name}")


@cli.group()
def bench() -> None:
    """Benchmarks (run from a checkout; figures go to bench/RESULTS.md)."""


@bench.command("tasks")
@click.option("--tasks", "count", default=20_000, show_default=True)
@click.option("--workers", default=2, show_default=True, help="SDK worker processes.")
@click.option("--concurrency", default=64, show_default=True, help="Handlers per worker.")
@click.option("--rate", type=float, default=None, help="Submit at this many tasks/s.")
@click.option("--keys", type=click.IntRange(min=0), default=0, show_default=True,
              help="Spread the tasks over this many concurrency keys (0: none).")
@click.option("--apps", type=click.IntRange(min=1), default=1, show_default=True,
              help="Applications submitting in parallel (the tasks split evenly).")
@click.option("--backlog", type=click.IntRange(min=0), default=0, show_default=True,
              help="Run the kernel and end to end again with this many tasks queued"
                   " (other queues and behind the measured tasks); prints backlog_ratio.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line.")
def bench_tasks(count: int, workers: int, concurrency: int, rate: float | None,  # noqa: PLR0917
                keys: int, apps: int, backlog: int, as_json: bool) -> None:
    """No-op tasks end to end (API, dispatcher, SDK workers) vs the raw and same-shape cycles."""
    import os

    if backlog and (keys or apps > 1):
        raise click.UsageError("--backlog measures the plain phase: without --keys and --apps")
    run = _bench_module("tasks").run

    result = run(os.environ.get("ORBIT_DATABASE_URL"), count, workers, rate, concurrency,
                 keys=keys, apps=apps, backlog=backlog)
    if not as_json:
        click.echo("tasks end to end vs the raw queue cycle (same server, same run):")
    click.echo(json.dumps(result))


@bench.command("peers")
@click.option("--rounds", type=click.IntRange(min=1), default=3, show_default=True,
              help="Interleaved rounds of Orbit, PgQueuer and Celery (the figures are medians).")
@click.option("--tasks", "count", type=click.IntRange(min=1), default=20_000,
              show_default=True)
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line.")
def bench_peers(rounds: int, count: int, as_json: bool) -> None:
    """Orbit vs PgQueuer (durable PostgreSQL) and Celery (durable RabbitMQ), same machine.

    Installs and starts the peers itself (apt-get, a virtualenv under ~/.cache); each system
    drains a queue filled beforehand, timed from its first claim to its last finish.
    """
    import os

    run = _bench_module("peers.run").run

    def progress(line: str) -> None:
        click.echo(line, err=True)

    result = run(os.environ.get("ORBIT_DATABASE_URL"), rounds, count,
                 progress=None if as_json else progress)
    if not as_json:
        click.echo("Orbit vs PgQueuer and Celery, draining a filled queue (medians of the"
                   " interleaved rounds; same machine, same run):")
    click.echo(json.dumps(result))


@bench.command("latency")
@click.option("--tasks", "count", default=5_000, show_default=True, help="Tasks per run.")
@click.option("--runs", type=click.IntRange(min=1), default=10, show_default=True)
@click.option("--max-rate", type=click.FloatRange(min=0, min_open=True), default=None,
              help="The maximum end-to-end rate (tasks/s); measured first when not given.")
@click.option("--workers", default=2, show_default=True, help="SDK worker processes.")
@click.option("--concurrency", default=64, show_default=True, help="Handlers per worker.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line.")
def bench_latency(count: int, runs: int, max_rate: float | None,  # noqa: PLR0917
                  workers: int, concurrency: int, as_json: bool) -> None:
    """Start latency (p99 submit -> start) at half the maximum rate, over consecutive runs."""
    import os

    run = _bench_module("latency").run

    result = run(os.environ.get("ORBIT_DATABASE_URL"), count, runs, workers, concurrency,
                 max_rate=max_rate)
    if not as_json:
        click.echo("start latency at half the maximum rate (p99 < 50 ms in 8 of 10 runs):")
    click.echo(json.dumps(result))


@bench.command("schedules")
@click.option("--schedules", "count", default=10_000, show_default=True)
@click.option("--replicas", default=1, show_default=True, help="orbit scheduler processes.")
@click.option("--steady-seconds", default=130.0, show_default=True,
              help="How long the once-a-minute phase runs (at least two minutes for the issue).")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line.")
def bench_schedules(count: int, replicas: int, steady_seconds: float, as_json: bool) -> None:
    """Schedules: a burst of N due at once, then N firing staggered once a minute."""
    import os

    run = _bench_module("schedules").run

    result = run(os.environ.get("ORBIT_DATABASE_URL"), count, replicas, steady_seconds)
    if not as_json:
        click.echo("schedules: burst drain and steady lateness (from the ledger):")
    click.echo(json.dumps(result))


@bench.command("deliveries")
@click.option("--tasks", "count", default=5_000, show_default=True, help="Tasks per phase.")
@click.option("--workers", default=2, show_default=True, help="SDK worker processes.")
@click.option("--concurrency", default=64, show_default=True, help="Handlers per worker.")
@click.option("--down-seconds", type=click.FloatRange(min=0), default=60.0, show_default=True,
              help="How long the webhook receiver is down before the catch-up is timed.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line.")
def bench_deliveries(count: int, workers: int, concurrency: int,
                     down_seconds: float, as_json: bool) -> None:
    """Result deliveries (a webhook and a pull subscription on every result) vs plain tasks."""
    import os

    run = _bench_module("deliveries").run

    result = run(os.environ.get("ORBIT_DATABASE_URL"), count, workers, concurrency,
                 down_seconds)
    if not as_json:
        click.echo("deliveries end to end vs plain tasks, ack lag at half that rate, catch-up"
                   " after a receiver outage (duplicates and missing must be 0):")
    click.echo(json.dumps(result))


@bench.command("workflows")
@click.option("--tasks", "count", default=6_000, show_default=True,
              help="Plain tasks; the workflow phases run as many steps.")
@click.option("--workers", default=2, show_default=True, help="SDK worker processes.")
@click.option("--concurrency", default=64, show_default=True, help="Handlers per worker.")
@click.option("--waits", is_flag=True,
              help="Timers and signals instead (bench/waits.py): N instances waiting on a "
                   "timer due in the same second; signal acceptance vs task submission.")
@click.option("--instances", type=click.IntRange(min=1), default=10_000, show_default=True,
              help="With --waits: instances per phase.")
@click.option("--json", "as_json", is_flag=True, help="Print only the JSON line.")
def bench_workflows(count: int, workers: int, concurrency: int, waits: bool,  # noqa: PLR0917
                    instances: int, as_json: bool) -> None:
    """Workflow steps (3-step linear, 10-branch parallel) vs plain tasks, and the advance
    latency at half that rate; with --waits, timers and signals."""
    import os

    url = os.environ.get("ORBIT_DATABASE_URL")
    if waits:
        result = _bench_module("waits").run(url, instances)
        if not as_json:
            click.echo("timers due in one second, signal acceptance vs task submission and "
                       "signal -> step advanced at half that rate (duplicates must be 0):")
    else:
        result = _bench_module("workflows").run(url, count, workers, concurrency)
        if not as_json:
            click.echo("workflow steps vs plain tasks, result commit -> next task at half that"
                       " rate (duplicate_steps must be 0, instances_finished ="
                       " instances_started):")
    click.echo(json.dumps(result))


def _register_dev() -> None:
    from orbit_cli.dev import dev

    cli.add_command(dev)


_register_dev()


def main() -> None:
    cli(prog_name="orbit")


def migrate_main() -> None:
    migrate(prog_name="orbit-migrate")


def admin_main() -> None:
    admin(prog_name="orbit-admin")
