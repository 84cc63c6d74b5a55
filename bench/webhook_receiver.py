"""The delivery benchmark's webhook receiver: acknowledges every delivery at once (204) and
appends ``<webhook-id> <event_id>`` to a file, one line per request (flushed on exit)."""

from __future__ import annotations

import json
import os
import signal
from typing import Any

from aiohttp import web


def main() -> None:
    out = open(os.environ["RECEIVER_LOG"], "a", buffering=1024 * 1024)  # noqa: SIM115
    lines: list[str] = []

    async def receive(request: web.Request) -> web.Response:
        body = await request.read()
        event_id = json.loads(body).get("event_id", "")
        lines.append(f"{request.headers.get('webhook-id', '')} {event_id}\n")
        if len(lines) >= 256:
            out.writelines(lines)
            lines.clear()
        return web.Response(status=204)

    async def flush(_app: Any) -> None:
        out.writelines(lines)
        out.close()

    async def health(_request: web.Request) -> web.Response:
        return web.Response(status=200)

    app = web.Application()
    app.router.add_post("/hook", receive)
    app.router.add_get("/healthz", health)
    app.on_shutdown.append(flush)
    signal.signal(signal.SIGTERM, signal.default_int_handler)
    web.run_app(app, host="127.0.0.1", port=int(os.environ["RECEIVER_PORT"]), access_log=None,
                print=None, handle_signals=True)


if __name__ == "__main__":
    main()
