"""What a handler knows about the attempt it runs: ``async def handler(ctx, input)``."""

from __future__ import annotations

import datetime as dt
from typing import Any

import attrs

from orbit_sdk.models import parse_time

__all__ = ["Context", "Grant"]


@attrs.frozen(kw_only=True)
class Grant:
    """A lease grant as the dispatcher sends it (``docs/api/worker.md``). The secret ``token``
    is kept out of ``repr`` and never logged."""

    task_id: str
    attempt_id: str
    generation: int
    token: str = attrs.field(repr=False)
    queue: str
    handler: str
    input: Any = attrs.field(repr=False)
    priority: int = 0
    business_key: str | None = None
    rerun_safe: bool = False
    offer_expires_at: dt.datetime | None = None
    deadline_at: dt.datetime | None = None
    attempt_timeout_ms: int | None = None
    max_attempts: int | None = None
    concurrency_key: str | None = None
    concurrency_token: int | None = None

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> Grant:
        """Parse one grant; raises ``ValueError`` or ``TypeError`` when an identity field is
        missing or of the wrong type."""
        try:
            task_id, attempt_id = raw["task_id"], raw["attempt_id"]
            generation, token = raw["generation"], raw["token"]
            queue, handler = raw["queue"], raw["handler"]
        except KeyError as exc:
            raise ValueError(f"a grant without {exc.args[0]!r}") from exc
        if not (isinstance(task_id, str) and isinstance(attempt_id, str)
                and isinstance(token, str) and isinstance(queue, str)
                and isinstance(handler, str) and isinstance(generation, int)):
            raise TypeError("a grant whose identity fields have the wrong types")
        timeout = raw.get("attempt_timeout_ms")
        max_attempts = raw.get("max_attempts")
        business_key = raw.get("business_key")
        concurrency_key = raw.get("concurrency_key")
        fencing = raw.get("concurrency_token")
        priority = raw.get("priority")
        return cls(
            task_id=task_id, attempt_id=attempt_id, generation=generation, token=token,
            queue=queue, handler=handler, input=raw.get("input"),
            priority=priority if isinstance(priority, int) else 0,
            business_key=business_key if isinstance(business_key, str) else None,
            rerun_safe=raw.get("rerun_safe") is True,
            offer_expires_at=parse_time(raw.get("offer_expires_at")),
            deadline_at=parse_time(raw.get("deadline_at")),
            attempt_timeout_ms=timeout if isinstance(timeout, int) else None,
            max_attempts=max_attempts if isinstance(max_attempts, int) else None,
            concurrency_key=concurrency_key if isinstance(concurrency_key, str) else None,
            concurrency_token=fencing
            if isinstance(fencing, int) and not isinstance(fencing, bool) else None,
        )

    def ref(self) -> dict[str, Any]:
        """The credentials every call about this attempt carries."""
        return {"attempt_id": self.attempt_id, "token": self.token,
                "generation": self.generation}


class Context:
    """The running attempt, as seen by its handler.

    Cancellation: when the task is cancelled (a ``cancel`` notice, or ``cancel_requested`` on
    a renewal) the worker sets :attr:`cancel_requested` and cancels the handler's asyncio task,
    so the handler sees ``asyncio.CancelledError`` at its next ``await``. A handler that lets
    it propagate is reported ``cancelled``; one that catches it and returns a value is reported
    ``succeeded`` (a success that lands first wins). When the worker loses the lease, it also
    cancels the handler (:attr:`lease_lost` is true) and reports nothing: the dispatcher has
    already decided the attempt's fate.
    """

    def __init__(self, grant: Grant) -> None:
        self._grant = grant
        self._cancel_requested = False
        self._lease_lost = False
        self.lease_expires_at: dt.datetime | None = None

    def __repr__(self) -> str:
        return (f"Context(task_id={self.task_id!r}, attempt_id={self.attempt_id!r}, "
                f"generation={self.generation}, handler={self.handler!r})")

    @property
    def task_id(self) -> str:
        return self._grant.task_id

    @property
    def attempt_id(self) -> str:
        return self._grant.attempt_id

    @property
    def generation(self) -> int:
        """The attempt's generation: unique and increasing per task (the fencing number)."""
        return self._grant.generation

    @property
    def attempt(self) -> int:
        """The attempt number, 1 for the first (equal to the generation)."""
        return self._grant.generation

    @property
    def max_attempts(self) -> int | None:
        return self._grant.max_attempts

    @property
    def queue(self) -> str:
        return self._grant.queue

    @property
    def handler(self) -> str:
        return self._grant.handler

    @property
    def priority(self) -> int:
        return self._grant.priority

    @property
    def business_key(self) -> str | None:
        return self._grant.business_key

    @property
    def rerun_safe(self) -> bool:
        """Whether the task declared that running it again after a lost lease is safe."""
        return self._grant.rerun_safe

    @property
    def deadline_at(self) -> dt.datetime | None:
        """The task's total deadline (database time), if it has one."""
        return self._grant.deadline_at

    @property
    def attempt_timeout_ms(self) -> int | None:
        return self._grant.attempt_timeout_ms

    @property
    def concurrency_key(self) -> str | None:
        """The task's concurrency key (``None`` for a task without one)."""
        return self._grant.concurrency_key

    @property
    def concurrency_token(self) -> int | None:
        """The fencing token of this attempt's permit on :attr:`concurrency_key`: strictly
        increasing per key, so the resource side can refuse a write carrying a smaller token
        than one it has already seen (``docs/howto/fencing-tokens.md``). ``None`` without a
        key. It fences writes that reach the resource; it does not recall a request already
        sent, so keep the resource side idempotent as well."""
        return self._grant.concurrency_token

    @property
    def fencing_token(self) -> int | None:
        """The same as :attr:`concurrency_token` (the name this SDK reserved for it)."""
        return self._grant.concurrency_token

    @property
    def cancel_requested(self) -> bool:
        """True once the task's cancellation reached this worker."""
        return self._cancel_requested

    @property
    def lease_lost(self) -> bool:
        """True once the worker learnt that this attempt's lease is gone."""
        return self._lease_lost

    def _request_cancel(self) -> None:
        self._cancel_requested = True

    def _lose_lease(self) -> None:
        self._lease_lost = True
