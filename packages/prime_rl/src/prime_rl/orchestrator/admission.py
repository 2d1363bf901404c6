"""Who may create an identity: pluggable admission for ``POST /workers/register``.

Identities cost nothing to make, so what an identity is worth is decided here. Three admission
rules, each on when configured, all of which a registration must pass:

  - ``orchestrator.registration_token``: the ``Authorization: Bearer`` token (401 otherwise);
  - ``orchestrator.registration_allowlist``: client addresses or networks (``10.0.0.0/8``,
    ``2001:db8::/48``, ``203.0.113.7``) that may register (403 ``forbidden`` otherwise);
  - ``orchestrator.registration_hook``: ``"package.module:function"``, called as
    ``function(name=..., address=..., headers=...)`` for every registration that passed the
    others; it returns True to admit, or False / raises ``AdmissionRefused`` (message shown) to
    refuse (403). The place for stake checks or a proof of work in a request header. Any other
    exception refuses too (logged), so a faulty hook fails closed.

With none configured anyone may register (``open``). That is the default only on a loopback bind:
an orchestrator bound to another address refuses to start (``check_admission``) unless one rule
is configured or ``orchestrator.open_registration = true`` says, explicitly, that anyone may.
"""

from __future__ import annotations

import importlib
import ipaddress
import logging
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from prime_rl.api.errors import ApiFailure
from prime_rl.api.secrets import SecretsError, is_loopback
from prime_rl.config.sections import OrchestratorConfig

__all__ = ["Admission", "AdmissionError", "AdmissionRefused", "check_admission", "load_admission"]

log = logging.getLogger(__name__)

Network = ipaddress.IPv4Network | ipaddress.IPv6Network


class AdmissionError(SecretsError):
    """The admission settings are unusable, or would let anyone register off loopback."""


class AdmissionRefused(Exception):
    """Raised by a registration hook to refuse a registration; its message goes to the client."""


@dataclass(frozen=True)
class Admission:
    """The configured allow-list and hook (the token is checked by the HTTP layer, first)."""

    allowlist: tuple[Network, ...] = ()
    hook: Callable[..., Any] | None = None

    def admit(self, name: str, address: str, headers: Mapping[str, str]) -> None:
        """ApiFailure 403 ``forbidden`` when the allow-list or the hook refuses ``address``."""
        if self.allowlist and not _listed(address, self.allowlist):
            raise ApiFailure(403, "forbidden", f"client address {address} may not register (registration_allowlist)")
        if self.hook is None:
            return
        try:
            admitted = self.hook(name=name, address=address, headers=headers)
        except AdmissionRefused as refused:
            raise ApiFailure(403, "forbidden", f"registration refused: {refused}") from None
        except Exception:
            log.exception("registration hook failed; refusing")
            admitted = False
        if admitted is not True:
            raise ApiFailure(403, "forbidden", "registration refused by the admission hook (registration_hook)")


def _listed(address: str, allowlist: tuple[Network, ...]) -> bool:
    try:
        ip = ipaddress.ip_address(address.split("%", 1)[0])
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        ip = ip.ipv4_mapped
    return any(ip.version == network.version and ip in network for network in allowlist)


def load_admission(orch: OrchestratorConfig) -> Admission:
    """The configured allow-list and hook; ``AdmissionError`` names a bad network or hook."""
    networks = []
    for entry in orch.registration_allowlist:
        try:
            networks.append(ipaddress.ip_network(entry, strict=False))
        except ValueError as error:
            raise AdmissionError(f"orchestrator.registration_allowlist entry {entry!r}: {error}") from None
    hook = None
    if orch.registration_hook:
        module_name, _, attribute = orch.registration_hook.partition(":")
        try:
            hook = getattr(importlib.import_module(module_name), attribute)
        except (ImportError, AttributeError, ValueError) as error:
            raise AdmissionError(
                f"orchestrator.registration_hook {orch.registration_hook!r} cannot be loaded "
                f"(want 'package.module:function'): {error}"
            ) from None
        if not callable(hook):
            raise AdmissionError(f"orchestrator.registration_hook {orch.registration_hook!r} is not callable")
    return Admission(tuple(networks), hook)


def check_admission(orch: OrchestratorConfig) -> None:
    """``AdmissionError`` when the orchestrator would let anyone register from another machine
    without ``open_registration`` saying so (and when the allow-list or hook cannot be loaded)."""
    load_admission(orch)
    restricted = bool(orch.registration_token or orch.registration_allowlist or orch.registration_hook)
    if not restricted and not orch.open_registration and not is_loopback(orch.host):
        raise AdmissionError(
            f"orchestrator.host = {orch.host!r} accepts workers from other machines, and with no "
            "orchestrator.registration_token, registration_allowlist or registration_hook anyone could make "
            "identities; configure one (a public run: the hook, e.g. stake or proof of work, or a token handed "
            "out per participant), or set orchestrator.open_registration = true to accept anyone"
        )
