"""Error codes and exceptions shared by every Brook component.

An error that crosses a process boundary is a code (``proto.common_pb2.ErrorCode``,
Kafka's numbering) plus a human message. Inside a process it is a ``BrookError``
subclass carrying the same two things, so a storage error can be put on the wire
unchanged and a client can re-raise what the server said.
"""

from __future__ import annotations

from proto import common_pb2

ErrorCode = common_pb2.ErrorCode

# Trailing metadata of a request stream (ProduceStream) a broker refused before reading any of its
# messages (max.request.streams.per.ip, max.produce.streams): the client may send the same requests
# as unary calls.
STREAM_REFUSED_METADATA_KEY = "brook-stream-refused"

# Errors a client may retry (after refreshing metadata where the leader moved).
RETRIABLE: frozenset[int] = frozenset(
    {
        ErrorCode.CORRUPT_MESSAGE,  # Kafka treats it as retriable: corruption in transit
        ErrorCode.UNKNOWN_TOPIC_OR_PARTITION,  # may appear after metadata propagates
        ErrorCode.LEADER_NOT_AVAILABLE,
        ErrorCode.NOT_LEADER_OR_FOLLOWER,
        ErrorCode.REQUEST_TIMED_OUT,
        ErrorCode.BROKER_NOT_AVAILABLE,
        ErrorCode.REPLICA_NOT_AVAILABLE,
        ErrorCode.NETWORK_EXCEPTION,
        ErrorCode.COORDINATOR_LOAD_IN_PROGRESS,
        ErrorCode.COORDINATOR_NOT_AVAILABLE,
        ErrorCode.NOT_COORDINATOR,
        ErrorCode.NOT_ENOUGH_REPLICAS,
        ErrorCode.NOT_ENOUGH_REPLICAS_AFTER_APPEND,
        ErrorCode.NOT_CONTROLLER,
        ErrorCode.KAFKA_STORAGE_ERROR,
        ErrorCode.FENCED_LEADER_EPOCH,
        ErrorCode.UNKNOWN_LEADER_EPOCH,
        ErrorCode.OFFSET_NOT_AVAILABLE,
        ErrorCode.PREFERRED_LEADER_NOT_AVAILABLE,
        ErrorCode.ELIGIBLE_LEADERS_NOT_AVAILABLE,
        ErrorCode.REBALANCE_IN_PROGRESS,
        ErrorCode.THROTTLING_QUOTA_EXCEEDED,
    }
)


def code_name(code: int) -> str:
    try:
        return ErrorCode.Name(code)
    except ValueError:
        return f"UNKNOWN_ERROR_CODE({code})"


class BrookError(Exception):
    """Base of every Brook error: an ``ErrorCode`` plus a human message."""

    code: int = ErrorCode.UNKNOWN_SERVER_ERROR
    # A produce refused for some of its records (Kafka's KIP-467): (index of the record among the partition's
    # records in the request, why), as a Produce answer's record_errors lists them.
    record_errors: tuple[tuple[int, str], ...] = ()

    def __init__(self, message: str = "", *, code: int | None = None) -> None:
        if code is not None:
            self.code = code
        self.message = message or code_name(self.code)
        super().__init__(f"{code_name(self.code)}: {self.message}")

    @property
    def retriable(self) -> bool:
        return self.code in RETRIABLE

    @property
    def name(self) -> str:
        return code_name(self.code)


def _subclass(name: str) -> type[BrookError]:
    code = ErrorCode.Value(name)
    camel = "".join(part.capitalize() for part in name.split("_"))
    if not camel.endswith(("Error", "Exception")):
        camel += "Error"
    return type(camel, (BrookError,), {"code": code, "__doc__": f"Error code {name} ({code})."})


# One exception class per code, e.g. ``NotLeaderOrFollowerError``,
# ``OffsetOutOfRangeError``, ``InvalidTopicException``. Looked up by code with
# ``error_class``; named explicitly below for the ones code raises directly.
_BY_CODE: dict[int, type[BrookError]] = {}
for _name in ErrorCode.keys():
    if _name == "NONE":
        continue
    _cls = _subclass(_name)
    _BY_CODE[_cls.code] = _cls
    globals()[_cls.__name__] = _cls

UnknownServerError: type[BrookError] = _BY_CODE[ErrorCode.UNKNOWN_SERVER_ERROR]
OffsetOutOfRangeError: type[BrookError] = _BY_CODE[ErrorCode.OFFSET_OUT_OF_RANGE]
CorruptMessageError: type[BrookError] = _BY_CODE[ErrorCode.CORRUPT_MESSAGE]
UnknownTopicOrPartitionError: type[BrookError] = _BY_CODE[ErrorCode.UNKNOWN_TOPIC_OR_PARTITION]
NotLeaderOrFollowerError: type[BrookError] = _BY_CODE[ErrorCode.NOT_LEADER_OR_FOLLOWER]
RequestTimedOutError: type[BrookError] = _BY_CODE[ErrorCode.REQUEST_TIMED_OUT]
MessageTooLargeError: type[BrookError] = _BY_CODE[ErrorCode.MESSAGE_TOO_LARGE]
InvalidTopicException: type[BrookError] = _BY_CODE[ErrorCode.INVALID_TOPIC_EXCEPTION]
RecordListTooLargeError: type[BrookError] = _BY_CODE[ErrorCode.RECORD_LIST_TOO_LARGE]
NotEnoughReplicasError: type[BrookError] = _BY_CODE[ErrorCode.NOT_ENOUGH_REPLICAS]
InvalidRequiredAcksError: type[BrookError] = _BY_CODE[ErrorCode.INVALID_REQUIRED_ACKS]
TopicAlreadyExistsError: type[BrookError] = _BY_CODE[ErrorCode.TOPIC_ALREADY_EXISTS]
InvalidPartitionsError: type[BrookError] = _BY_CODE[ErrorCode.INVALID_PARTITIONS]
InvalidReplicationFactorError: type[BrookError] = _BY_CODE[ErrorCode.INVALID_REPLICATION_FACTOR]
InvalidConfigError: type[BrookError] = _BY_CODE[ErrorCode.INVALID_CONFIG]
NotControllerError: type[BrookError] = _BY_CODE[ErrorCode.NOT_CONTROLLER]
InvalidRequestError: type[BrookError] = _BY_CODE[ErrorCode.INVALID_REQUEST]
FencedLeaderEpochError: type[BrookError] = _BY_CODE[ErrorCode.FENCED_LEADER_EPOCH]
InvalidUpdateVersionError: type[BrookError] = _BY_CODE[ErrorCode.INVALID_UPDATE_VERSION]
FeatureUpdateFailedError: type[BrookError] = _BY_CODE[ErrorCode.FEATURE_UPDATE_FAILED]
UnsupportedVersionError: type[BrookError] = _BY_CODE[ErrorCode.UNSUPPORTED_VERSION]
KafkaStorageError: type[BrookError] = _BY_CODE[ErrorCode.KAFKA_STORAGE_ERROR]
InvalidRecordError: type[BrookError] = _BY_CODE[ErrorCode.INVALID_RECORD]
InvalidTimestampError: type[BrookError] = _BY_CODE[ErrorCode.INVALID_TIMESTAMP]
DuplicateBrokerRegistrationError: type[BrookError] = _BY_CODE[ErrorCode.DUPLICATE_BROKER_REGISTRATION]


class SslAuthenticationError(_BY_CODE[ErrorCode.SASL_AUTHENTICATION_FAILED]):  # type: ignore[misc,valid-type]
    """A TLS handshake the client could not complete: it does not trust the broker's certificate
    (``ssl.ca.location``), the certificate does not name the address, or the port does not speak TLS.
    Kafka's clients fail the operation at once with ``SslAuthenticationException`` (KIP-152): the same
    handshake would fail again. It shares the SASL failure's code (an authentication failure; there is no
    wire code for TLS), so what fails fast on a refused login fails fast on this too."""

    def __init__(self, message: str = "") -> None:
        super().__init__(message)
        Exception.__init__(self, f"SSL handshake failed: {self.message}")

    @property
    def name(self) -> str:
        return "SSL_AUTHENTICATION_FAILED"


def error_class(code: int) -> type[BrookError]:
    return _BY_CODE.get(code, UnknownServerError)


def error_for(code: int, message: str = "") -> BrookError:
    """The exception for a code received from the wire (keeps unknown codes' numbers)."""
    cls = _BY_CODE.get(code)
    if cls is None:
        return UnknownServerError(message or f"server sent unknown error code {code}", code=code)
    return cls(message)


def raise_for(code: int, message: str = "") -> None:
    """Raise the exception for ``code`` unless it is NONE."""
    if code != ErrorCode.NONE:
        raise error_for(code, message)
