"""``task-outbox``: create the tables, create jobs, run the sender, show the state.

    task-outbox init-db
    task-outbox create-job NAME --queue Q --handler H [--input JSON]
    task-outbox workflow-start DEFINITION [--input JSON] [--business-key K] [--version N]
    task-outbox signal NAME --definition D (--workflow ID | --business-key K) [--payload JSON]
    task-outbox run-sender --queue Q [--workflow D] [--once]
    task-outbox status [--job ID]

The application's database comes from ``--database-url`` / ``TASK_OUTBOX_DATABASE_URL``
(``mysql://user:password@host:port/app``); Orbit from ``ORBIT_API_URL``, ``ORBIT_API_KEY`` and
``ORBIT_NAMESPACE`` (or the matching options).
"""

from __future__ import annotations

import asyncio
import datetime as dt
import json
import logging
import os
import signal
import sys
from collections.abc import Awaitable, Callable
from typing import Any, TypeVar

import attrs
import click
from orbit_sdk import Client, RawJson, TaskRequest
from orbit_sdk.outbox import Receipt, SignalRequest, WorkflowStartRequest

from task_outbox import schema
from task_outbox.database import DatabaseUrl, close_pool, open_pool, transaction
from task_outbox.jobs import JobLink, create_job
from task_outbox.sender import Lease, Sender, Settings, queues_of
from task_outbox.workflows import ActionLink, create_signal, create_start

T = TypeVar("T")


def _with_pool(url: DatabaseUrl, work: Callable[[Any], Awaitable[T]]) -> T:
    async def run() -> T:
        pool = await open_pool(url, maxsize=4)
        try:
            return await work(pool)
        finally:
            await close_pool(pool)

    return asyncio.run(run())


@click.group()
@click.option("--database-url", envvar="TASK_OUTBOX_DATABASE_URL", required=True,
              help="The application's database: mysql://user:password@host:port/app"
                   " (env TASK_OUTBOX_DATABASE_URL).")
@click.pass_context
def main(ctx: click.Context, database_url: str) -> None:
    """The task outbox example: business jobs and their Orbit submissions."""
    logging.basicConfig(level=logging.INFO, stream=sys.stderr,
                        format="%(asctime)s %(levelname)s %(name)s: %(message)s")
    try:
        ctx.obj = DatabaseUrl.parse(database_url)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--database-url") from exc


@main.command("init-db")
@click.pass_obj
def init_db(url: DatabaseUrl) -> None:
    """Create sender_outbox and sender_jobs (if missing) in the application's database."""
    async def work(pool: Any) -> None:
        async with pool.acquire() as conn, conn.cursor() as cur:
            await schema.init_db(cur)

    _with_pool(url, work)
    click.echo("sender_outbox and sender_jobs are ready")


@main.command("create-job")
@click.argument("name")
@click.option("--queue", required=True, help="The Orbit queue of the task.")
@click.option("--handler", required=True, help="The handler of the task.")
@click.option("--input", "input_text", default="{}", show_default=True,
              help="The job's input: JSON text, sent to Orbit byte for byte.")
@click.option("--namespace", envvar="ORBIT_NAMESPACE", required=True,
              help="The Orbit namespace (env ORBIT_NAMESPACE).")
@click.option("--priority", type=click.IntRange(0, 9))
@click.option("--business-key", help="The task's business key (Orbit's, for lookups).")
@click.option("--max-attempts", type=click.IntRange(1, 1000), default=10, show_default=True,
              help="The send budget.")
@click.option("--send-within-s", type=click.IntRange(1, 6 * 24 * 3600), default=24 * 3600,
              show_default=True, help="The total send period, from now (database time).")
@click.pass_obj
def create_job_command(url: DatabaseUrl, *, name: str, queue: str, handler: str, input_text: str,
                       namespace: str, priority: int | None, business_key: str | None,
                       max_attempts: int, send_within_s: int) -> None:
    """Register a job and its pending Orbit request in one transaction."""
    try:
        task_input = RawJson(input_text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint="--input") from exc
    request = TaskRequest(queue=queue, handler=handler, input=task_input, priority=priority,
                          business_key=business_key)

    async def work(pool: Any) -> dict[str, str]:
        async def body(cur: Any) -> dict[str, str]:
            job = await create_job(cur, name=name, namespace=namespace, request=request,
                                   max_attempts=max_attempts,
                                   send_within_ms=send_within_s * 1000)
            return {"job": job.id, "request": job.request.id.hex(),
                    "idempotency_key": job.request.idempotency_key}

        return await transaction(pool, body)

    click.echo(json.dumps(_with_pool(url, work)))


def _raw_json(text: str, param: str) -> RawJson:
    try:
        return RawJson(text)
    except ValueError as exc:
        raise click.BadParameter(str(exc), param_hint=param) from exc


_BUDGET_OPTIONS = (
    click.option("--namespace", envvar="ORBIT_NAMESPACE", required=True,
                 help="The Orbit namespace (env ORBIT_NAMESPACE)."),
    click.option("--max-attempts", type=click.IntRange(1, 1000), default=10, show_default=True,
                 help="The send budget."),
    click.option("--send-within-s", type=click.IntRange(1, 6 * 24 * 3600), default=24 * 3600,
                 show_default=True, help="The total send period, from now (database time)."),
)


def _budget_options(command: Callable[..., Any]) -> Callable[..., Any]:
    for option in reversed(_BUDGET_OPTIONS):
        command = option(command)
    return command


def _write_action(url: DatabaseUrl, create: Callable[[Any], Awaitable[Any]]) -> None:
    async def work(pool: Any) -> dict[str, str]:
        async def body(cur: Any) -> dict[str, str]:
            action = await create(cur)
            return {"action": action.id, "request": action.request.id.hex(),
                    "idempotency_key": action.request.idempotency_key}

        return await transaction(pool, body)

    click.echo(json.dumps(_with_pool(url, work)))


@main.command("workflow-start")
@click.argument("definition")
@click.option("--input", "input_text", default="{}", show_default=True,
              help="The workflow's input: a JSON object, sent to Orbit byte for byte.")
@click.option("--business-key", help="The instance's business key.")
@click.option("--version", type=click.IntRange(1), help="A published version (default: latest"
              " at send time).")
@_budget_options
@click.pass_obj
def workflow_start_command(url: DatabaseUrl, *, definition: str, input_text: str,
                           business_key: str | None, version: int | None, namespace: str,
                           max_attempts: int, send_within_s: int) -> None:
    """Register a workflow start and its pending Orbit request in one transaction."""
    request = WorkflowStartRequest(definition=definition,
                                   input=_raw_json(input_text, "--input"),
                                   business_key=business_key, version=version)

    async def create(cur: Any) -> Any:
        return await create_start(cur, request, namespace=namespace, max_attempts=max_attempts,
                                  send_within_ms=send_within_s * 1000)

    _write_action(url, create)


@main.command("signal")
@click.argument("name")
@click.option("--definition", required=True,
              help="The instance's workflow definition (the request's lane).")
@click.option("--workflow", "workflow_id", help="The instance's id.")
@click.option("--business-key", help="Instead of --workflow: the RUNNING instance of the"
              " definition with this business key.")
@click.option("--payload", default="null", show_default=True,
              help="The signal's payload: JSON text, sent byte for byte.")
@click.option("--correlation-key", help="The wait's correlation key.")
@click.option("--payload-version", type=click.IntRange(1), default=1, show_default=True)
@click.option("--evidence-ref", help="A reference to the evidence behind the signal.")
@click.option("--expires-in-ms", type=click.IntRange(1), help="How long Orbit keeps the"
              " signal waiting for its wait.")
@_budget_options
@click.pass_obj
def signal_command(url: DatabaseUrl, *, name: str, definition: str, workflow_id: str | None,
                   business_key: str | None, payload: str, correlation_key: str | None,
                   payload_version: int, evidence_ref: str | None, expires_in_ms: int | None,
                   namespace: str, max_attempts: int, send_within_s: int) -> None:
    """Register a signal and its pending Orbit request in one transaction."""
    if (workflow_id is None) == (business_key is None):
        raise click.UsageError("give exactly one of --workflow and --business-key")
    request = SignalRequest(definition=definition, name=name,
                            payload=_raw_json(payload, "--payload"), workflow_id=workflow_id,
                            business_key=business_key, correlation_key=correlation_key,
                            payload_version=payload_version, evidence_ref=evidence_ref,
                            expires_in_ms=expires_in_ms)

    async def create(cur: Any) -> Any:
        return await create_signal(cur, request, namespace=namespace,
                                   max_attempts=max_attempts,
                                   send_within_ms=send_within_s * 1000)

    _write_action(url, create)


def _stop_self(held: Lease, receipt: Receipt) -> None:
    """Fault injection: freeze this process after Orbit accepted and before the receipt is
    recorded (a test then kills it with SIGKILL)."""
    logging.getLogger(__name__).warning("fault: stopping after %s was accepted for request %s",
                                        receipt.id, held.entry.id.hex())
    os.kill(os.getpid(), signal.SIGSTOP)


@main.command("run-sender")
@click.option("--api-url", envvar="ORBIT_API_URL", required=True,
              help="Orbit's API (env ORBIT_API_URL).")
@click.option("--api-key", envvar="ORBIT_API_KEY", required=True,
              help="An API key with tasks.submit (env ORBIT_API_KEY).")
@click.option("--namespace", envvar="ORBIT_NAMESPACE", required=True,
              help="The namespace; only its requests are sent (env ORBIT_NAMESPACE).")
@click.option("--queue", "queues", multiple=True,
              help="A queue whose task requests this sender sends (repeatable).")
@click.option("--workflow", "definitions", multiple=True,
              help="A workflow definition whose starts and signals this sender sends"
                   " (repeatable).")
@click.option("--batch-size", type=click.IntRange(1, 500), default=16, show_default=True)
@click.option("--lease-ms", type=click.IntRange(300, 3_600_000), default=30_000,
              show_default=True, help="How long a lease lasts (database clock).")
@click.option("--backoff-initial-ms", type=click.IntRange(1), default=1_000, show_default=True)
@click.option("--backoff-max-ms", type=click.IntRange(1), default=300_000, show_default=True)
@click.option("--poll-interval-s", type=click.FloatRange(0.01), default=1.0, show_default=True)
@click.option("--once", is_flag=True, help="One pass, then exit.")
@click.option("--fault-stop-after-send", is_flag=True, hidden=True)
@click.pass_obj
def run_sender(url: DatabaseUrl, *, api_url: str, api_key: str, namespace: str,
               queues: tuple[str, ...], definitions: tuple[str, ...], batch_size: int,
               lease_ms: int,
               backoff_initial_ms: int, backoff_max_ms: int, poll_interval_s: float,
               once: bool, fault_stop_after_send: bool) -> None:
    """Send pending requests until SIGTERM / Ctrl-C (the pass in flight finishes)."""
    try:
        lanes = queues_of((*queues, *definitions))
    except ValueError as exc:
        raise click.UsageError("give at least one --queue or --workflow") from exc
    settings = Settings(queues=lanes, batch_size=batch_size, lease_ms=lease_ms,
                        backoff_initial_ms=backoff_initial_ms, backoff_max_ms=backoff_max_ms,
                        poll_interval_s=poll_interval_s)

    async def work(pool: Any) -> None:
        # One try per send, bounded well inside the lease; the sender backs off itself.
        async with Client(api_url, api_key, namespace, timeout=lease_ms / 3000,
                          max_retries=0) as client:
            sender = Sender(pool, client, settings,
                            links={JobLink.table: JobLink(), ActionLink.table: ActionLink()},
                            after_send=_stop_self if fault_stop_after_send else None)
            if once:
                click.echo(json.dumps(attrs.asdict(await sender.run_once())))
                return
            stop = asyncio.Event()
            loop = asyncio.get_running_loop()
            for signum in (signal.SIGTERM, signal.SIGINT):
                loop.add_signal_handler(signum, stop.set)
            await sender.run(stop)

    _with_pool(url, work)


def _jsonable(value: Any) -> Any:
    if isinstance(value, bytes):
        return value.hex()
    if isinstance(value, dt.datetime):
        return value.replace(tzinfo=dt.UTC).isoformat(timespec="microseconds")
    return value


@main.command("status")
@click.option("--job", "job_id", help="Show one job (hex id) with its request.")
@click.option("--action", "action_id",
              help="Show one workflow action (hex id) with its request.")
@click.option("--limit", type=click.IntRange(1, 1000), default=20, show_default=True)
@click.pass_obj
def status(url: DatabaseUrl, job_id: str | None, action_id: str | None, limit: int) -> None:
    """Counts by state and the latest requests with their jobs, as JSON; or one job or one
    workflow action."""
    action_select = (
        "SELECT a.id AS action, a.kind, a.definition, a.business_key, a.signal_name,"
        " a.state AS action_state, a.workflow_id, a.signal_id, a.last_error AS action_error,"
        " o.id AS request, o.operation, o.idempotency_key, o.state, o.attempts,"
        " o.max_attempts, o.generation, o.wake_at, o.expires_at, o.receipt, o.last_error,"
        " o.created_at, o.updated_at"
        " FROM sender_workflow_actions a JOIN sender_outbox o ON o.id = a.outbox_id"
        " WHERE a.id = %s")
    select = (
        "SELECT j.id AS job, j.name, j.state AS job_state, o.id AS request, o.queue,"
        " o.handler, o.idempotency_key, o.state, o.attempts, o.max_attempts, o.generation,"
        " o.wake_at, o.expires_at, o.task_id, o.last_error, o.created_at, o.updated_at"
        " FROM sender_jobs j JOIN sender_outbox o ON o.id = j.outbox_id")

    async def work(pool: Any) -> dict[str, Any]:
        async def body(cur: Any) -> dict[str, Any]:
            if job_id is not None:
                try:
                    key = bytes.fromhex(job_id)
                except ValueError as exc:
                    raise click.BadParameter("a job id is 32 hex characters",
                                             param_hint="--job") from exc
                await cur.execute(select + " WHERE j.id = %s", (key,))
                rows = await cur.fetchall()
                if not rows:
                    raise click.ClickException(f"no job {job_id}")
                return {"job": {k: _jsonable(v) for k, v in rows[0].items()}}
            if action_id is not None:
                try:
                    key = bytes.fromhex(action_id)
                except ValueError as exc:
                    raise click.BadParameter("an action id is 32 hex characters",
                                             param_hint="--action") from exc
                await cur.execute(action_select, (key,))
                rows = await cur.fetchall()
                if not rows:
                    raise click.ClickException(f"no action {action_id}")
                return {"action": {k: _jsonable(v) for k, v in rows[0].items()}}
            await cur.execute("SELECT state, COUNT(*) AS n FROM sender_outbox GROUP BY state")
            requests = {r["state"]: r["n"] for r in await cur.fetchall()}
            await cur.execute("SELECT state, COUNT(*) AS n FROM sender_jobs GROUP BY state")
            jobs = {r["state"]: r["n"] for r in await cur.fetchall()}
            await cur.execute("SELECT kind, state, COUNT(*) AS n FROM sender_workflow_actions"
                              " GROUP BY kind, state")
            actions: dict[str, dict[str, int]] = {}
            for r in await cur.fetchall():
                actions.setdefault(r["kind"], {})[r["state"]] = r["n"]
            await cur.execute(select + " ORDER BY o.created_at DESC LIMIT %s", (limit,))
            latest = [{k: _jsonable(v) for k, v in r.items()} for r in await cur.fetchall()]
            return {"requests": requests, "jobs": jobs, "actions": actions, "latest": latest}

        return await transaction(pool, body)

    click.echo(json.dumps(_with_pool(url, work), ensure_ascii=False, indent=2))
