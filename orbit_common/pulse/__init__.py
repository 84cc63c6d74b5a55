"""The pulse context: queues, execution gates, tasks, attempts, workers and the lease protocol."""
