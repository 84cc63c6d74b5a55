"""Fencing tokens end to end: a worker whose handler writes to a ledger with its token.

    python -m examples.fencing run       # the worker (until Ctrl-C / SIGTERM)
    python -m examples.fencing submit    # submit deposits, several per account

Tasks carry ``concurrency_key = "account:<id>"``: Orbit grants at most one valid permit per
account, and the handler passes ``ctx.concurrency_token`` to the ledger (``ledger.py``), which
refuses a write whose token is not newer than the last one it accepted. See
docs/howto/fencing-tokens.md. Configuration as in examples/worker (ORBIT_API_URL,
ORBIT_DISPATCHER_URL, ORBIT_API_KEY, ORBIT_NAMESPACE); ORBIT_LEDGER is the sqlite file
(default ``ledger.sqlite3``).
"""
