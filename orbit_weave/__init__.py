"""``orbit weave``: the workflow engine -- task results (the internal inbox) and pending advances
to workflow progress.

Modules:

* :mod:`orbit_weave.service` -- the daemon: the advance loop (``orbit_common.weave.engine``
  rounds, polling with backoff when idle), gauges, drain;
* :mod:`orbit_weave.metrics` -- its Prometheus metrics.

Every transaction is ``orbit_common.weave.engine``'s; this package only paces and counts them.
"""
