from proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class Redirect(_message.Message):
    __slots__ = ("leader_id", "leader")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    leader: _common_pb2.Endpoint
    def __init__(self, leader_id: _Optional[int] = ..., leader: _Optional[_Union[_common_pb2.Endpoint, _Mapping]] = ...) -> None: ...

class SaslAuthenticateRequest(_message.Message):
    __slots__ = ("mechanism", "auth_bytes", "exchange_id")
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    AUTH_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_ID_FIELD_NUMBER: _ClassVar[int]
    mechanism: str
    auth_bytes: bytes
    exchange_id: str
    def __init__(self, mechanism: _Optional[str] = ..., auth_bytes: _Optional[bytes] = ..., exchange_id: _Optional[str] = ...) -> None: ...

class SaslAuthenticateResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "auth_bytes", "exchange_id", "session_token", "session_lifetime_ms")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    AUTH_BYTES_FIELD_NUMBER: _ClassVar[int]
    EXCHANGE_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TOKEN_FIELD_NUMBER: _ClassVar[int]
    SESSION_LIFETIME_MS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    auth_bytes: bytes
    exchange_id: str
    session_token: str
    session_lifetime_ms: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., auth_bytes: _Optional[bytes] = ..., exchange_id: _Optional[str] = ..., session_token: _Optional[str] = ..., session_lifetime_ms: _Optional[int] = ...) -> None: ...

class ScramCredentialRecord(_message.Message):
    __slots__ = ("user", "mechanism", "salt", "stored_key", "server_key", "iterations")
    USER_FIELD_NUMBER: _ClassVar[int]
    MECHANISM_FIELD_NUMBER: _ClassVar[int]
    SALT_FIELD_NUMBER: _ClassVar[int]
    STORED_KEY_FIELD_NUMBER: _ClassVar[int]
    SERVER_KEY_FIELD_NUMBER: _ClassVar[int]
    ITERATIONS_FIELD_NUMBER: _ClassVar[int]
    user: str
    mechanism: str
    salt: bytes
    stored_key: bytes
    server_key: bytes
    iterations: int
    def __init__(self, user: _Optional[str] = ..., mechanism: _Optional[str] = ..., salt: _Optional[bytes] = ..., stored_key: _Optional[bytes] = ..., server_key: _Optional[bytes] = ..., iterations: _Optional[int] = ...) -> None: ...

class UpsertScramCredentialsRequest(_message.Message):
    __slots__ = ("credentials",)
    CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    credentials: _containers.RepeatedCompositeFieldContainer[ScramCredentialRecord]
    def __init__(self, credentials: _Optional[_Iterable[_Union[ScramCredentialRecord, _Mapping]]] = ...) -> None: ...

class DeleteScramCredentialsRequest(_message.Message):
    __slots__ = ("items",)
    class Item(_message.Message):
        __slots__ = ("user", "mechanism")
        USER_FIELD_NUMBER: _ClassVar[int]
        MECHANISM_FIELD_NUMBER: _ClassVar[int]
        user: str
        mechanism: str
        def __init__(self, user: _Optional[str] = ..., mechanism: _Optional[str] = ...) -> None: ...
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    items: _containers.RepeatedCompositeFieldContainer[DeleteScramCredentialsRequest.Item]
    def __init__(self, items: _Optional[_Iterable[_Union[DeleteScramCredentialsRequest.Item, _Mapping]]] = ...) -> None: ...

class AlterScramCredentialsRequest(_message.Message):
    __slots__ = ("users",)
    class UserAlteration(_message.Message):
        __slots__ = ("user", "upsertions", "deletions")
        USER_FIELD_NUMBER: _ClassVar[int]
        UPSERTIONS_FIELD_NUMBER: _ClassVar[int]
        DELETIONS_FIELD_NUMBER: _ClassVar[int]
        user: str
        upsertions: _containers.RepeatedCompositeFieldContainer[ScramCredentialRecord]
        deletions: _containers.RepeatedCompositeFieldContainer[DeleteScramCredentialsRequest.Item]
        def __init__(self, user: _Optional[str] = ..., upsertions: _Optional[_Iterable[_Union[ScramCredentialRecord, _Mapping]]] = ..., deletions: _Optional[_Iterable[_Union[DeleteScramCredentialsRequest.Item, _Mapping]]] = ...) -> None: ...
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedCompositeFieldContainer[AlterScramCredentialsRequest.UserAlteration]
    def __init__(self, users: _Optional[_Iterable[_Union[AlterScramCredentialsRequest.UserAlteration, _Mapping]]] = ...) -> None: ...

class ScramCredentialsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: Redirect
    results: _containers.RepeatedCompositeFieldContainer[ItemResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[Redirect, _Mapping]] = ..., results: _Optional[_Iterable[_Union[ItemResult, _Mapping]]] = ...) -> None: ...

class ItemResult(_message.Message):
    __slots__ = ("name", "error_code", "error_message")
    NAME_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    name: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, name: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DescribeUsersRequest(_message.Message):
    __slots__ = ("users",)
    USERS_FIELD_NUMBER: _ClassVar[int]
    users: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, users: _Optional[_Iterable[str]] = ...) -> None: ...

class UserDescription(_message.Message):
    __slots__ = ("user", "mechanisms")
    class Mechanism(_message.Message):
        __slots__ = ("mechanism", "iterations")
        MECHANISM_FIELD_NUMBER: _ClassVar[int]
        ITERATIONS_FIELD_NUMBER: _ClassVar[int]
        mechanism: str
        iterations: int
        def __init__(self, mechanism: _Optional[str] = ..., iterations: _Optional[int] = ...) -> None: ...
    USER_FIELD_NUMBER: _ClassVar[int]
    MECHANISMS_FIELD_NUMBER: _ClassVar[int]
    user: str
    mechanisms: _containers.RepeatedCompositeFieldContainer[UserDescription.Mechanism]
    def __init__(self, user: _Optional[str] = ..., mechanisms: _Optional[_Iterable[_Union[UserDescription.Mechanism, _Mapping]]] = ...) -> None: ...

class DescribeUsersResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "users")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    USERS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: Redirect
    users: _containers.RepeatedCompositeFieldContainer[UserDescription]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[Redirect, _Mapping]] = ..., users: _Optional[_Iterable[_Union[UserDescription, _Mapping]]] = ...) -> None: ...

class AclBinding(_message.Message):
    __slots__ = ("resource_type", "resource_name", "pattern_type", "principal", "host", "operation", "permission")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    host: str
    operation: str
    permission: str
    def __init__(self, resource_type: _Optional[str] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[str] = ..., principal: _Optional[str] = ..., host: _Optional[str] = ..., operation: _Optional[str] = ..., permission: _Optional[str] = ...) -> None: ...

class AclFilter(_message.Message):
    __slots__ = ("resource_type", "resource_name", "pattern_type", "principal", "operation", "permission", "host")
    RESOURCE_TYPE_FIELD_NUMBER: _ClassVar[int]
    RESOURCE_NAME_FIELD_NUMBER: _ClassVar[int]
    PATTERN_TYPE_FIELD_NUMBER: _ClassVar[int]
    PRINCIPAL_FIELD_NUMBER: _ClassVar[int]
    OPERATION_FIELD_NUMBER: _ClassVar[int]
    PERMISSION_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    resource_type: str
    resource_name: str
    pattern_type: str
    principal: str
    operation: str
    permission: str
    host: str
    def __init__(self, resource_type: _Optional[str] = ..., resource_name: _Optional[str] = ..., pattern_type: _Optional[str] = ..., principal: _Optional[str] = ..., operation: _Optional[str] = ..., permission: _Optional[str] = ..., host: _Optional[str] = ...) -> None: ...

class CreateAclsRequest(_message.Message):
    __slots__ = ("acls",)
    ACLS_FIELD_NUMBER: _ClassVar[int]
    acls: _containers.RepeatedCompositeFieldContainer[AclBinding]
    def __init__(self, acls: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ...) -> None: ...

class DescribeAclsRequest(_message.Message):
    __slots__ = ("filter",)
    FILTER_FIELD_NUMBER: _ClassVar[int]
    filter: AclFilter
    def __init__(self, filter: _Optional[_Union[AclFilter, _Mapping]] = ...) -> None: ...

class DeleteAclsRequest(_message.Message):
    __slots__ = ("filters",)
    FILTERS_FIELD_NUMBER: _ClassVar[int]
    filters: _containers.RepeatedCompositeFieldContainer[AclFilter]
    def __init__(self, filters: _Optional[_Iterable[_Union[AclFilter, _Mapping]]] = ...) -> None: ...

class AclsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "acls")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    ACLS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: Redirect
    acls: _containers.RepeatedCompositeFieldContainer[AclBinding]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[Redirect, _Mapping]] = ..., acls: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ...) -> None: ...

class QuotaRecord(_message.Message):
    __slots__ = ("entity", "values")
    class ValuesEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    VALUES_FIELD_NUMBER: _ClassVar[int]
    entity: str
    values: _containers.ScalarMap[str, float]
    def __init__(self, entity: _Optional[str] = ..., values: _Optional[_Mapping[str, float]] = ...) -> None: ...

class AlterClientQuotasRequest(_message.Message):
    __slots__ = ("entity", "set", "remove", "alterations")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    ALTERATIONS_FIELD_NUMBER: _ClassVar[int]
    entity: str
    set: _containers.ScalarMap[str, float]
    remove: _containers.RepeatedScalarFieldContainer[str]
    alterations: _containers.RepeatedCompositeFieldContainer[QuotaAlteration]
    def __init__(self, entity: _Optional[str] = ..., set: _Optional[_Mapping[str, float]] = ..., remove: _Optional[_Iterable[str]] = ..., alterations: _Optional[_Iterable[_Union[QuotaAlteration, _Mapping]]] = ...) -> None: ...

class QuotaAlteration(_message.Message):
    __slots__ = ("entity", "set", "remove")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: float
        def __init__(self, key: _Optional[str] = ..., value: _Optional[float] = ...) -> None: ...
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    REMOVE_FIELD_NUMBER: _ClassVar[int]
    entity: str
    set: _containers.ScalarMap[str, float]
    remove: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, entity: _Optional[str] = ..., set: _Optional[_Mapping[str, float]] = ..., remove: _Optional[_Iterable[str]] = ...) -> None: ...

class QuotaAlterationResult(_message.Message):
    __slots__ = ("entity", "error_code", "error_message")
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    entity: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, entity: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DescribeClientQuotasRequest(_message.Message):
    __slots__ = ("entity",)
    ENTITY_FIELD_NUMBER: _ClassVar[int]
    entity: str
    def __init__(self, entity: _Optional[str] = ...) -> None: ...

class ClientQuotasResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "quotas", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: Redirect
    quotas: _containers.RepeatedCompositeFieldContainer[QuotaRecord]
    results: _containers.RepeatedCompositeFieldContainer[QuotaAlterationResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[Redirect, _Mapping]] = ..., quotas: _Optional[_Iterable[_Union[QuotaRecord, _Mapping]]] = ..., results: _Optional[_Iterable[_Union[QuotaAlterationResult, _Mapping]]] = ...) -> None: ...

class SecurityDelta(_message.Message):
    __slots__ = ("credentials", "deleted_credentials", "acls_changed", "acls", "quotas")
    CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    DELETED_CREDENTIALS_FIELD_NUMBER: _ClassVar[int]
    ACLS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    ACLS_FIELD_NUMBER: _ClassVar[int]
    QUOTAS_FIELD_NUMBER: _ClassVar[int]
    credentials: _containers.RepeatedCompositeFieldContainer[ScramCredentialRecord]
    deleted_credentials: _containers.RepeatedCompositeFieldContainer[DeleteScramCredentialsRequest.Item]
    acls_changed: bool
    acls: _containers.RepeatedCompositeFieldContainer[AclBinding]
    quotas: _containers.RepeatedCompositeFieldContainer[QuotaRecord]
    def __init__(self, credentials: _Optional[_Iterable[_Union[ScramCredentialRecord, _Mapping]]] = ..., deleted_credentials: _Optional[_Iterable[_Union[DeleteScramCredentialsRequest.Item, _Mapping]]] = ..., acls_changed: _Optional[bool] = ..., acls: _Optional[_Iterable[_Union[AclBinding, _Mapping]]] = ..., quotas: _Optional[_Iterable[_Union[QuotaRecord, _Mapping]]] = ...) -> None: ...
