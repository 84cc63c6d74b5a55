"""Benchmarks; figures and the commands that produced them live in bench/RESULTS.md.

A package run by ``orbit bench`` (which imports it; it never imports ``orbit_cli``). Its
transactions through Orbit go through the same named domain functions the daemons call
(``orbit_common/pulse/dispatch.py``). The raw SQL here is on purpose and stays outside
``orbit_common``: the raw queue cycle (``rawqueue.py``) and the bare insert loop (``kernel.py``)
measure raw SQL as the baseline, and the runners seed and count rows directly.
"""
