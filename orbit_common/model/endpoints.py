"""Webhook endpoint policy (SSRF): which URLs a subscription may deliver to.

Pure checks, used when a subscription is created or its endpoint changed (:func:`check_url`),
and by the pump on every address a host name resolves to at send time
(:func:`address_refused`), since a name checked once may later resolve elsewhere.

Rules (the operator's ``[delivery]`` settings, docs/configuration.md):

* an absolute ``https`` URL; ``http`` only with ``allow_http``; no user info, no fragment;
* with a non-empty ``endpoint_allow_list``, the host must match one of its patterns
  (``example.com`` exactly, ``*.example.com`` any subdomain of it);
* a literal IP host, and at send time every resolved address, in a private, shared (CGNAT),
  loopback, link-local, unique-local, multicast, unspecified or reserved range is refused,
  unless ``allow_private_networks`` (all of them but loopback, multicast, unspecified) or
  ``allow_loopback`` (loopback only: development) says otherwise.
"""

from __future__ import annotations

import ipaddress
import urllib.parse

import attrs

URL_MAX = 2048
Address = ipaddress.IPv4Address | ipaddress.IPv6Address
_SHARED = ipaddress.ip_network("100.64.0.0/10")  # carrier-grade NAT, not is_private everywhere


@attrs.frozen(kw_only=True)
class EndpointPolicy:
    allow_http: bool = False
    allow_private_networks: bool = False
    allow_loopback: bool = False
    allow_list: tuple[str, ...] = ()


class EndpointRefused(ValueError):
    """The URL breaks the policy; the message says which rule (safe to show the caller)."""


def _unwrap(ip: Address) -> Address:
    if isinstance(ip, ipaddress.IPv6Address):
        if ip.ipv4_mapped is not None:
            return ip.ipv4_mapped
        if ip.sixtofour is not None:
            return ip.sixtofour
    return ip


def address_refused(ip: Address | str, policy: EndpointPolicy) -> bool:
    """Whether a delivery may not go to ``ip`` under ``policy`` (IPv4-mapped and 6to4
    addresses are judged by the IPv4 address inside)."""
    address = _unwrap(ipaddress.ip_address(ip) if isinstance(ip, str) else ip)
    if address.is_loopback:
        return not policy.allow_loopback
    if address.is_multicast or address.is_unspecified:
        return True
    private = address.is_private or address.is_link_local or address.is_reserved
    if isinstance(address, ipaddress.IPv4Address):
        private = private or address in _SHARED
    else:
        private = private or address.is_site_local
    if private:
        return not policy.allow_private_networks
    return not address.is_global


def host_allowed(host: str, allow_list: tuple[str, ...]) -> bool:
    """Whether ``host`` (lower case, no trailing dot) matches the allow-list (empty: any)."""
    if not allow_list:
        return True
    for raw in allow_list:
        pattern = raw.strip().lower().rstrip(".")
        if pattern.startswith("*."):
            if host.endswith(pattern[1:]) and len(host) > len(pattern) - 1:
                return True
        elif host == pattern:
            return True
    return False


def check_url(url: str, policy: EndpointPolicy) -> str:
    """The URL, validated against ``policy``; raises :class:`EndpointRefused`."""
    if not isinstance(url, str) or not url or len(url) > URL_MAX:
        raise EndpointRefused(f"an absolute URL of at most {URL_MAX} characters")
    if not url.isprintable() or any(c.isspace() for c in url) or not url.isascii():
        raise EndpointRefused("the URL holds spaces, control or non-ASCII characters"
                              " (use the host's punycode form)")
    try:
        parts = urllib.parse.urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise EndpointRefused(f"not a valid URL: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in ("https", "http") or not parts.netloc:
        raise EndpointRefused("an absolute https URL")
    if scheme == "http" and not policy.allow_http:
        raise EndpointRefused("the operator allows only https endpoints")
    if parts.username is not None or parts.password is not None or "@" in parts.netloc:
        raise EndpointRefused("the URL may not carry user information")
    if parts.fragment:
        raise EndpointRefused("the URL may not carry a fragment")
    if port == 0:
        raise EndpointRefused("port 0 is not a valid port")
    _check_host((parts.hostname or "").rstrip("."), policy)
    return url


def _check_host(host: str, policy: EndpointPolicy) -> None:
    if not host:
        raise EndpointRefused("the URL has no host")
    try:
        literal: Address | None = ipaddress.ip_address(host)
    except ValueError:
        literal = None
    if literal is None and not all(
        label and len(label) <= 63 and label.replace("-", "").isalnum()
        and not label.startswith("-") and not label.endswith("-")
        for label in host.split(".")
    ):
        raise EndpointRefused("the URL's host is not a valid host name")
    if not host_allowed(host, policy.allow_list):
        raise EndpointRefused(f"host {host!r} is not on the operator's endpoint allow-list")
    if literal is not None and address_refused(literal, policy):
        raise EndpointRefused(f"address {host} is in a range the operator does not allow"
                              " (private, loopback, link-local, multicast or reserved)")
    if (host == "localhost" or host.endswith(".localhost")) and not policy.allow_loopback:
        raise EndpointRefused("localhost is a loopback host, which the operator does not allow")
