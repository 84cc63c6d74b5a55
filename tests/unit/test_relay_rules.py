"""Pure relay rules: endpoint policy, secret sealing, secrets, backoff, filters, payload."""

from __future__ import annotations

import base64
import datetime as dt
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given
from hypothesis import strategies as st

from orbit_common import errors
from orbit_common.model import endpoints, jsondoc
from orbit_common.model.endpoints import EndpointPolicy, address_refused, check_url
from orbit_common.model.sealing import Sealer, SealingError, new_key_text
from orbit_common.relay import model, payload
from orbit_common.service.config import ConfigError, load_config

STRICT = EndpointPolicy()


@pytest.mark.parametrize("ip", [
    "127.0.0.1", "127.8.9.10", "::1", "10.0.0.1", "172.16.5.4", "192.168.1.1", "100.64.0.1",
    "169.254.169.254", "fe80::1", "fc00::1", "fd12:3456::1", "224.0.0.1", "ff02::1",
    "0.0.0.0", "::",  # noqa: S104 - an address under test, not a binding "240.0.0.1", "192.0.2.1", "::ffff:10.0.0.1", "::ffff:127.0.0.1",
    "2002:0a00:0001::1", "fec0::1",
])
def test_private_and_special_addresses_are_refused_by_default(ip: str) -> None:
    assert address_refused(ip, STRICT)


@pytest.mark.parametrize("ip", ["8.8.8.8", "1.1.1.1", "2001:4860:4860::8888",
                                "::ffff:8.8.8.8"])
def test_public_addresses_pass(ip: str) -> None:
    assert not address_refused(ip, STRICT)


def test_the_operator_switches() -> None:
    private = EndpointPolicy(allow_private_networks=True)
    loopback = EndpointPolicy(allow_loopback=True)
    assert not address_refused("10.0.0.1", private)
    assert address_refused("127.0.0.1", private)
    assert not address_refused("127.0.0.1", loopback)
    assert address_refused("10.0.0.1", loopback)
    assert not address_refused("::1", loopback)
    for policy in (private, loopback, EndpointPolicy(allow_private_networks=True,
                                                     allow_loopback=True)):
        assert address_refused("224.0.0.1", policy)
        assert address_refused("0.0.0.0", policy)  # noqa: S104


@pytest.mark.parametrize("url", [
    "https://hooks.example.com/x", "https://hooks.example.com:8443/x?a=1",
    "https://8.8.8.8/hook", "https://[2001:4860:4860::8888]/hook", "HTTPS://Example.COM/",
    "https://example.com./",
])
def test_good_urls(url: str) -> None:
    assert check_url(url, STRICT) == url


@pytest.mark.parametrize(("url", "words"), [
    ("http://example.com/", "only https"),
    ("https://u:p@example.com/", "user information"),
    ("https://u@example.com/", "user information"),
    ("https://example.com/#x", "fragment"),
    ("ftp://example.com/", "https"),
    ("example.com/hook", "https"),
    ("https://exa mple.com/", "spaces"),
    ("https://bücher.example/", "non-ASCII"),
    ("https://ex_ample.com/", "host name"),
    ("https://example.com:99999/", "valid URL"),
    ("https://example.com:0/", "port 0"),
    ("https://10.0.0.1/", "range"),
    ("https://[::1]/", "range"),
    ("https://localhost:8080/", "loopback"),
    ("https://api.localhost/", "loopback"),
    ("", "absolute URL"),
])
def test_bad_urls(url: str, words: str) -> None:
    with pytest.raises(endpoints.EndpointRefused, match=words):
        check_url(url, STRICT)


def test_allow_list_patterns() -> None:
    policy = EndpointPolicy(allow_list=("hooks.example.com", "*.partner.net"))
    assert check_url("https://hooks.example.com/a", policy)
    assert check_url("https://a.b.partner.net/a", policy)
    for url in ("https://example.com/", "https://partner.net/", "https://evilpartner.net/",
                "https://hooks.example.com.evil.org/"):
        with pytest.raises(endpoints.EndpointRefused, match="allow-list"):
            check_url(url, policy)
    # The allow-list does not lift the address rules.
    with pytest.raises(endpoints.EndpointRefused):
        check_url("https://10.0.0.1/", EndpointPolicy(allow_list=("10.0.0.1",)))


def test_http_and_loopback_for_development() -> None:
    dev = EndpointPolicy(allow_http=True, allow_loopback=True)
    assert check_url("http://127.0.0.1:9000/hook", dev)
    assert check_url("http://localhost:9000/hook", dev)


def test_sealing_round_trip_and_binding() -> None:
    sealer = Sealer.from_config(new_key_text())
    sealed = sealer.seal(b"whsec_abc", b"row-1")
    assert b"whsec_abc" not in sealed
    assert sealer.open(sealed, b"row-1") == b"whsec_abc"
    assert sealer.seal(b"whsec_abc", b"row-1") != sealed  # a fresh nonce each time
    with pytest.raises(SealingError):
        sealer.open(sealed, b"row-2")
    with pytest.raises(SealingError):
        Sealer.from_config(new_key_text()).open(sealed, b"row-1")
    with pytest.raises(SealingError):
        sealer.open(sealed[:10], b"row-1")
    tampered = sealed[:-1] + bytes([sealed[-1] ^ 1])
    with pytest.raises(SealingError):
        sealer.open(tampered, b"row-1")
    assert "key" in repr(sealer)
    assert new_key_text() not in repr(sealer)


@pytest.mark.parametrize("text", ["", "not base64!", base64.b64encode(b"x" * 31).decode(),
                                  base64.b64encode(b"x" * 33).decode()])
def test_bad_sealing_keys(text: str) -> None:
    with pytest.raises(SealingError):
        Sealer.from_config(text)


def test_delivery_config_from_toml(tmp_path: Path) -> None:
    path = tmp_path / "orbit.toml"
    path.write_text('[delivery]\nendpoint_allow_list = ["a.example.com", "*.b.example.com"]\n'
                    "allow_loopback = true\n")
    config = load_config(path, {})
    assert config.delivery.endpoint_allow_list == ("a.example.com", "*.b.example.com")
    assert config.delivery.policy().allow_loopback
    path.write_text("[delivery]\nendpoint_allow_list = 3\n")
    with pytest.raises(ConfigError, match="endpoint_allow_list"):
        load_config(path, {})
    path.write_text("[delivery]\nsecret = 'x'\n")
    with pytest.raises(ConfigError, match="extra"):
        load_config(path, {})


@given(st.ip_addresses(v=4))
def test_ipv4_refusal_follows_the_address_kind(ip: Any) -> None:
    refused = address_refused(ip, STRICT)
    assert refused == (not ip.is_global or ip.is_multicast)
    if ip.is_private and not ip.is_loopback:
        assert not address_refused(ip, EndpointPolicy(allow_private_networks=True)) or (
            ip.is_multicast or ip.is_unspecified)


def test_delivery_config() -> None:
    key = new_key_text()
    config = load_config(None, {
        "ORBIT_DELIVERY_SECRET_KEY": key, "ORBIT_DELIVERY_ALLOW_HTTP": "true",
        "ORBIT_DELIVERY_ENDPOINT_ALLOW_LIST": "a.example.com, *.b.example.com"})
    assert config.delivery.endpoint_allow_list == ("a.example.com", "*.b.example.com")
    assert config.delivery.policy().allow_http
    assert config.delivery.sealer() is not None
    assert key not in repr(config)
    assert load_config(None, {}).delivery.sealer() is None
    with pytest.raises(ConfigError, match="secret_key"):
        load_config(None, {"ORBIT_DELIVERY_SECRET_KEY": "short"}).delivery.sealer()


def test_new_secrets_are_standard_webhooks_secrets() -> None:
    secret = model.new_secret()
    assert secret.startswith("whsec_")
    assert model.check_secret(secret, "$.secret") == secret
    assert model.new_secret() != secret


@given(st.integers(0, 60), st.integers(0, 10**6), st.integers(0, 10**7))
def test_backoff_doubles_up_to_its_cap(attempts: int, initial: int, extra: int) -> None:
    cap = initial + extra
    wait = model.backoff_ms(attempts, initial, cap)
    assert 0 <= wait <= cap
    if attempts >= 1 and initial > 0:
        assert wait == min(cap, initial * 2 ** (attempts - 1))
        assert model.backoff_ms(attempts + 1, initial, cap) >= wait
    else:
        assert wait == 0


def test_filters_match() -> None:
    q1, q2 = b"\x01" * 16, b"\x02" * 16
    everything = {"queue_ids": [], "states": [], "handlers": []}
    assert model.matches(everything, q1, "FAILED", None)
    narrow = {"queue_ids": [q1.hex()], "states": ["FAILED"], "handlers": ["h"]}
    assert model.matches(narrow, q1, "FAILED", "h")
    assert not model.matches(narrow, q2, "FAILED", "h")
    assert not model.matches(narrow, q1, "SUCCEEDED", "h")
    assert not model.matches(narrow, q1, "FAILED", "other")
    assert not model.matches(narrow, q1, "FAILED", None)


def test_update_needs_a_revision_and_checks_fields() -> None:
    with pytest.raises(errors.ValidationFailed) as caught:
        model.parse_update({"lease_ms": 1, "colour": 1}, STRICT)
    assert {e["path"] for e in caught.value.errors} == {"$.revision", "$.lease_ms", "$.colour"}
    with pytest.raises(errors.ValidationFailed):
        model.parse_update([], STRICT)


def test_the_payload() -> None:
    at = dt.datetime(2026, 1, 2, 3, 4, 5, 6, tzinfo=dt.UTC)
    body = payload.build(
        delivery_id=b"\xaa" * 16, subscription_id=b"\xbb" * 16, subscription="s",
        namespace="ns", sequence=7, event_id=b"\xcc" * 16, task_id=b"\xdd" * 16, queue="q",
        task_revision=4, state="SUCCEEDED", committed_at=at, attempt=2,
        snapshot='{"result": {"n": 1.50}}')
    text = jsondoc.dumps(body)
    assert '"n": 1.50' in text or '"n":1.50' in text  # the frozen snapshot, byte-exact
    doc = jsondoc.loads_strict(text)
    assert doc["type"] == "task.result"
    assert doc["id"] == "aa" * 16
    assert doc["subscription_id"] == "bb" * 16
    assert doc["event_id"] == "cc" * 16
    assert doc["task_id"] == "dd" * 16
    assert doc["attempt"] == 2
    assert doc["sequence"] == 7
    assert doc["committed_at"] == "2026-01-02T03:04:05.000006+00:00"
    assert set(doc) == {"type", "id", "subscription_id", "subscription", "namespace",
                        "sequence", "event_id", "task_id", "queue", "task_revision", "state",
                        "committed_at", "attempt", "snapshot"}
