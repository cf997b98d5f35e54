"""Client-side security: one ``SecurityConfig`` and one ``make_channel`` for every gRPC channel.

Configs use Kafka's client names so existing knowledge and property files carry over:

| key | values |
| --- | --- |
| ``security.protocol`` | PLAINTEXT (default), SSL, SASL_PLAINTEXT, SASL_SSL |
| ``ssl.ca.location`` | PEM file of the CA(s) that signed the brokers' certificates |
| ``ssl.certificate.location`` / ``ssl.key.location`` | this client's certificate and key (mTLS) |
| ``ssl.endpoint.identification.algorithm`` | ``https`` (default): the server certificate must name the host |
| ``sasl.mechanism`` | SCRAM-SHA-256 or SCRAM-SHA-512 |
| ``sasl.username`` / ``sasl.password`` | the SCRAM user |

Every place that opens a channel (client, controller client, replica fetchers, group
coordinator, launcher, CLI, Spark source) calls ``make_channel``, so TLS is never
forgotten on one path. SASL itself is layered on by the channel wrapper installed with
``set_sasl_channel_wrapper`` (the acl package's SCRAM client); a SASL_* protocol
without one installed is refused rather than silently sent unauthenticated.
Environment: ``SecurityConfig.from_env`` reads ``BROOK_SECURITY_PROTOCOL``,
``BROOK_SSL_CA_LOCATION``, ... (the key upper-cased, dots as underscores), next to
the CLI's ``BROOK_BOOTSTRAP``.
"""

from __future__ import annotations

import logging
import os
import ssl
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any

import grpc

from proto import errors

log = logging.getLogger(__name__)

PLAINTEXT = "PLAINTEXT"
SSL = "SSL"
SASL_PLAINTEXT = "SASL_PLAINTEXT"
SASL_SSL = "SASL_SSL"
PROTOCOLS = (PLAINTEXT, SSL, SASL_PLAINTEXT, SASL_SSL)
SASL_MECHANISMS = ("SCRAM-SHA-256", "SCRAM-SHA-512")
ENV_PREFIX = "BROOK_"
PEM_FILE_BYTES_MAX = 1024 * 1024  # a certificate chain is a few KB; refuse to read something else
# A client properties file is a few hundred bytes. Without a bound, a wrong path (a log, a disk
# image, /dev/zero) was read whole: 300 MB took 9.7 GB of memory and came back as a 1.2 GB error line.
PROPERTIES_FILE_BYTES_MAX = 1024 * 1024
ECHO_CHARS_MAX = 80  # of a bad line quoted in an error: enough to recognise it, never a wall of text

# Kafka config name -> SecurityConfig field.
CONFIG_KEYS: Mapping[str, str] = {
    "security.protocol": "protocol",
    "ssl.ca.location": "ssl_ca_location",
    "ssl.certificate.location": "ssl_certificate_location",
    "ssl.key.location": "ssl_key_location",
    "ssl.endpoint.identification.algorithm": "ssl_endpoint_identification_algorithm",
    "sasl.mechanism": "sasl_mechanism",
    "sasl.username": "sasl_username",
    "sasl.password": "sasl_password",
}


@dataclass(frozen=True)
class SecurityConfig:
    protocol: str = PLAINTEXT
    ssl_ca_location: str | None = None
    ssl_certificate_location: str | None = None
    ssl_key_location: str | None = None
    ssl_endpoint_identification_algorithm: str = "https"
    sasl_mechanism: str = "SCRAM-SHA-256"
    sasl_username: str | None = None
    sasl_password: str | None = field(default=None, repr=False)  # never in logs or reprs

    def __post_init__(self) -> None:
        protocol = self.protocol.strip().upper()
        object.__setattr__(self, "protocol", protocol)
        if protocol not in PROTOCOLS:
            raise errors.InvalidConfigError(f"security.protocol {self.protocol!r} must be one of "
                                            f"{', '.join(PROTOCOLS)}")
        if (self.ssl_certificate_location is None) != (self.ssl_key_location is None):
            raise errors.InvalidConfigError("ssl.certificate.location and ssl.key.location go together")
        algorithm = self.ssl_endpoint_identification_algorithm.strip().lower()
        if algorithm != "https":
            # gRPC's TLS always checks the server name; turning that off would need a
            # custom verifier. Certificates with the host in their SAN are the fix.
            raise errors.InvalidConfigError(
                f"ssl.endpoint.identification.algorithm {self.ssl_endpoint_identification_algorithm!r}: only "
                "'https' is supported (the broker certificate must name the host you connect to)")
        if self.uses_sasl:
            if self.sasl_mechanism.upper() not in SASL_MECHANISMS:
                raise errors.InvalidConfigError(f"sasl.mechanism {self.sasl_mechanism!r} must be one of "
                                                f"{', '.join(SASL_MECHANISMS)}")
            if not self.sasl_username or self.sasl_password is None:
                raise errors.InvalidConfigError(f"security.protocol {protocol} needs sasl.username and "
                                                "sasl.password")

    # ---- construction ----
    @classmethod
    def from_config(cls, config: Mapping[str, Any] | None) -> SecurityConfig:
        """From Kafka-named keys (``security.protocol``, ``ssl.*``, ``sasl.*``); other keys are ignored.

        Underscore spellings (``security_protocol``) are accepted too, as Python kwargs.
        """
        return PLAINTEXT_CONFIG.merged(config or {})

    @classmethod
    def from_env(cls, environ: Mapping[str, str] | None = None) -> SecurityConfig:
        env = os.environ if environ is None else environ
        config = {key: env[env_var(key)] for key in CONFIG_KEYS if env_var(key) in env}
        if config.get("sasl.username") and "security.protocol" not in config:
            config["security.protocol"] = SASL_PLAINTEXT  # a SCRAM user alone means SASL over plaintext
        return cls.from_config(config)

    @classmethod
    def from_properties(cls, path: str | Path) -> SecurityConfig:
        """From a Kafka-style client properties file (``key=value`` lines, ``#`` comments)."""
        return cls.from_config(read_properties(path))

    def merged(self, overrides: Mapping[str, Any]) -> SecurityConfig:
        """This config with the Kafka-named keys of ``overrides`` replacing ours."""
        values = {f.name: getattr(self, f.name) for f in fields(self)}
        for key, value in overrides.items():
            name = CONFIG_KEYS.get(str(key).replace("_", "."))
            # An empty identification algorithm is meaningful (Kafka's "off"), so it is
            # kept and refused; other empty values mean "not set".
            if name is not None and value is not None and (
                    str(value) != "" or name == "ssl_endpoint_identification_algorithm"):
                values[name] = str(value)
        return replace(self, **values)

    def to_config(self) -> dict[str, str]:
        """Back to Kafka-named keys (what a child process or Spark executor needs)."""
        out: dict[str, str] = {}
        for key, name in CONFIG_KEYS.items():
            value = getattr(self, name)
            if value is not None:
                out[key] = str(value)
        return out

    # ---- properties ----
    @property
    def uses_ssl(self) -> bool:
        return self.protocol in (SSL, SASL_SSL)

    @property
    def uses_sasl(self) -> bool:
        return self.protocol in (SASL_PLAINTEXT, SASL_SSL)

    def channel_credentials(self) -> grpc.ChannelCredentials:
        """TLS credentials from the configured PEM files (read now: a rotated file is used by new channels).
        Files that are not PEM certificates, a key that is not one or not the certificate's: INVALID_CONFIG naming
        the key now, not gRPC's handshake failures (and its C-core logging) on every call until a timeout."""
        ca = read_pem(self.ssl_ca_location, "ssl.ca.location") if self.ssl_ca_location else None
        cert = key = None
        if self.ssl_certificate_location and self.ssl_key_location:
            cert = read_pem(self.ssl_certificate_location, "ssl.certificate.location")
            key = read_pem(self.ssl_key_location, "ssl.key.location")
        check_pems(cert, key, ca, cert_name=f"ssl.certificate.location {self.ssl_certificate_location}",
                   key_name=f"ssl.key.location {self.ssl_key_location}", ca_name=f"ssl.ca.location {self.ssl_ca_location}")
        return grpc.ssl_channel_credentials(root_certificates=ca, private_key=key, certificate_chain=cert)

    def ssl_context(self) -> ssl.SSLContext:
        """The same TLS client side for an asyncio connection (the replication listener): the configured CA,
        this side's certificate when set, and the server's name checked as gRPC checks it."""
        ctx = ssl.create_default_context(ssl.Purpose.SERVER_AUTH, cafile=self.ssl_ca_location or None)
        ctx.minimum_version = ssl.TLSVersion.TLSv1_2
        if self.ssl_certificate_location and self.ssl_key_location:
            ctx.load_cert_chain(self.ssl_certificate_location, self.ssl_key_location)
        return ctx


PLAINTEXT_CONFIG = SecurityConfig()


def env_var(key: str) -> str:
    """``ssl.ca.location`` -> ``BROOK_SSL_CA_LOCATION``."""
    return ENV_PREFIX + key.replace(".", "_").upper()


def read_properties(path: str | Path) -> dict[str, str]:
    """``key=value`` lines of a client properties file (UTF-8, at most PROPERTIES_FILE_BYTES_MAX bytes)."""
    p = Path(path)
    try:
        data = read_bounded(p, PROPERTIES_FILE_BYTES_MAX)
    except OSError as e:
        raise errors.InvalidConfigError(f"cannot read client config {p}: {e.strerror or e}") from None
    if data is None:
        raise errors.InvalidConfigError(f"client config {p} is larger than {PROPERTIES_FILE_BYTES_MAX} bytes: "
                                        "not a properties file")
    try:
        text = data.decode()
    except UnicodeDecodeError as e:
        line = data.count(b"\n", 0, e.start) + 1
        raise errors.InvalidConfigError(f"client config {p}:{line}: not UTF-8 text (byte 0x{data[e.start]:02x} "
                                        f"at offset {e.start})") from None
    text = text.removeprefix("\ufeff")  # a BOM (some editors write one) would become part of the first key
    out: dict[str, str] = {}
    for number, line in enumerate(text.splitlines(), 1):
        line = line.strip()
        if not line or line.startswith(("#", "!")):
            continue
        key, sep, value = line.partition("=")
        if not sep:
            # Quoted so the user sees which line; not one that may hold a secret (`sasl.password: x`).
            got = "a line with a password (not shown)" if "password" in line.lower() else excerpt(line)
            raise errors.InvalidConfigError(f"{p}:{number}: expected key=value, got {got}")
        out[key.strip()] = value.strip()
    return out


def read_bounded(path: Path, limit: int) -> bytes | None:
    """The bytes of ``path``, or None when it holds more than ``limit``. Reads at most ``limit + 1``
    bytes, so a huge file, a device (/dev/zero: st_size 0) or a pipe costs no more than that."""
    with path.open("rb") as f:
        data = f.read(limit + 1)
    return None if len(data) > limit else data


def excerpt(text: str, limit: int = ECHO_CHARS_MAX) -> str:
    """``text`` quoted for an error message, cut to about ``limit`` characters."""
    if len(text) <= limit:
        return repr(text)
    return repr(text[:limit])[:limit + 1] + "..."


def check_pems(cert: bytes | None, key: bytes | None, ca: bytes | None, *, cert_name: str = "the certificate",
               key_name: str = "the private key", ca_name: str = "the CA bundle") -> None:
    """INVALID_CONFIG naming the first of these PEM files that does not hold what it should (certificates, an
    unencrypted private key), or a key that does not belong to the certificate (the first one of its chain)."""
    from cryptography import x509  # the TLS paths only: plaintext clients never load it
    from cryptography.hazmat.primitives import serialization

    def spki(public_key: Any) -> bytes:
        return public_key.public_bytes(serialization.Encoding.DER, serialization.PublicFormat.SubjectPublicKeyInfo)
    leaf = None
    for data, name, what in ((cert, cert_name, "certificate"), (ca, ca_name, "CA certificate")):
        if data is None:
            continue
        try:
            found = x509.load_pem_x509_certificates(data)
        except ValueError as e:
            raise errors.InvalidConfigError(f"{name} holds no PEM {what}: {e}") from None
        if what == "certificate":
            leaf = found[0]
    if key is not None:
        try:
            private = serialization.load_pem_private_key(key, password=None)
        except (ValueError, TypeError) as e:  # TypeError: an encrypted key (no password is ever given)
            raise errors.InvalidConfigError(f"{key_name} holds no unencrypted PEM private key: {e}") from None
        if leaf is not None and spki(private.public_key()) != spki(leaf.public_key()):
            raise errors.InvalidConfigError(f"{key_name} is not the private key of {cert_name}")


def read_pem(location: str | Path, key: str) -> bytes:
    """The PEM file at ``location`` (bounded read); INVALID_CONFIG naming ``key`` when it cannot be read."""
    path = Path(location)
    try:
        data = read_bounded(path, PEM_FILE_BYTES_MAX)
    except OSError as e:
        raise errors.InvalidConfigError(f"{key}: cannot read {path}: {e.strerror or e}") from None
    if data is None:
        raise errors.InvalidConfigError(f"{key} {path} is larger than {PEM_FILE_BYTES_MAX} bytes")
    return data


# ----------------------------------------------------------------------------- SASL hook

# fn(channel, security, address) -> the channel with SASL on it (e.g. the acl package's
# ``scram_channel(address, ScramCredentials(...), raw=channel)``); the transport under
# it is already TLS for SASL_SSL.
SaslChannelWrapper = Callable[[grpc.Channel, SecurityConfig, str], grpc.Channel]
_sasl_wrapper: SaslChannelWrapper | None = None


def set_sasl_channel_wrapper(fn: SaslChannelWrapper | None) -> None:
    """Install the SASL client side make_channel uses for SASL_* protocols (None: client/sasl.py's SCRAM)."""
    global _sasl_wrapper
    _sasl_wrapper = fn


# ----------------------------------------------------------------------------- channels


def _open(api: Any, address: str, sec: SecurityConfig, options: Sequence[tuple[str, Any]] | None) -> Any:
    """A channel of ``api`` (grpc or grpc.aio, which share these two constructors) with ``sec``'s transport."""
    if sec.uses_ssl:
        return api.secure_channel(address, sec.channel_credentials(), options=list(options or []))
    return api.insecure_channel(address, options=list(options or []))


def make_transport_channel(address: str, security: SecurityConfig | None = None,
                           options: Sequence[tuple[str, Any]] | None = None) -> grpc.Channel:
    """A channel to ``address`` with the transport ``security`` asks for (TLS or none) and no SASL:
    what a SASL session's own exchange runs over."""
    return _open(grpc, address, security or PLAINTEXT_CONFIG, options)


def make_aio_channel(address: str, security: SecurityConfig | None = None,
                     options: Sequence[tuple[str, Any]] | None = None) -> grpc.aio.Channel:
    """A grpc.aio channel to ``address`` with the transport ``security`` asks for; call it on the event
    loop that will use the channel. SASL is the caller's: its calls carry the session token as
    metadata (client/sasl.py's ``ScramSession.token``)."""
    return _open(grpc.aio, address, security or PLAINTEXT_CONFIG, options)


def make_channel(address: str, security: SecurityConfig | None = None,
                 options: Sequence[tuple[str, Any]] | None = None,
                 interceptors: Sequence[Any] = ()) -> grpc.Channel:
    """A gRPC channel to ``address`` ("host:port") secured as ``security`` says."""
    sec = security or PLAINTEXT_CONFIG
    channel = make_transport_channel(address, sec, options)
    if sec.uses_sasl:
        wrapper = _sasl_wrapper
        if wrapper is None:  # Brook's own SCRAM client (client/sasl.py), unless another was installed
            from client.sasl import sasl_channel_wrapper as wrapper
        channel = wrapper(channel, sec, address)
    if interceptors:
        channel = grpc.intercept_channel(channel, *interceptors)
    return channel
