"""The HTTP transport shared by the client and the worker: auth, JSON, problems, retries.

Retries: only a request the caller marked idempotent (a GET, a call idempotent by definition,
or a POST carrying an ``Idempotency-Key``) is sent again, and only after a connection failure
(no answer arrived) or a 503. The same body and the same key go out on every try, so a retry
after a lost answer is answered from the server's idempotency record instead of acting twice.
"""

from __future__ import annotations

import asyncio
import logging
from collections.abc import Mapping
from typing import Any

import aiohttp

from orbit_sdk import jsonvalue
from orbit_sdk._backoff import Backoff
from orbit_sdk.errors import ConnectionFailed, OrbitError, ServiceUnavailable, error_from_problem

log = logging.getLogger("orbit_sdk.http")

USER_AGENT = "orbit-sdk-python/0.1"
# 503s that retrying cannot fix: the operator's configuration lacks something.
CONFIGURATION_CODES = frozenset({"webhooks_unavailable"})


class Transport:
    """One aiohttp session against one Orbit base URL, with a bearer credential."""

    def __init__(
        self,
        base_url: str,
        api_key: str,
        *,
        timeout: float = 30.0,
        max_retries: int = 4,
        backoff_initial: float = 0.1,
        backoff_max: float = 2.0,
        exact_numbers: bool = False,
        session: aiohttp.ClientSession | None = None,
    ) -> None:
        self.base_url = base_url.rstrip("/")
        self._api_key = api_key
        self._timeout = timeout
        self.max_retries = max_retries
        self._backoff_initial = backoff_initial
        self._backoff_max = backoff_max
        self.exact_numbers = exact_numbers
        self._session = session
        self._own_session = session is None

    def __repr__(self) -> str:  # never show the key
        return f"Transport({self.base_url!r})"

    @property
    def timeout(self) -> float:
        """Seconds a request may take (connect and answer)."""
        return self._timeout

    @property
    def headers(self) -> dict[str, str]:
        return {"Authorization": f"Bearer {self._api_key}", "User-Agent": USER_AGENT}

    def session(self) -> aiohttp.ClientSession:
        if self._session is None or self._session.closed:
            self._session = aiohttp.ClientSession(
                timeout=aiohttp.ClientTimeout(total=None, sock_connect=self._timeout),
            )
            self._own_session = True
        return self._session

    async def close(self) -> None:
        if self._session is not None and self._own_session and not self._session.closed:
            await self._session.close()
        self._session = None

    def url(self, path: str) -> str:
        return self.base_url + path

    async def request(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None = None,
        body: str | None = None,
        idempotency_key: str | None = None,
        retry: bool = False,
        time_limit: float | None = None,
    ) -> Any:
        """Send one call and return its parsed JSON (``None`` for an empty body).

        Raises the :class:`OrbitError` subclass of the problem document, or
        :class:`ConnectionFailed` when no answer arrived (after the retries, if allowed).
        """
        backoff = Backoff(self._backoff_initial, self._backoff_max)
        attempts = 1 + (self.max_retries if retry else 0)
        for attempt in range(1, attempts + 1):
            try:
                return await self._send(method, path, params=params, body=body,
                                        idempotency_key=idempotency_key, time_limit=time_limit)
            except (ConnectionFailed, ServiceUnavailable) as exc:
                if attempt == attempts or exc.code in CONFIGURATION_CODES:
                    raise
                delay = backoff.next_delay()
                if exc.retry_after is not None:
                    delay = max(delay, min(exc.retry_after, self._backoff_max))
                log.info("retrying %s %s in %.2fs after %s (try %d of %d)", method, path, delay,
                         exc.code, attempt, attempts)
                await asyncio.sleep(delay)
        raise AssertionError("unreachable")  # pragma: no cover

    async def _send(
        self,
        method: str,
        path: str,
        *,
        params: Mapping[str, str] | None,
        body: str | None,
        idempotency_key: str | None,
        time_limit: float | None,
    ) -> Any:
        headers = self.headers
        if body is not None:
            headers["Content-Type"] = "application/json"
        if idempotency_key is not None:
            headers["Idempotency-Key"] = idempotency_key
        limit = aiohttp.ClientTimeout(total=time_limit if time_limit is not None else self._timeout)
        try:
            async with self.session().request(
                method, self.url(path), params=params,
                data=None if body is None else body.encode("utf-8"),
                headers=headers, timeout=limit,
            ) as response:
                payload = await response.read()
                request_id = response.headers.get("X-Request-Id")
                status = response.status
                retry_after = response.headers.get("Retry-After")
        except (aiohttp.ClientConnectionError, aiohttp.ClientPayloadError,
                TimeoutError) as exc:
            raise ConnectionFailed(f"{method} {path}: {type(exc).__name__}: {exc}") from exc
        if status >= 400:
            error = error_from_problem(status, payload, request_id=request_id)
            if retry_after is not None and retry_after.strip().isdigit():
                error.retry_after = float(retry_after.strip())  # the header wins
            raise error
        if not payload:
            return None
        try:
            return jsonvalue.loads(payload, exact_numbers=self.exact_numbers)
        except ValueError as exc:
            raise OrbitError(f"{method} {path}: the answer is not JSON", status=status,
                             code="invalid_response", request_id=request_id) from exc
