"""Service plumbing shared by every daemon: config, logging, metrics, health, the runner."""
