"""The operator console (docs/console.md): server-rendered pages under ``/console/``."""
