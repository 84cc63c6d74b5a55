"""The scheduler: fires due schedules into tasks through the occurrence ledger (no leader)."""
