"""The receiving side of Orbit's result subscriptions: an inbox that applies each result once.

* :mod:`result_inbox.inbox` -- :func:`~result_inbox.inbox.apply`: the inbox row and the business
  view in one transaction, the view only moving forward (reusable by any consumer);
* :mod:`result_inbox.receiver` -- the webhook receiver (aiohttp): verify, apply, then 2xx;
* :mod:`result_inbox.database` -- the connection pool and the schema (``schema.sql``).

See README.md; run with ``python -m result_inbox {init-db,serve}``.
"""
