"""The resource side of docs/howto/fencing-tokens.md (examples/fencing/ledger.py): a write lands
only with a token newer than every token the account has seen."""

from __future__ import annotations

import pytest

from examples.fencing.ledger import apply, open_ledger


def test_a_stale_holder_cannot_overwrite_a_newer_one() -> None:
    ledger = open_ledger()
    ledger.execute("INSERT INTO accounts (id, balance) VALUES ('a', 0)")
    assert apply(ledger, "a", 10, token=5) == "applied"
    # A newer permit on the same key wrote; then the old holder (token 5) wakes up.
    assert apply(ledger, "a", 20, token=7) == "applied"
    assert apply(ledger, "a", 10, token=5) == "stale"
    # The newest holder retrying its own write changes nothing either.
    assert apply(ledger, "a", 20, token=7) == "already"
    assert ledger.execute("SELECT balance, last_token FROM accounts").fetchone() == (30, 7)


def test_accounts_are_fenced_independently() -> None:
    ledger = open_ledger()
    ledger.executemany("INSERT INTO accounts (id, balance) VALUES (?, 0)", [("a",), ("b",)])
    assert apply(ledger, "a", 1, token=9) == "applied"
    assert apply(ledger, "b", 1, token=2) == "applied"  # tokens are per key
    with pytest.raises(LookupError):
        apply(ledger, "missing", 1, token=1)
