"""The public HTTP API of Orbit (aiohttp)."""
