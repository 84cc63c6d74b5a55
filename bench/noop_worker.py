"""The benchmark's worker process: an SDK Worker with one no-op handler."""

from __future__ import annotations

import logging
import os
from typing import Any

from orbit_sdk import Context, Worker


def main() -> None:
    logging.basicConfig(level=logging.WARNING)
    worker = Worker(os.environ["ORBIT_DISPATCHER_URL"], os.environ["ORBIT_API_KEY"],
                    os.environ["ORBIT_NAMESPACE"], queues=os.environ["ORBIT_QUEUES"].split(","),
                    concurrency=int(os.environ.get("ORBIT_CONCURRENCY", "64")))

    @worker.handler("noop")
    async def noop(ctx: Context, data: Any) -> Any:
        return None

    worker.run_forever()


if __name__ == "__main__":
    main()
