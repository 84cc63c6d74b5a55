"""A runnable Orbit example: a worker with two handlers and a tiny submitter.

    python -m examples.worker run            # the worker (until Ctrl-C / SIGTERM)
    python -m examples.worker submit -n 5    # submit tasks and print their outcomes

Configuration comes from the environment: ORBIT_API_URL (the API, for the submitter),
ORBIT_DISPATCHER_URL (the dispatcher, for the worker), ORBIT_API_KEY, ORBIT_NAMESPACE and
optionally ORBIT_QUEUE (default ``examples``).
"""
