"""``python -m task_outbox``: the same as the ``task-outbox`` command."""

from task_outbox.cli import main

main()
