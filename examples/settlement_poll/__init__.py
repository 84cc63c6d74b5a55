"""A bank transfer that settles "some time later" on Orbit (issue 15's POLL example): start the
transfer, then poll its status with backoff until it settles -- at most six rounds, within an
absolute deadline -- or fail the workflow with ``not_settled``.

``definition.json`` is the workflow (docs/weave/language.md, docs/weave/waits.md);
``handlers.py`` the two tasks' handlers for an SDK worker; ``python -m
examples.settlement_poll`` sets up the queue and the definition, runs the worker, starts
transfers and shows their rounds (see README.md).
"""
