"""Stop on SIGTERM / SIGINT while a long-running consumer (Worker, Subscriber) runs."""

from __future__ import annotations

import asyncio
import contextlib
import signal
from collections.abc import Callable, Iterator


@contextlib.contextmanager
def stopping_on_signals(stop: Callable[[], None], *, install: bool = True) -> Iterator[None]:
    """Call ``stop`` on SIGTERM or SIGINT inside the block, where the running loop can take
    signal handlers (not on Windows, not outside the main thread); removed when it ends."""
    loop = asyncio.get_running_loop()
    installed: list[signal.Signals] = []
    if install:
        for sig in (signal.SIGTERM, signal.SIGINT):
            # NotImplementedError: Windows loops; RuntimeError/ValueError: not the main thread.
            with contextlib.suppress(NotImplementedError, RuntimeError, ValueError):
                loop.add_signal_handler(sig, stop)
                installed.append(sig)
    try:
        yield
    finally:
        for sig in installed:
            loop.remove_signal_handler(sig)
