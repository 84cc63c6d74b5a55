"""The dispatcher: the worker gateway (sessions, two-step dispatch, renewals, results, recovery)."""
