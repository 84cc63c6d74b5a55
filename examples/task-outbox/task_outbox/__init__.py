"""The task outbox example: business rows and pending Orbit requests in one local transaction,
a sender that submits them outside any transaction with their original idempotency keys.

Modules: ``schema`` (the tables), ``database`` (connections and the transaction runner),
``jobs`` (the task business transaction and its link to the receipt), ``workflows`` (the same
for workflow starts and signals), ``sender`` (lease, send, record), ``cli`` (``task-outbox
init-db | create-job | workflow-start | signal | run-sender | status``). See README.md.
"""
