"""``orbit bench peers``: Orbit against the fastest peers on the same machine (issue 12 target 2).

The same 20,000 no-op tasks go through Orbit, PgQueuer on a durable PostgreSQL and Celery on a
durable RabbitMQ queue, in interleaved rounds. Each system drains a queue filled beforehand and
is timed from its first claim to its last durable finish (``plan.py`` says how, per system).

Two interpreters run here. ``run.py``, ``orbit_drain.py``, ``services.py`` and ``plan.py`` run in
Orbit's own virtualenv (``orbit bench peers`` imports them). ``pgqueuer_drain.py`` and
``celery_drain.py`` import the peers' packages and run in a separate virtualenv that
``services.peers_python`` creates under ``~/.cache/orbit-bench-peers``, so neither the project's
``.venv`` nor ``script/test`` ever gets those packages; they import nothing of Orbit. The servers
(PostgreSQL, RabbitMQ) are installed with apt-get when missing and started privately in a
temporary directory, on their own ports, with durable settings.
"""
