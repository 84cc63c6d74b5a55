"""Shared kernel of Orbit: database access, domain transactions and the service runner."""
