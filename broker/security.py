"""Wiring of authentication, authorization and quotas into a node's gRPC servers.

One place builds, from the node config's defaults, what a broker or a controller needs:
the SCRAM authenticator (its sessions resolve principals), the Authorizer (ACLs from
the node's view of the quorum), the quota manager (brokers), the server interceptor
refusing stale session tokens, and the SecurityService servicer.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import grpc

from broker.authorizer import AclIndex, Authorizer, AuthorizerConfig
from broker.principal import Principal, node_id_of
from broker.quotas import DEFAULT_WINDOW_NUM, QuotaManager
from broker.sasl import (
    DEFAULT_SESSION_LIFETIME_MS,
    AioSessionInterceptor,
    ScramAuthenticator,
    SessionInterceptor,
)
from metadata_quorum.security import ScramCredential
from proto import security_pb2_grpc

log = logging.getLogger(__name__)

def is_node_principal(principal: object) -> bool:
    """A broker's own principal (broker/principal.py node_principal, from its mTLS certificate).

    SCRAM users cannot take the default ``node-<id>`` names (metadata_quorum/security.py),
    so only a node's certificate can carry one.
    """
    return isinstance(principal, Principal) and node_id_of(principal) is not None


@dataclass
class NodeSecurity:
    authenticator: ScramAuthenticator
    authorizer: Authorizer
    interceptor: SessionInterceptor
    quotas: QuotaManager | None = None
    # Connections ended because the listener's CA bundle no longer trusts their client certificate
    # (broker/cert_revocation.py), on every listener of the node.
    certificates_revoked_total: int = 0

    def certificate_revoked(self) -> None:
        self.certificates_revoked_total += 1

    def aio_interceptor(self) -> AioSessionInterceptor:
        """The same session check for a grpc.aio server (the broker's, once it runs on asyncio)."""
        return AioSessionInterceptor(self.authenticator)

    def add_service(self, server: grpc.Server, admin: Any = None) -> None:
        from metadata_quorum.security_service import SecurityService

        security_pb2_grpc.add_SecurityServiceServicer_to_server(
            SecurityService(self.authenticator, self.authorizer, admin), server)

    def close(self) -> None:
        self.authenticator.uninstall()


def node_security(defaults: dict[str, str], *, credentials: Callable[[str, str], ScramCredential | None],
                  acls: Callable[[], AclIndex], quotas: Callable[[str], dict[str, float] | None] | None = None,
                  ready: Callable[[], bool] | None = None) -> NodeSecurity:
    authenticator = ScramAuthenticator(
        credentials, session_lifetime_ms=int(defaults.get("sasl.session.lifetime.ms",
                                                          str(DEFAULT_SESSION_LIFETIME_MS))), ready=ready)
    authenticator.install()
    authorizer = Authorizer(AuthorizerConfig.from_defaults(defaults), acls, is_node_principal)
    if authorizer.enabled and not defaults.get("inter.broker.sasl.username", "").strip():
        log.warning("authorizer enabled without inter.broker.sasl.username: brokers need another principal "
                    "allowed CLUSTER_ACTION (mTLS node certificates or super.users) to register and replicate")
    manager = None
    if quotas is not None:
        manager = QuotaManager(quotas, window_num=int(defaults.get("quota.window.num", str(DEFAULT_WINDOW_NUM))),
                               window_size_s=float(defaults.get("quota.window.size.seconds", "1")))
    return NodeSecurity(authenticator, authorizer, SessionInterceptor(authenticator), manager)


def broker_security(cache: Any, defaults: dict[str, str]) -> NodeSecurity:
    """A broker's: credentials, ACLs and quotas from its metadata cache."""
    # Users come with the metadata: before the first update (a restart), the broker knows none yet.
    return node_security(defaults, credentials=cache.scram_credential, acls=cache.acl_index, quotas=cache.quotas,
                         ready=lambda: cache.version > 0)
