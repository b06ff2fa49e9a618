"""Where a completion callback may go. A callback makes the service send a request of the submitter's choosing
from inside the deployment's network (server-side request forgery): only http and https, only to a host the
operator lists in ``MERGE_SERVICE_CALLBACK_ALLOWED_HOSTS`` (by name, ``*.domain`` or network), and never to a
loopback, private, link-local, multicast, reserved or unspecified address unless a listed network contains it.
The URL's host is checked at submission; the addresses its name resolves to are checked again at every send,
since DNS may answer differently by then, and the request goes to the address that was checked."""

from __future__ import annotations

import re
import socket
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from functools import lru_cache
from ipaddress import IPv4Address, IPv4Network, IPv6Address, IPv6Network, ip_address, ip_network
from typing import TYPE_CHECKING
from urllib.parse import SplitResult, urlsplit, urlunsplit

from service.errors import RequestValidationProblem

if TYPE_CHECKING:
    from service.settings import Settings

IpAddress = IPv4Address | IPv6Address
IpNetwork = IPv4Network | IPv6Network

MAX_URL_LENGTH = 2048
SCHEMES = frozenset({"http", "https"})
DEFAULT_PORTS = {"http": 80, "https": 443}
FORBIDDEN_KINDS = (
    ("unspecified", "is_unspecified"),
    ("loopback", "is_loopback"),
    ("link-local", "is_link_local"),
    ("multicast", "is_multicast"),
    ("reserved", "is_reserved"),
    ("private", "is_private"),
)
"""Checked in this order, so an address is named by its most telling kind (0.0.0.0 and 240.0.0.1 are also
"private" to Python's ``ipaddress``)."""
LABEL = r"[a-z0-9_]([a-z0-9_-]{0,61}[a-z0-9_])?"
HOST_NAME = re.compile(rf"(?=.{{1,253}}$){LABEL}(\.{LABEL})*")
WILDCARD = "*."
LEGACY_IPV4 = re.compile(r"[0-9a-fx.]+")
"""Forms such as ``2130706433``, ``0x7f.1`` or ``127.1``, which resolvers read as IPv4 addresses."""


class CallbackUrlError(ValueError):
    """A callback URL that is malformed or points where callbacks may not go; the message says which."""


def forbidden_kind(address: IpAddress) -> str | None:
    """What makes an address internal, or None for a public one. An IPv4 address written as IPv6
    (``::ffff:10.0.0.1``) is judged as the IPv4 address it reaches."""
    if isinstance(address, IPv6Address) and address.ipv4_mapped is not None:
        return forbidden_kind(address.ipv4_mapped)
    for kind, attribute in FORBIDDEN_KINDS:
        if getattr(address, attribute):
            return kind
    if isinstance(address, IPv6Address) and address.is_site_local:
        return "site-local"
    if not address.is_global:
        return "not globally routable"
    return None


@dataclass(frozen=True)
class Allowlist:
    """The hosts callbacks may go to (``MERGE_SERVICE_CALLBACK_ALLOWED_HOSTS``): exact host names, networks (an
    address is a network of one), and ``*.domain`` wildcards, which match every name below the domain but not
    the domain itself. A listed name still may not reach an internal address unless a listed network holds it."""

    hosts: frozenset[str] = frozenset()
    networks: tuple[IpNetwork, ...] = ()
    domains: frozenset[str] = frozenset()
    """The domains of the wildcard entries, without their ``*.``."""

    @classmethod
    def parse(cls, entries: Iterable[str]) -> Allowlist:
        hosts: set[str] = set()
        domains: set[str] = set()
        networks: list[IpNetwork] = []
        for entry in entries:
            text = entry.strip().lower().rstrip(".")
            try:
                networks.append(ip_network(text.strip("[]"), strict=False))
                continue
            except ValueError:
                pass
            wildcard = text.startswith(WILDCARD)
            name = text.removeprefix(WILDCARD)
            if not HOST_NAME.fullmatch(name):
                raise ValueError(
                    f"callback_allowed_hosts: {entry!r} is neither a host name, a *.domain nor an IP network"
                )
            (domains if wildcard else hosts).add(name)
        return cls(frozenset(hosts), tuple(networks), frozenset(domains))

    def __bool__(self) -> bool:
        return bool(self.hosts or self.networks or self.domains)

    def lists(self, target: CallbackTarget) -> bool:
        """Whether the URL's host is one the operator listed: an address by a network, a name by name or domain."""
        if target.literal is not None:
            return self.allows_address(target.literal)
        host = target.host
        return host in self.hosts or any(host.endswith(f".{domain}") for domain in self.domains)

    def allows_address(self, address: IpAddress) -> bool:
        if (
            isinstance(address, IPv6Address)
            and address.ipv4_mapped is not None
            and self.allows_address(address.ipv4_mapped)
        ):
            return True
        return any(address.version == n.version and address in n for n in self.networks)


@dataclass(frozen=True)
class CallbackTarget:
    """A parsed callback URL: ``host`` is lower case and ASCII (IDNA), without brackets."""

    url: str
    parts: SplitResult
    scheme: str
    host: str
    port: int
    literal: IpAddress | None
    """The address the URL names directly, if it names one (in any form a resolver accepts)."""

    def url_for(self, address: IpAddress) -> str:
        """The same URL aimed at one address: the request goes where the check looked, not where a second DNS
        answer would send it."""
        where = f"[{address}]" if address.version == 6 else str(address)
        if self.parts.port is not None:
            where = f"{where}:{self.port}"
        return urlunsplit((self.scheme, where, self.parts.path or "/", self.parts.query, ""))

    @property
    def host_header(self) -> str:
        host = f"[{self.host}]" if ":" in self.host else self.host
        return host if self.parts.port is None else f"{host}:{self.port}"


def _literal_address(host: str) -> IpAddress | None:
    try:
        return ip_address(host)
    except ValueError:
        pass
    if LEGACY_IPV4.fullmatch(host):
        try:
            return IPv4Address(socket.inet_aton(host))
        except OSError:
            return None
    return None


def parse_callback_url(url: str) -> CallbackTarget:
    """Check a callback URL's form. Raises ``CallbackUrlError`` saying what is wrong."""
    if len(url) > MAX_URL_LENGTH:
        raise CallbackUrlError(f"the URL is longer than {MAX_URL_LENGTH} characters")
    if any(c.isspace() or ord(c) < 32 or ord(c) == 127 for c in url):
        raise CallbackUrlError("the URL contains whitespace or control characters")
    try:
        parts = urlsplit(url)
        port = parts.port
    except ValueError as exc:
        raise CallbackUrlError(f"the URL is malformed: {exc}") from exc
    scheme = parts.scheme.lower()
    if scheme not in SCHEMES:
        raise CallbackUrlError(f"the scheme must be http or https, not {parts.scheme or 'none'!r}")
    if parts.username is not None or parts.password is not None:
        raise CallbackUrlError("the URL may not carry credentials (user:password@); verify the signature instead")
    raw_host = parts.hostname
    if not raw_host:
        raise CallbackUrlError("the URL names no host")
    literal = _literal_address(raw_host.split("%", 1)[0])
    if literal is not None:
        host = str(literal)
    else:
        try:
            host = raw_host.encode("idna").decode("ascii").lower().rstrip(".")
        except UnicodeError as exc:
            raise CallbackUrlError(f"the host {raw_host!r} is not a valid host name") from exc
        if not HOST_NAME.fullmatch(host):
            raise CallbackUrlError(f"the host {raw_host!r} is not a valid host name")
    return CallbackTarget(
        url=url,
        parts=parts,
        scheme=scheme,
        host=host,
        port=port if port is not None else DEFAULT_PORTS[scheme],
        literal=literal,
    )


def _refusal(target: CallbackTarget, address: IpAddress, kind: str) -> CallbackUrlError:
    named = str(address) if target.literal is not None else f"{target.host} resolves to {address}, which"
    return CallbackUrlError(
        f"{named} is a {kind} address; callbacks may not go to internal addresses unless a network in "
        "MERGE_SERVICE_CALLBACK_ALLOWED_HOSTS contains them"
    )


_LOOPBACKS = (ip_address("127.0.0.1"), ip_address("::1"))


def _is_localhost(host: str) -> bool:
    """``localhost`` and its subdomains always mean this machine (RFC 6761), whatever DNS says."""
    return host == "localhost" or host.endswith(".localhost")


def check_literal_host(target: CallbackTarget, allowlist: Allowlist) -> None:
    """A URL whose host is an internal address outside the listed networks, or ``localhost`` unless both its name
    and a loopback network are listed (its addresses are loopback whatever DNS says), is refused without asking
    DNS."""
    if target.literal is not None:
        kind = forbidden_kind(target.literal)
        if kind is not None and not allowlist.allows_address(target.literal):
            raise _refusal(target, target.literal, kind)
    elif _is_localhost(target.host) and not (
        allowlist.lists(target) and any(allowlist.allows_address(a) for a in _LOOPBACKS)
    ):
        raise CallbackUrlError(
            f"{target.host} is a loopback name; callbacks may not go to internal addresses unless "
            "MERGE_SERVICE_CALLBACK_ALLOWED_HOSTS lists the name and a loopback network (127.0.0.1, ::1)"
        )


def check_listed(target: CallbackTarget, allowlist: Allowlist) -> None:
    """The allowlist itself: a host the operator did not list is refused, and an empty list refuses every one."""
    if not allowlist:
        raise CallbackUrlError(
            "this deployment allows callbacks to no host (MERGE_SERVICE_CALLBACK_ALLOWED_HOSTS is empty)"
        )
    if not allowlist.lists(target):
        raise CallbackUrlError(
            f"the host {target.host} is not allowed: MERGE_SERVICE_CALLBACK_ALLOWED_HOSTS lists neither it, a "
            "*.domain above it nor a network holding it"
        )


def resolve_addresses(target: CallbackTarget, allowlist: Allowlist) -> Sequence[IpAddress]:
    """The send's check: the host must still be listed, and every address it resolves to now must be public or
    inside a listed network (one internal answer among public ones is enough to refuse, as a resolver may hand
    out either). Raises ``CallbackUrlError`` when refused and ``OSError`` when the name does not resolve (which
    may pass)."""
    check_literal_host(target, allowlist)
    check_listed(target, allowlist)
    if target.literal is not None:
        return [target.literal]
    addresses: list[IpAddress] = []
    for *_, sockaddr in socket.getaddrinfo(target.host, target.port, type=socket.SOCK_STREAM):
        address = ip_address(str(sockaddr[0]).split("%", 1)[0])
        if address not in addresses:
            addresses.append(address)
    if not addresses:
        raise OSError(f"{target.host} resolves to no address")
    for address in addresses:
        kind = forbidden_kind(address)
        if kind is not None and not allowlist.allows_address(address):
            raise _refusal(target, address, kind)
    return addresses


@lru_cache(maxsize=8)
def _allowlist(entries: tuple[str, ...]) -> Allowlist:
    return Allowlist.parse(entries)


def allowlist_of(settings: Settings) -> Allowlist:
    return _allowlist(tuple(settings.callback_allowed_hosts))


def check_target(target: CallbackTarget, settings: Settings) -> None:
    """The checks that need no DNS: the host is listed, and is no internal address outside a listed network."""
    allowlist = allowlist_of(settings)
    check_literal_host(target, allowlist)
    check_listed(target, allowlist)


def check_submission(url: str | None, scope: str, settings: Settings) -> str | None:
    """The callback URL of a new job of the caller ``scope`` (a token's fingerprint): the spec's, else its token's
    own (``callback_tokens``), else None. Refuses, naming the ``callback`` field, a URL that is malformed, whose
    host is not allowed, or that no key would sign."""
    from service.callback_keys import default_url, signing_key

    if url is None:
        url = default_url(settings, scope)
        if url is None:
            return None
    if signing_key(settings, scope) is None:
        raise RequestValidationProblem(
            "callback",
            "callback: this deployment has no key to sign this token's callbacks (MERGE_SERVICE_CALLBACK_TOKENS "
            "gives it no secret and MERGE_SERVICE_CALLBACK_SECRET is not set)",
            title="Invalid callback",
        )
    try:
        check_target(parse_callback_url(url), settings)
    except CallbackUrlError as exc:
        raise RequestValidationProblem("callback", f"callback: {exc}", title="Invalid callback") from exc
    return url
