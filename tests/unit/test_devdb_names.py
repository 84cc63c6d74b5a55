"""orbit_devdb checks database and user names against strict patterns before they are written
into a statement (they are identifiers there, not parameters)."""

from __future__ import annotations

from pathlib import Path

import pytest
from click.testing import CliRunner

import orbit_devdb as devdb
from orbit_cli.main import cli

REFUSED = ["", "a`b", "orbit`; DROP DATABASE mysql; --", "a'b", 'a"b', "a b", "a.b", "a-b",
           "a\\b", "a\nb", "ørbit", "x" * 65]


@pytest.mark.parametrize("name", ["orbit", "orbit_test_gw0_123", "A9_", "x" * 64])
def test_plain_names_are_quoted_identifiers(name: str) -> None:
    assert devdb.database_identifier(name) == f"`{name}`"


@pytest.mark.parametrize("name", REFUSED)
def test_database_names_outside_the_pattern_are_refused(name: str) -> None:
    with pytest.raises(devdb.InvalidName, match="invalid database name"):
        devdb.database_identifier(name)


@pytest.mark.parametrize("name", [*REFUSED[:-1], "x" * 33, "rt'@'%"])
def test_user_names_outside_the_pattern_are_refused(name: str) -> None:
    with pytest.raises(devdb.InvalidName, match="invalid user name"):
        devdb.check_user(name)
    assert devdb.check_user(devdb.RUNTIME_USER) == "orbit_runtime"


def test_create_database_refuses_before_connecting(tmp_path: Path) -> None:
    nowhere = devdb.Instance(root=tmp_path, port=1, user="orbit", password="x")
    with pytest.raises(devdb.InvalidName):  # not a connection error: nothing was attempted
        devdb.create_database(nowhere, "orbit`x")


def test_dev_db_start_refuses_a_bad_name_before_starting_anything(tmp_path: Path) -> None:
    root = tmp_path / "mysql"
    result = CliRunner().invoke(cli, ["dev", "db", "start", "--dir", str(root),
                                      "--database", "orbit`; DROP DATABASE x"])
    assert result.exit_code == 2, result.output
    assert "invalid database name" in result.output
    assert not root.exists()


def test_runtime_url_needs_the_runtime_user(tmp_path: Path) -> None:
    instance = devdb.Instance(root=tmp_path, port=3307, user="orbit", password="admin")
    with pytest.raises(devdb.DevDbError, match="no runtime user"):
        instance.runtime_url("orbit")
    ready = devdb.Instance(root=tmp_path, port=3307, user="orbit", password="admin",
                           runtime_password="p@ss")
    assert ready.runtime_url("orbit") == "mysql://orbit_runtime:p%40ss@127.0.0.1:3307/orbit"
    assert "p@ss" not in repr(ready)
