"""orbit_common.platform.authz: grant parsing and the authorization decision."""

from __future__ import annotations

from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit_common.platform import authz
from orbit_common.platform.authz import Grant

# --- parse_grants -------------------------------------------------------------------------------


def test_parse_grants_builds_grants_and_defaults_queues_to_everything() -> None:
    grants = authz.parse_grants(
        [
            {"namespaces": ["team-*", "prod"], "actions": ["namespaces.read"]},
            {"namespaces": ["*"], "actions": ["namespaces.*"], "queues": ["emails"]},
        ]
    )
    assert grants == (
        Grant(namespaces=("team-*", "prod"), actions=("namespaces.read",), queues=("*",)),
        Grant(namespaces=("*",), actions=("namespaces.*",), queues=("emails",)),
    )


@pytest.mark.parametrize(
    ("raw", "message"),
    [
        (None, "grants must be a non-empty list"),
        ({}, "grants must be a non-empty list"),
        ([], "grants must be a non-empty list"),
        ("*", "grants must be a non-empty list"),
        ([{"namespaces": ["*"], "actions": ["*"]}] * (authz.MAX_GRANTS + 1), "at most 64 grants"),
        ([1], r"grants\[0\] must be an object"),
        ([["*"]], r"grants\[0\] must be an object"),
        (
            [
                {"namespaces": ["*"], "actions": ["*"]},
                {"namespaces": ["*"], "actions": ["*"], "tenants": ["*"]},
            ],
            r"grants\[1\] has unknown fields \['tenants'\]",
        ),
        ([{"namespaces": ["*"]}], r"grants\[0\]\.actions must be a non-empty list of strings"),
        ([{"actions": ["*"]}], r"grants\[0\]\.namespaces must be a non-empty list of strings"),
        (
            [{"namespaces": "*", "actions": ["*"]}],
            r"grants\[0\]\.namespaces must be a non-empty list of strings",
        ),
        (
            [{"namespaces": [], "actions": ["*"]}],
            r"grants\[0\]\.namespaces must be a non-empty list of strings",
        ),
        (
            [{"namespaces": [1], "actions": ["*"]}],
            r"grants\[0\]\.namespaces must be a non-empty list of strings",
        ),
        (
            [{"namespaces": ["*"], "actions": ["*"], "queues": []}],
            r"grants\[0\]\.queues must be a non-empty list of strings",
        ),
        (
            [{"namespaces": ["*"] * (authz.MAX_PATTERNS + 1), "actions": ["*"]}],
            r"grants\[0\]\.namespaces must be a non-empty list of strings",
        ),
        (
            [{"namespaces": ["*"], "actions": ["namespaces.delete"]}],
            r"grants\[0\]\.actions: invalid pattern 'namespaces.delete'",
        ),
        (
            [{"namespaces": ["*"], "actions": ["nosuchfamily.*"]}],
            r"grants\[0\]\.actions: invalid pattern 'nosuchfamily.\*'",
        ),
        (
            [{"namespaces": ["*"], "actions": ["namespaces.re*"]}],
            r"grants\[0\]\.actions: invalid pattern 'namespaces.re\*'",
        ),
        ([{"namespaces": ["*"], "actions": [".*"]}], r"grants\[0\]\.actions: invalid pattern"),
        ([{"namespaces": ["*"], "actions": [""]}], r"grants\[0\]\.actions: invalid pattern"),
        ([{"namespaces": ["Team"], "actions": ["*"]}], r"grants\[0\]\.namespaces: invalid pattern"),
        (
            [{"namespaces": ["*team"], "actions": ["*"]}],
            r"grants\[0\]\.namespaces: invalid pattern",
        ),
        (
            [{"namespaces": ["te*am"], "actions": ["*"]}],
            r"grants\[0\]\.namespaces: invalid pattern",
        ),
        (
            [{"namespaces": ["team**"], "actions": ["*"]}],
            r"grants\[0\]\.namespaces: invalid pattern",
        ),
        (
            [{"namespaces": ["-team*"], "actions": ["*"]}],
            r"grants\[0\]\.namespaces: invalid pattern",
        ),
        ([{"namespaces": [""], "actions": ["*"]}], r"grants\[0\]\.namespaces: invalid pattern"),
        ([{"namespaces": ["a" * 65], "actions": ["*"]}], r"grants\[0\]\.namespaces: invalid"),
        (
            [{"namespaces": ["*"], "actions": ["*"], "queues": ["Q*"]}],
            r"grants\[0\]\.queues: invalid pattern 'Q\*'",
        ),
    ],
)
def test_parse_grants_rejects_bad_shapes_with_a_message_naming_the_part(
    raw: Any, message: str
) -> None:
    with pytest.raises(authz.GrantError, match=message):
        authz.parse_grants(raw)


def test_grant_error_is_a_value_error() -> None:
    assert issubclass(authz.GrantError, ValueError)


@pytest.mark.parametrize("pattern", ["*", "t*", "team-*", "team.prod_*", "a" * 63 + "*", "x"])
def test_valid_namespace_patterns(pattern: str) -> None:
    assert authz.parse_grants([{"namespaces": [pattern], "actions": ["*"]}])


@pytest.mark.parametrize("pattern", ["*", "namespaces.*", *sorted(authz.ACTIONS)])
def test_valid_action_patterns(pattern: str) -> None:
    assert authz.parse_grants([{"namespaces": ["*"], "actions": [pattern]}])


def test_grants_survive_the_database_round_trip() -> None:
    grants = authz.parse_grants(
        [{"namespaces": ["team-*"], "actions": ["namespaces.read"], "queues": ["a", "b*"]}]
    )
    text = authz.grants_to_db(grants)
    assert text == ('[{"namespaces":["team-*"],"actions":["namespaces.read"],"queues":["a","b*"]}]')
    assert authz.grants_from_db(text) == grants


# --- matching -----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("pattern", "value", "expected"),
    [
        ("*", "anything", True),
        ("*", "", True),
        ("team-*", "team-a", True),
        ("team-*", "team-", True),
        ("team-*", "team", False),
        ("team-*", "teams-a", False),
        ("team-*", "my-team-a", False),
        ("team", "team", True),
        ("team", "team-a", False),
        ("team", "tea", False),
        ("namespaces.*", "namespaces.read", True),
        ("namespaces.*", "namespaces.create", True),
        ("namespaces.*", "namespacesX.read", False),
        ("namespaces.read", "namespaces.read", True),
        ("namespaces.read", "namespaces.create", False),
    ],
)
def test_matches(pattern: str, value: str, expected: bool) -> None:
    assert authz.matches(pattern, value) is expected


def test_a_request_is_allowed_when_one_grant_matches_all_parts() -> None:
    grants = authz.parse_grants(
        [
            {"namespaces": ["team-*"], "actions": ["namespaces.read"]},
            {"namespaces": ["ops"], "actions": ["namespaces.*"], "queues": ["mail*"]},
        ]
    )
    assert authz.allowed(grants, "namespaces.read", "team-a")
    assert not authz.allowed(grants, "namespaces.create", "team-a")
    assert authz.allowed(grants, "namespaces.create", "ops")
    assert authz.allowed(grants, "namespaces.create", "ops", "mail-out")
    assert not authz.allowed(grants, "namespaces.create", "ops", "sms")
    # queue of the first grant defaults to "*"
    assert authz.allowed(grants, "namespaces.read", "team-a", "sms")
    # parts of different grants never combine: read comes from grant 0, "ops" from grant 1
    assert not authz.allowed(
        authz.parse_grants(
            [
                {"namespaces": ["team-*"], "actions": ["namespaces.read"]},
                {"namespaces": ["ops"], "actions": ["namespaces.create"]},
            ]
        ),
        "namespaces.read",
        "ops",
    )
    assert not authz.allowed(grants, "namespaces.read", "other")
    assert not authz.allowed((), "namespaces.read", "team-a")


def test_a_namespace_wide_action_needs_a_grant_on_every_queue() -> None:
    # Disabling a namespace stops every queue in it: a key scoped to some queues may not.
    scoped = authz.parse_grants([{"namespaces": ["ops"], "actions": ["*"], "queues": ["mail*"]}])
    assert not authz.allowed(scoped, "namespaces.manage", "ops")
    assert authz.allowed(scoped, "namespaces.create", "ops")  # a new namespace has no queues
    assert authz.allowed(scoped, "tasks.submit", "ops", "mail-out")
    every = authz.parse_grants([{"namespaces": ["ops"], "actions": ["namespaces.manage"]}])
    assert authz.allowed(every, "namespaces.manage", "ops")


def test_sees_namespace_ignores_actions() -> None:
    grants = authz.parse_grants([{"namespaces": ["team-*"], "actions": ["namespaces.create"]}])
    assert authz.sees_namespace(grants, "team-a")
    assert not authz.sees_namespace(grants, "other")


_any_text = st.text(max_size=80)


@given(action=_any_text, namespace=_any_text, queue=st.none() | _any_text)
def test_an_all_star_grant_allows_everything(
    action: str, namespace: str, queue: str | None
) -> None:
    grants = authz.parse_grants([{"namespaces": ["*"], "actions": ["*"], "queues": ["*"]}])
    assert authz.allowed(grants, action, namespace, queue)
    assert authz.allowed(authz.ALL_ACCESS, action, namespace, queue)
    assert authz.sees_namespace(grants, namespace)


_names = st.from_regex(r"\A[a-z0-9](?:[a-z0-9._-]{0,20}[a-z0-9])?\Z")


@given(prefix=_names, suffix=st.from_regex(r"\A[a-z0-9._-]{0,10}\Z"), other=_names)
def test_a_prefix_grant_allows_exactly_the_names_with_that_prefix(
    prefix: str, suffix: str, other: str
) -> None:
    grants = authz.parse_grants([{"namespaces": [prefix + "*"], "actions": ["*"]}])
    assert authz.allowed(grants, "namespaces.read", prefix + suffix)
    assert authz.allowed(grants, "namespaces.read", other) is other.startswith(prefix)
