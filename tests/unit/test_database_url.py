"""orbit_common.db.pool.DatabaseUrl: parsing and rendering database URLs."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit_common.db.pool import DatabaseUrl


def test_a_full_tcp_url() -> None:
    url = DatabaseUrl.parse("mysql://orbit:secret@db.internal:3307/orbit")
    assert url == DatabaseUrl(
        user="orbit", password="secret", host="db.internal", port=3307, database="orbit"
    )
    kwargs = url.connect_kwargs()
    assert (kwargs["host"], kwargs["port"], kwargs["user"]) == ("db.internal", 3307, "orbit")
    assert "unix_socket" not in kwargs


def test_defaults_and_the_mariadb_scheme() -> None:
    url = DatabaseUrl.parse("mariadb://db")
    assert url == DatabaseUrl(user="root", password="", host="db", port=3306, database="")


def test_unix_socket_parameter() -> None:
    url = DatabaseUrl.parse("mysql://orbit:pw@localhost/orbit?unix_socket=/run/mysqld/mysqld.sock")
    assert url.unix_socket == "/run/mysqld/mysqld.sock"
    kwargs = url.connect_kwargs()
    assert kwargs["unix_socket"] == "/run/mysqld/mysqld.sock"
    assert "host" not in kwargs
    assert "port" not in kwargs


def test_percent_encoded_user_and_password_are_decoded() -> None:
    url = DatabaseUrl.parse("mysql://us%40er:p%40ss%2Fw%3Ard%25%20x@h/d")
    assert url.user == "us@er"
    assert url.password == "p@ss/w:rd% x"
    assert url.connect_kwargs()["password"] == "p@ss/w:rd% x"


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("postgres://u@h/d", "must start with mysql:// or mariadb://"),
        ("h:3306/d", "must start with mysql:// or mariadb://"),
        ("mysql://u@h/d?ssl=true", r"unknown database URL parameters: \['ssl'\]"),
        ("mysql://u@h/d?charset=latin1&unix_socket=/s", r"\['charset'\]"),
        ("mysql://u@h/d?b=1&a=2", r"\['a', 'b'\]"),
        ("mysql://u@h:notaport/d", "Port"),
    ],
)
def test_bad_urls_are_refused(text: str, message: str) -> None:
    with pytest.raises(ValueError, match=message):
        DatabaseUrl.parse(text)


def test_render_hides_the_password_by_default() -> None:
    url = DatabaseUrl.parse("mysql://orbit:s%40cret@h:3306/orbit")
    rendered = url.render()
    assert "s@cret" not in rendered
    assert "s%40cret" not in rendered
    assert rendered == "mysql://orbit:***@h:3306/orbit"
    assert "s@cret" not in repr(url)
    assert url.render(hide_password=False) == "mysql://orbit:s%40cret@h:3306/orbit"


def test_render_without_password_has_no_mask() -> None:
    assert DatabaseUrl.parse("mysql://orbit@h/d").render() == "mysql://orbit@h:3306/d"


@pytest.mark.parametrize(
    "text",
    [
        "mysql://orbit:p%40ss%2Fw%3Ard@db.example:3307/orbit?unix_socket=/tmp/my.sock",
        "mysql://root@127.0.0.1:3306/",
        # a socket path with characters that mean something in a query string
        "mysql://u:p@localhost:3306/d?unix_socket=/tmp/a%2Bb%20c%26d%25e.sock",
    ],
)
def test_render_with_password_parses_back_to_the_same_url(text: str) -> None:
    url = DatabaseUrl.parse(text)
    assert DatabaseUrl.parse(url.render(hide_password=False)) == url


_url_text = st.text(
    st.characters(codec="utf-8", exclude_characters="\x00"), min_size=1, max_size=20
)


@given(
    user=_url_text,
    password=st.text(st.characters(codec="utf-8"), max_size=20),
    database=st.from_regex(r"\A[a-z0-9_]{0,20}\Z"),
    socket=st.none() | _url_text.map(lambda s: "/run/" + s),
)
def test_render_round_trip_property(
    user: str, password: str, database: str, socket: str | None
) -> None:
    url = DatabaseUrl(
        user=user, password=password, host="db", port=3306, database=database, unix_socket=socket
    )
    assert DatabaseUrl.parse(url.render(hide_password=False)) == url
    if password:
        assert url.render().count("***") == 1


def test_with_database_keeps_everything_else() -> None:
    url = DatabaseUrl.parse("mysql://u:p@h:1/a?unix_socket=/s")
    assert url.with_database("b") == DatabaseUrl(
        user="u", password="p", host="h", port=1, database="b", unix_socket="/s"
    )
