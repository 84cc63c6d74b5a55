"""The task outbox example: business rows and pending Orbit requests in one local transaction,
a sender that submits them outside any transaction with their original idempotency keys.

Modules: ``schema`` (the two tables), ``database`` (connections and the transaction runner),
``jobs`` (the business transaction and its link to the receipt), ``sender`` (lease, send,
record), ``cli`` (``task-outbox init-db | create-job | run-sender | status``). See README.md.
"""
