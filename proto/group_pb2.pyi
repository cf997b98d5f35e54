from proto import common_pb2 as _common_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class OffsetResetKind(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    RESET_EXPLICIT: _ClassVar[OffsetResetKind]
    RESET_EARLIEST: _ClassVar[OffsetResetKind]
    RESET_LATEST: _ClassVar[OffsetResetKind]
    RESET_TIMESTAMP: _ClassVar[OffsetResetKind]
    RESET_SHIFT_BY: _ClassVar[OffsetResetKind]
RESET_EXPLICIT: OffsetResetKind
RESET_EARLIEST: OffsetResetKind
RESET_LATEST: OffsetResetKind
RESET_TIMESTAMP: OffsetResetKind
RESET_SHIFT_BY: OffsetResetKind

class FindCoordinatorRequest(_message.Message):
    __slots__ = ("group_id",)
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    def __init__(self, group_id: _Optional[str] = ...) -> None: ...

class FindCoordinatorResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "node_id", "host", "port")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    HOST_FIELD_NUMBER: _ClassVar[int]
    PORT_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    node_id: int
    host: str
    port: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., node_id: _Optional[int] = ..., host: _Optional[str] = ..., port: _Optional[int] = ...) -> None: ...

class GroupProtocol(_message.Message):
    __slots__ = ("name", "metadata")
    NAME_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    name: str
    metadata: bytes
    def __init__(self, name: _Optional[str] = ..., metadata: _Optional[bytes] = ...) -> None: ...

class JoinGroupRequest(_message.Message):
    __slots__ = ("group_id", "session_timeout_ms", "rebalance_timeout_ms", "member_id", "protocol_type", "protocols", "client_id", "client_host", "reason", "group_instance_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOLS_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    member_id: str
    protocol_type: str
    protocols: _containers.RepeatedCompositeFieldContainer[GroupProtocol]
    client_id: str
    client_host: str
    reason: str
    group_instance_id: str
    def __init__(self, group_id: _Optional[str] = ..., session_timeout_ms: _Optional[int] = ..., rebalance_timeout_ms: _Optional[int] = ..., member_id: _Optional[str] = ..., protocol_type: _Optional[str] = ..., protocols: _Optional[_Iterable[_Union[GroupProtocol, _Mapping]]] = ..., client_id: _Optional[str] = ..., client_host: _Optional[str] = ..., reason: _Optional[str] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class JoinGroupMember(_message.Message):
    __slots__ = ("member_id", "metadata", "client_id", "group_instance_id")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    metadata: bytes
    client_id: str
    group_instance_id: str
    def __init__(self, member_id: _Optional[str] = ..., metadata: _Optional[bytes] = ..., client_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class JoinGroupResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "generation_id", "protocol_name", "leader", "member_id", "members")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    generation_id: int
    protocol_name: str
    leader: str
    member_id: str
    members: _containers.RepeatedCompositeFieldContainer[JoinGroupMember]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., generation_id: _Optional[int] = ..., protocol_name: _Optional[str] = ..., leader: _Optional[str] = ..., member_id: _Optional[str] = ..., members: _Optional[_Iterable[_Union[JoinGroupMember, _Mapping]]] = ...) -> None: ...

class SyncGroupAssignment(_message.Message):
    __slots__ = ("member_id", "assignment")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    assignment: bytes
    def __init__(self, member_id: _Optional[str] = ..., assignment: _Optional[bytes] = ...) -> None: ...

class SyncGroupRequest(_message.Message):
    __slots__ = ("group_id", "generation_id", "member_id", "protocol_type", "protocol_name", "assignments", "group_instance_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    generation_id: int
    member_id: str
    protocol_type: str
    protocol_name: str
    assignments: _containers.RepeatedCompositeFieldContainer[SyncGroupAssignment]
    group_instance_id: str
    def __init__(self, group_id: _Optional[str] = ..., generation_id: _Optional[int] = ..., member_id: _Optional[str] = ..., protocol_type: _Optional[str] = ..., protocol_name: _Optional[str] = ..., assignments: _Optional[_Iterable[_Union[SyncGroupAssignment, _Mapping]]] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class SyncGroupResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "protocol_name", "assignment")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    protocol_name: str
    assignment: bytes
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., protocol_name: _Optional[str] = ..., assignment: _Optional[bytes] = ...) -> None: ...

class HeartbeatRequest(_message.Message):
    __slots__ = ("group_id", "generation_id", "member_id", "group_instance_id")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    generation_id: int
    member_id: str
    group_instance_id: str
    def __init__(self, group_id: _Optional[str] = ..., generation_id: _Optional[int] = ..., member_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class HeartbeatResponse(_message.Message):
    __slots__ = ("error_code", "error_message")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class LeaveGroupRequest(_message.Message):
    __slots__ = ("group_id", "member_ids", "reason", "members")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_IDS_FIELD_NUMBER: _ClassVar[int]
    REASON_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    member_ids: _containers.RepeatedScalarFieldContainer[str]
    reason: str
    members: _containers.RepeatedCompositeFieldContainer[LeaveGroupMember]
    def __init__(self, group_id: _Optional[str] = ..., member_ids: _Optional[_Iterable[str]] = ..., reason: _Optional[str] = ..., members: _Optional[_Iterable[_Union[LeaveGroupMember, _Mapping]]] = ...) -> None: ...

class LeaveGroupMember(_message.Message):
    __slots__ = ("member_id", "group_instance_id")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    group_instance_id: str
    def __init__(self, member_id: _Optional[str] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class LeaveGroupMemberResponse(_message.Message):
    __slots__ = ("member_id", "error_code", "group_instance_id")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    error_code: _common_pb2.ErrorCode
    group_instance_id: str
    def __init__(self, member_id: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class LeaveGroupResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "members")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    members: _containers.RepeatedCompositeFieldContainer[LeaveGroupMemberResponse]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., members: _Optional[_Iterable[_Union[LeaveGroupMemberResponse, _Mapping]]] = ...) -> None: ...

class OffsetCommitPartition(_message.Message):
    __slots__ = ("topic", "partition", "offset", "leader_epoch", "metadata")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., metadata: _Optional[str] = ...) -> None: ...

class OffsetCommitRequest(_message.Message):
    __slots__ = ("group_id", "generation_id", "member_id", "partitions", "group_instance_id", "retention_time_ms")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RETENTION_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    generation_id: int
    member_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[OffsetCommitPartition]
    group_instance_id: str
    retention_time_ms: int
    def __init__(self, group_id: _Optional[str] = ..., generation_id: _Optional[int] = ..., member_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[OffsetCommitPartition, _Mapping]]] = ..., group_instance_id: _Optional[str] = ..., retention_time_ms: _Optional[int] = ...) -> None: ...

class PartitionError(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class OffsetCommitResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionError]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionError, _Mapping]]] = ...) -> None: ...

class TopicPartitionRef(_message.Message):
    __slots__ = ("topic", "partition")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ...) -> None: ...

class OffsetFetchRequest(_message.Message):
    __slots__ = ("group_id", "partitions")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitionRef]
    def __init__(self, group_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[TopicPartitionRef, _Mapping]]] = ...) -> None: ...

class CommittedOffset(_message.Message):
    __slots__ = ("topic", "partition", "offset", "leader_epoch", "metadata", "commit_timestamp_ms", "error_code")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    error_code: _common_pb2.ErrorCode
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., offset: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., metadata: _Optional[str] = ..., commit_timestamp_ms: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ...) -> None: ...

class OffsetFetchResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    partitions: _containers.RepeatedCompositeFieldContainer[CommittedOffset]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[CommittedOffset, _Mapping]]] = ...) -> None: ...

class ListGroupsRequest(_message.Message):
    __slots__ = ("states",)
    STATES_FIELD_NUMBER: _ClassVar[int]
    states: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, states: _Optional[_Iterable[str]] = ...) -> None: ...

class ListedGroup(_message.Message):
    __slots__ = ("group_id", "protocol_type", "state", "coordinator_id", "group_type")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_TYPE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    protocol_type: str
    state: str
    coordinator_id: int
    group_type: str
    def __init__(self, group_id: _Optional[str] = ..., protocol_type: _Optional[str] = ..., state: _Optional[str] = ..., coordinator_id: _Optional[int] = ..., group_type: _Optional[str] = ...) -> None: ...

class ListGroupsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "groups")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    groups: _containers.RepeatedCompositeFieldContainer[ListedGroup]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., groups: _Optional[_Iterable[_Union[ListedGroup, _Mapping]]] = ...) -> None: ...

class DescribeGroupsRequest(_message.Message):
    __slots__ = ("group_ids", "include_offsets")
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    INCLUDE_OFFSETS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    include_offsets: bool
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ..., include_offsets: _Optional[bool] = ...) -> None: ...

class DescribedMember(_message.Message):
    __slots__ = ("member_id", "client_id", "client_host", "metadata", "assignment", "subscribed_topics", "assigned_partitions", "session_timeout_ms", "rebalance_timeout_ms", "group_instance_id", "subscribed_topic_regex")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPICS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_TOPIC_REGEX_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    client_id: str
    client_host: str
    metadata: bytes
    assignment: bytes
    subscribed_topics: _containers.RepeatedScalarFieldContainer[str]
    assigned_partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitionRef]
    session_timeout_ms: int
    rebalance_timeout_ms: int
    group_instance_id: str
    subscribed_topic_regex: str
    def __init__(self, member_id: _Optional[str] = ..., client_id: _Optional[str] = ..., client_host: _Optional[str] = ..., metadata: _Optional[bytes] = ..., assignment: _Optional[bytes] = ..., subscribed_topics: _Optional[_Iterable[str]] = ..., assigned_partitions: _Optional[_Iterable[_Union[TopicPartitionRef, _Mapping]]] = ..., session_timeout_ms: _Optional[int] = ..., rebalance_timeout_ms: _Optional[int] = ..., group_instance_id: _Optional[str] = ..., subscribed_topic_regex: _Optional[str] = ...) -> None: ...

class GroupPartitionOffset(_message.Message):
    __slots__ = ("topic", "partition", "committed_offset", "log_end_offset", "lag", "member_id", "metadata")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    COMMITTED_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LOG_END_OFFSET_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    committed_offset: int
    log_end_offset: int
    lag: int
    member_id: str
    metadata: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., committed_offset: _Optional[int] = ..., log_end_offset: _Optional[int] = ..., lag: _Optional[int] = ..., member_id: _Optional[str] = ..., metadata: _Optional[str] = ...) -> None: ...

class DescribedGroup(_message.Message):
    __slots__ = ("error_code", "error_message", "group_id", "state", "protocol_type", "protocol_name", "generation_id", "leader", "members", "offsets", "coordinator_id", "group_type")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    OFFSETS_FIELD_NUMBER: _ClassVar[int]
    COORDINATOR_ID_FIELD_NUMBER: _ClassVar[int]
    GROUP_TYPE_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    group_id: str
    state: str
    protocol_type: str
    protocol_name: str
    generation_id: int
    leader: str
    members: _containers.RepeatedCompositeFieldContainer[DescribedMember]
    offsets: _containers.RepeatedCompositeFieldContainer[GroupPartitionOffset]
    coordinator_id: int
    group_type: str
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., group_id: _Optional[str] = ..., state: _Optional[str] = ..., protocol_type: _Optional[str] = ..., protocol_name: _Optional[str] = ..., generation_id: _Optional[int] = ..., leader: _Optional[str] = ..., members: _Optional[_Iterable[_Union[DescribedMember, _Mapping]]] = ..., offsets: _Optional[_Iterable[_Union[GroupPartitionOffset, _Mapping]]] = ..., coordinator_id: _Optional[int] = ..., group_type: _Optional[str] = ...) -> None: ...

class DescribeGroupsResponse(_message.Message):
    __slots__ = ("groups",)
    GROUPS_FIELD_NUMBER: _ClassVar[int]
    groups: _containers.RepeatedCompositeFieldContainer[DescribedGroup]
    def __init__(self, groups: _Optional[_Iterable[_Union[DescribedGroup, _Mapping]]] = ...) -> None: ...

class DeleteGroupsRequest(_message.Message):
    __slots__ = ("group_ids",)
    GROUP_IDS_FIELD_NUMBER: _ClassVar[int]
    group_ids: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, group_ids: _Optional[_Iterable[str]] = ...) -> None: ...

class GroupResult(_message.Message):
    __slots__ = ("group_id", "error_code", "error_message")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, group_id: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class DeleteGroupsResponse(_message.Message):
    __slots__ = ("results",)
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    results: _containers.RepeatedCompositeFieldContainer[GroupResult]
    def __init__(self, results: _Optional[_Iterable[_Union[GroupResult, _Mapping]]] = ...) -> None: ...

class OffsetDeleteRequest(_message.Message):
    __slots__ = ("group_id", "partitions")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitionRef]
    def __init__(self, group_id: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[TopicPartitionRef, _Mapping]]] = ...) -> None: ...

class OffsetDeleteResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionError]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[PartitionError, _Mapping]]] = ...) -> None: ...

class OffsetResetSpec(_message.Message):
    __slots__ = ("topic", "partition", "kind", "value")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    KIND_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    kind: OffsetResetKind
    value: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., kind: _Optional[_Union[OffsetResetKind, str]] = ..., value: _Optional[int] = ...) -> None: ...

class AlterGroupOffsetsRequest(_message.Message):
    __slots__ = ("group_id", "specs", "dry_run")
    GROUP_ID_FIELD_NUMBER: _ClassVar[int]
    SPECS_FIELD_NUMBER: _ClassVar[int]
    DRY_RUN_FIELD_NUMBER: _ClassVar[int]
    group_id: str
    specs: _containers.RepeatedCompositeFieldContainer[OffsetResetSpec]
    dry_run: bool
    def __init__(self, group_id: _Optional[str] = ..., specs: _Optional[_Iterable[_Union[OffsetResetSpec, _Mapping]]] = ..., dry_run: _Optional[bool] = ...) -> None: ...

class ResolvedOffset(_message.Message):
    __slots__ = ("topic", "partition", "previous_offset", "offset", "error_code", "error_message")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_OFFSET_FIELD_NUMBER: _ClassVar[int]
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    previous_offset: int
    offset: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., previous_offset: _Optional[int] = ..., offset: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ...) -> None: ...

class AlterGroupOffsetsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "partitions")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    partitions: _containers.RepeatedCompositeFieldContainer[ResolvedOffset]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partitions: _Optional[_Iterable[_Union[ResolvedOffset, _Mapping]]] = ...) -> None: ...

class ConsumerSubscription(_message.Message):
    __slots__ = ("version", "topics", "user_data", "owned_partitions", "generation_id", "rack")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    USER_DATA_FIELD_NUMBER: _ClassVar[int]
    OWNED_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    version: int
    topics: _containers.RepeatedScalarFieldContainer[str]
    user_data: bytes
    owned_partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitionRef]
    generation_id: int
    rack: str
    def __init__(self, version: _Optional[int] = ..., topics: _Optional[_Iterable[str]] = ..., user_data: _Optional[bytes] = ..., owned_partitions: _Optional[_Iterable[_Union[TopicPartitionRef, _Mapping]]] = ..., generation_id: _Optional[int] = ..., rack: _Optional[str] = ...) -> None: ...

class ConsumerAssignment(_message.Message):
    __slots__ = ("version", "partitions", "user_data")
    VERSION_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    USER_DATA_FIELD_NUMBER: _ClassVar[int]
    version: int
    partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitionRef]
    user_data: bytes
    def __init__(self, version: _Optional[int] = ..., partitions: _Optional[_Iterable[_Union[TopicPartitionRef, _Mapping]]] = ..., user_data: _Optional[bytes] = ...) -> None: ...

class OffsetCommitValue(_message.Message):
    __slots__ = ("offset", "leader_epoch", "metadata", "commit_timestamp_ms", "owner", "expire_timestamp_ms")
    OFFSET_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    METADATA_FIELD_NUMBER: _ClassVar[int]
    COMMIT_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    EXPIRE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    offset: int
    leader_epoch: int
    metadata: str
    commit_timestamp_ms: int
    owner: str
    expire_timestamp_ms: int
    def __init__(self, offset: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., metadata: _Optional[str] = ..., commit_timestamp_ms: _Optional[int] = ..., owner: _Optional[str] = ..., expire_timestamp_ms: _Optional[int] = ...) -> None: ...

class GroupMemberValue(_message.Message):
    __slots__ = ("member_id", "client_id", "client_host", "session_timeout_ms", "rebalance_timeout_ms", "subscription", "assignment", "group_instance_id")
    MEMBER_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    SESSION_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIPTION_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_FIELD_NUMBER: _ClassVar[int]
    GROUP_INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    member_id: str
    client_id: str
    client_host: str
    session_timeout_ms: int
    rebalance_timeout_ms: int
    subscription: bytes
    assignment: bytes
    group_instance_id: str
    def __init__(self, member_id: _Optional[str] = ..., client_id: _Optional[str] = ..., client_host: _Optional[str] = ..., session_timeout_ms: _Optional[int] = ..., rebalance_timeout_ms: _Optional[int] = ..., subscription: _Optional[bytes] = ..., assignment: _Optional[bytes] = ..., group_instance_id: _Optional[str] = ...) -> None: ...

class GroupMetadataValue(_message.Message):
    __slots__ = ("protocol_type", "generation_id", "protocol_name", "leader", "state_timestamp_ms", "members", "owner")
    PROTOCOL_TYPE_FIELD_NUMBER: _ClassVar[int]
    GENERATION_ID_FIELD_NUMBER: _ClassVar[int]
    PROTOCOL_NAME_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    STATE_TIMESTAMP_MS_FIELD_NUMBER: _ClassVar[int]
    MEMBERS_FIELD_NUMBER: _ClassVar[int]
    OWNER_FIELD_NUMBER: _ClassVar[int]
    protocol_type: str
    generation_id: int
    protocol_name: str
    leader: str
    state_timestamp_ms: int
    members: _containers.RepeatedCompositeFieldContainer[GroupMemberValue]
    owner: str
    def __init__(self, protocol_type: _Optional[str] = ..., generation_id: _Optional[int] = ..., protocol_name: _Optional[str] = ..., leader: _Optional[str] = ..., state_timestamp_ms: _Optional[int] = ..., members: _Optional[_Iterable[_Union[GroupMemberValue, _Mapping]]] = ..., owner: _Optional[str] = ...) -> None: ...

class ConsumerTopicPartitions(_message.Message):
    __slots__ = ("topic_id", "partitions")
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic_id: bytes
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic_id: _Optional[bytes] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class ConsumerSubscribedTopic(_message.Message):
    __slots__ = ("name", "topic_id", "partitions")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic_id: bytes
    partitions: int
    def __init__(self, name: _Optional[str] = ..., topic_id: _Optional[bytes] = ..., partitions: _Optional[int] = ...) -> None: ...

class ConsumerGroupValue(_message.Message):
    __slots__ = ("epoch", "assignment_epoch", "topics")
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENT_EPOCH_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    epoch: int
    assignment_epoch: int
    topics: _containers.RepeatedCompositeFieldContainer[ConsumerSubscribedTopic]
    def __init__(self, epoch: _Optional[int] = ..., assignment_epoch: _Optional[int] = ..., topics: _Optional[_Iterable[_Union[ConsumerSubscribedTopic, _Mapping]]] = ...) -> None: ...

class ConsumerMemberValue(_message.Message):
    __slots__ = ("instance_id", "rack_id", "client_id", "client_host", "rebalance_timeout_ms", "topic_names", "regex", "subscribed", "assignor", "epoch", "previous_epoch", "state", "assigned", "revoking", "target")
    INSTANCE_ID_FIELD_NUMBER: _ClassVar[int]
    RACK_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_ID_FIELD_NUMBER: _ClassVar[int]
    CLIENT_HOST_FIELD_NUMBER: _ClassVar[int]
    REBALANCE_TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    TOPIC_NAMES_FIELD_NUMBER: _ClassVar[int]
    REGEX_FIELD_NUMBER: _ClassVar[int]
    SUBSCRIBED_FIELD_NUMBER: _ClassVar[int]
    ASSIGNOR_FIELD_NUMBER: _ClassVar[int]
    EPOCH_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_EPOCH_FIELD_NUMBER: _ClassVar[int]
    STATE_FIELD_NUMBER: _ClassVar[int]
    ASSIGNED_FIELD_NUMBER: _ClassVar[int]
    REVOKING_FIELD_NUMBER: _ClassVar[int]
    TARGET_FIELD_NUMBER: _ClassVar[int]
    instance_id: str
    rack_id: str
    client_id: str
    client_host: str
    rebalance_timeout_ms: int
    topic_names: _containers.RepeatedScalarFieldContainer[str]
    regex: str
    subscribed: _containers.RepeatedScalarFieldContainer[str]
    assignor: str
    epoch: int
    previous_epoch: int
    state: str
    assigned: _containers.RepeatedCompositeFieldContainer[ConsumerTopicPartitions]
    revoking: _containers.RepeatedCompositeFieldContainer[ConsumerTopicPartitions]
    target: _containers.RepeatedCompositeFieldContainer[ConsumerTopicPartitions]
    def __init__(self, instance_id: _Optional[str] = ..., rack_id: _Optional[str] = ..., client_id: _Optional[str] = ..., client_host: _Optional[str] = ..., rebalance_timeout_ms: _Optional[int] = ..., topic_names: _Optional[_Iterable[str]] = ..., regex: _Optional[str] = ..., subscribed: _Optional[_Iterable[str]] = ..., assignor: _Optional[str] = ..., epoch: _Optional[int] = ..., previous_epoch: _Optional[int] = ..., state: _Optional[str] = ..., assigned: _Optional[_Iterable[_Union[ConsumerTopicPartitions, _Mapping]]] = ..., revoking: _Optional[_Iterable[_Union[ConsumerTopicPartitions, _Mapping]]] = ..., target: _Optional[_Iterable[_Union[ConsumerTopicPartitions, _Mapping]]] = ...) -> None: ...
