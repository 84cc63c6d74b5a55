"""The worker gateway's limits that need no server: settings, the packet warning, the flood
window (docs/api/worker.md §6, docs/configuration.md)."""

from __future__ import annotations

import pytest

from orbit_common.db.schema import durability_warnings, packet_bytes_needed
from orbit_common.service.config import (
    MAX_RESULT_BYTES,
    RESULT_BYTES_CEILING,
    ConfigError,
    load_config,
)
from orbit_dispatcher.service import RateWindow

DURABLE = {"flush_log_at_trx_commit": 1, "log_bin": 0, "sync_binlog": 0,
           "binlog_format": "ROW"}


def test_the_defaults_fit_a_message_and_the_database_defaults() -> None:
    dispatcher = load_config(None, {}).dispatcher
    assert dispatcher.max_message_bytes == 1024 * 1024
    assert dispatcher.max_result_bytes == MAX_RESULT_BYTES < dispatcher.max_message_bytes
    # MariaDB 10.11's default max_allowed_packet (16 MiB) carries a finish at the default.
    assert packet_bytes_needed(MAX_RESULT_BYTES) < 16 * 1024 * 1024


@pytest.mark.parametrize(("name", "value"), [
    ("ORBIT_DISPATCHER_MAX_RESULT_BYTES", str(RESULT_BYTES_CEILING + 1)),
    ("ORBIT_DISPATCHER_MAX_RESULT_BYTES", "0"),
    ("ORBIT_DISPATCHER_MAX_MESSAGE_BYTES", "1000"),
    ("ORBIT_DISPATCHER_MAX_FRAMES_PER_SECOND", "0"),
    ("ORBIT_DISPATCHER_MAX_INVALID_FRAMES", "0"),
])
def test_limits_out_of_range_are_configuration_errors(name: str, value: str) -> None:
    key = name.removeprefix("ORBIT_DISPATCHER_").lower()
    with pytest.raises(ConfigError, match=f"'{key}' must be .* @ \\$\\.dispatcher"):
        load_config(None, {name: value})


def test_a_small_max_allowed_packet_is_a_readiness_warning() -> None:
    needed = packet_bytes_needed(MAX_RESULT_BYTES)
    assert durability_warnings({**DURABLE, "max_allowed_packet": needed}, needed) == []
    (warning,) = durability_warnings({**DURABLE, "max_allowed_packet": needed - 1}, needed)
    assert warning.startswith(f"max_allowed_packet is {needed - 1} bytes, below the {needed}")


def test_the_rate_window_counts_a_sliding_window() -> None:
    window = RateWindow(3, 1.0)
    assert [window.exceeded(t) for t in (0.0, 0.1, 0.2)] == [False, False, False]
    assert window.exceeded(0.5) is True  # a fourth within one second
    assert window.exceeded(1.05) is False  # the first has left the window
    assert window.exceeded(1.06) is True  # 0.1, 0.2 and 1.05 are within a second of it
