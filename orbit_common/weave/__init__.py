"""Weave: workflows whose steps are Pulse tasks (docs/weave/)."""
