"""Benchmarks; figures and the commands that produced them live in bench/RESULTS.md."""
