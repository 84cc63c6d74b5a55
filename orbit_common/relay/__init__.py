"""Relay: result subscriptions and their deliveries (issue 13).

``subscriptions`` (management commands and queries), ``fanout`` (result events → deliveries),
``deliveries`` (lease, acknowledge, fail, lapse recovery, budget, history, retention
protection), ``payload`` (what a consumer receives), ``model`` (values, rules, errors, views).
"""
