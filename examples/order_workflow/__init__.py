"""An order workflow on Orbit (issue 14's example): reserve stock, then charge and print the
shipping label in parallel, and finish -- or fail the order when stock is short or the charge is
declined.

``definition.json`` is the workflow (docs/weave/language.md); ``handlers.py`` the three tasks'
handlers for an SDK worker; ``python -m examples.order_workflow`` sets up the queues and the
definition, runs the worker, places orders and shows them (see README.md).
"""
