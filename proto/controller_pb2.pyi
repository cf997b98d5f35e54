from proto import common_pb2 as _common_pb2
from proto import security_pb2 as _security_pb2
from google.protobuf.internal import containers as _containers
from google.protobuf.internal import enum_type_wrapper as _enum_type_wrapper
from google.protobuf import descriptor as _descriptor
from google.protobuf import message as _message
from collections.abc import Iterable as _Iterable, Mapping as _Mapping
from typing import ClassVar as _ClassVar, Optional as _Optional, Union as _Union

DESCRIPTOR: _descriptor.FileDescriptor

class ElectionType(int, metaclass=_enum_type_wrapper.EnumTypeWrapper):
    __slots__ = ()
    PREFERRED: _ClassVar[ElectionType]
    UNCLEAN: _ClassVar[ElectionType]
PREFERRED: ElectionType
UNCLEAN: ElectionType

class ControllerRedirect(_message.Message):
    __slots__ = ("leader_id", "leader")
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    leader_id: int
    leader: _common_pb2.Endpoint
    def __init__(self, leader_id: _Optional[int] = ..., leader: _Optional[_Union[_common_pb2.Endpoint, _Mapping]] = ...) -> None: ...

class BrokerRecord(_message.Message):
    __slots__ = ("node_id", "incarnation_id", "broker_epoch", "endpoints", "rack", "fenced", "in_controlled_shutdown", "partition_capacity")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    FENCED_FIELD_NUMBER: _ClassVar[int]
    IN_CONTROLLED_SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    PARTITION_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    incarnation_id: str
    broker_epoch: int
    endpoints: _containers.RepeatedCompositeFieldContainer[_common_pb2.Endpoint]
    rack: str
    fenced: bool
    in_controlled_shutdown: bool
    partition_capacity: int
    def __init__(self, node_id: _Optional[int] = ..., incarnation_id: _Optional[str] = ..., broker_epoch: _Optional[int] = ..., endpoints: _Optional[_Iterable[_Union[_common_pb2.Endpoint, _Mapping]]] = ..., rack: _Optional[str] = ..., fenced: _Optional[bool] = ..., in_controlled_shutdown: _Optional[bool] = ..., partition_capacity: _Optional[int] = ...) -> None: ...

class TopicRecord(_message.Message):
    __slots__ = ("name", "topic_id", "configs", "partition_count")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    PARTITION_COUNT_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic_id: str
    configs: _containers.ScalarMap[str, str]
    partition_count: int
    def __init__(self, name: _Optional[str] = ..., topic_id: _Optional[str] = ..., configs: _Optional[_Mapping[str, str]] = ..., partition_count: _Optional[int] = ...) -> None: ...

class PartitionRecord(_message.Message):
    __slots__ = ("topic", "topic_id", "partition", "replicas", "isr", "leader", "leader_epoch", "partition_epoch", "adding_replicas", "removing_replicas")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ADDING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    topic_id: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    isr: _containers.RepeatedScalarFieldContainer[int]
    leader: int
    leader_epoch: int
    partition_epoch: int
    adding_replicas: _containers.RepeatedScalarFieldContainer[int]
    removing_replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., topic_id: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., isr: _Optional[_Iterable[int]] = ..., leader: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., partition_epoch: _Optional[int] = ..., adding_replicas: _Optional[_Iterable[int]] = ..., removing_replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class WatchMetadataRequest(_message.Message):
    __slots__ = ("broker_id", "since_version")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    SINCE_VERSION_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    since_version: int
    def __init__(self, broker_id: _Optional[int] = ..., since_version: _Optional[int] = ...) -> None: ...

class MetadataUpdate(_message.Message):
    __slots__ = ("version", "is_snapshot", "cluster_id", "active_controller_id", "brokers", "topics", "partitions", "deleted_topic_ids", "unregistered_broker_ids", "error_code", "error_message", "redirect", "security", "cluster_configs_changed", "cluster_configs", "metadata_level")
    class ClusterConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    VERSION_FIELD_NUMBER: _ClassVar[int]
    IS_SNAPSHOT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    DELETED_TOPIC_IDS_FIELD_NUMBER: _ClassVar[int]
    UNREGISTERED_BROKER_IDS_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    SECURITY_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_CONFIGS_CHANGED_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_CONFIGS_FIELD_NUMBER: _ClassVar[int]
    METADATA_LEVEL_FIELD_NUMBER: _ClassVar[int]
    version: int
    is_snapshot: bool
    cluster_id: str
    active_controller_id: int
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerRecord]
    topics: _containers.RepeatedCompositeFieldContainer[TopicRecord]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionRecord]
    deleted_topic_ids: _containers.RepeatedScalarFieldContainer[str]
    unregistered_broker_ids: _containers.RepeatedScalarFieldContainer[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    security: _security_pb2.SecurityDelta
    cluster_configs_changed: bool
    cluster_configs: _containers.ScalarMap[str, str]
    metadata_level: int
    def __init__(self, version: _Optional[int] = ..., is_snapshot: _Optional[bool] = ..., cluster_id: _Optional[str] = ..., active_controller_id: _Optional[int] = ..., brokers: _Optional[_Iterable[_Union[BrokerRecord, _Mapping]]] = ..., topics: _Optional[_Iterable[_Union[TopicRecord, _Mapping]]] = ..., partitions: _Optional[_Iterable[_Union[PartitionRecord, _Mapping]]] = ..., deleted_topic_ids: _Optional[_Iterable[str]] = ..., unregistered_broker_ids: _Optional[_Iterable[int]] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., security: _Optional[_Union[_security_pb2.SecurityDelta, _Mapping]] = ..., cluster_configs_changed: _Optional[bool] = ..., cluster_configs: _Optional[_Mapping[str, str]] = ..., metadata_level: _Optional[int] = ...) -> None: ...

class RegisterBrokerRequest(_message.Message):
    __slots__ = ("node_id", "incarnation_id", "endpoints", "rack", "cluster_id", "previous_incarnation_id", "partition_capacity", "storage_created", "supported_metadata_level")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    ENDPOINTS_FIELD_NUMBER: _ClassVar[int]
    RACK_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    PREVIOUS_INCARNATION_ID_FIELD_NUMBER: _ClassVar[int]
    PARTITION_CAPACITY_FIELD_NUMBER: _ClassVar[int]
    STORAGE_CREATED_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_METADATA_LEVEL_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    incarnation_id: str
    endpoints: _containers.RepeatedCompositeFieldContainer[_common_pb2.Endpoint]
    rack: str
    cluster_id: str
    previous_incarnation_id: str
    partition_capacity: int
    storage_created: bool
    supported_metadata_level: int
    def __init__(self, node_id: _Optional[int] = ..., incarnation_id: _Optional[str] = ..., endpoints: _Optional[_Iterable[_Union[_common_pb2.Endpoint, _Mapping]]] = ..., rack: _Optional[str] = ..., cluster_id: _Optional[str] = ..., previous_incarnation_id: _Optional[str] = ..., partition_capacity: _Optional[int] = ..., storage_created: _Optional[bool] = ..., supported_metadata_level: _Optional[int] = ...) -> None: ...

class RegisterBrokerResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "broker_epoch")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    broker_epoch: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class BrokerHeartbeatRequest(_message.Message):
    __slots__ = ("node_id", "broker_epoch", "current_metadata_version", "want_fence", "want_shutdown", "supported_metadata_level")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    CURRENT_METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    WANT_FENCE_FIELD_NUMBER: _ClassVar[int]
    WANT_SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_METADATA_LEVEL_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    broker_epoch: int
    current_metadata_version: int
    want_fence: bool
    want_shutdown: bool
    supported_metadata_level: int
    def __init__(self, node_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., current_metadata_version: _Optional[int] = ..., want_fence: _Optional[bool] = ..., want_shutdown: _Optional[bool] = ..., supported_metadata_level: _Optional[int] = ...) -> None: ...

class BrokerHeartbeatResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "is_fenced", "should_shutdown", "heartbeat_interval_ms")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    IS_FENCED_FIELD_NUMBER: _ClassVar[int]
    SHOULD_SHUTDOWN_FIELD_NUMBER: _ClassVar[int]
    HEARTBEAT_INTERVAL_MS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    is_fenced: bool
    should_shutdown: bool
    heartbeat_interval_ms: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., is_fenced: _Optional[bool] = ..., should_shutdown: _Optional[bool] = ..., heartbeat_interval_ms: _Optional[int] = ...) -> None: ...

class ControlledShutdownRequest(_message.Message):
    __slots__ = ("node_id", "broker_epoch")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    broker_epoch: int
    def __init__(self, node_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class ControlledShutdownResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "remaining_leaderships")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    REMAINING_LEADERSHIPS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    remaining_leaderships: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., remaining_leaderships: _Optional[int] = ...) -> None: ...

class AlterPartitionRequest(_message.Message):
    __slots__ = ("broker_id", "broker_epoch", "items")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    ITEMS_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    items: _containers.RepeatedCompositeFieldContainer[AlterPartitionItem]
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ..., items: _Optional[_Iterable[_Union[AlterPartitionItem, _Mapping]]] = ...) -> None: ...

class AlterPartitionItem(_message.Message):
    __slots__ = ("topic", "partition", "leader_epoch", "partition_epoch", "new_isr")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    LEADER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    PARTITION_EPOCH_FIELD_NUMBER: _ClassVar[int]
    NEW_ISR_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    leader_epoch: int
    partition_epoch: int
    new_isr: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., leader_epoch: _Optional[int] = ..., partition_epoch: _Optional[int] = ..., new_isr: _Optional[_Iterable[int]] = ...) -> None: ...

class AlterPartitionResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    results: _containers.RepeatedCompositeFieldContainer[AlterPartitionResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., results: _Optional[_Iterable[_Union[AlterPartitionResult, _Mapping]]] = ...) -> None: ...

class AlterPartitionResult(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "partition_state")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    PARTITION_STATE_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    partition_state: PartitionRecord
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., partition_state: _Optional[_Union[PartitionRecord, _Mapping]] = ...) -> None: ...

class CreatableTopic(_message.Message):
    __slots__ = ("name", "num_partitions", "replication_factor", "configs", "assignments", "request_id")
    class ConfigsEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    NAME_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    CONFIGS_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    REQUEST_ID_FIELD_NUMBER: _ClassVar[int]
    name: str
    num_partitions: int
    replication_factor: int
    configs: _containers.ScalarMap[str, str]
    assignments: _containers.RepeatedCompositeFieldContainer[ReplicaList]
    request_id: str
    def __init__(self, name: _Optional[str] = ..., num_partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ..., configs: _Optional[_Mapping[str, str]] = ..., assignments: _Optional[_Iterable[_Union[ReplicaList, _Mapping]]] = ..., request_id: _Optional[str] = ...) -> None: ...

class ReplicaList(_message.Message):
    __slots__ = ("replicas",)
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    replicas: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, replicas: _Optional[_Iterable[int]] = ...) -> None: ...

class CreateTopicsRequest(_message.Message):
    __slots__ = ("topics", "validate_only", "timeout_ms", "permissive_quota")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PERMISSIVE_QUOTA_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatableTopic]
    validate_only: bool
    timeout_ms: int
    permissive_quota: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatableTopic, _Mapping]]] = ..., validate_only: _Optional[bool] = ..., timeout_ms: _Optional[int] = ..., permissive_quota: _Optional[bool] = ...) -> None: ...

class TopicResult(_message.Message):
    __slots__ = ("name", "topic_id", "error_code", "error_message", "num_partitions", "replication_factor")
    NAME_FIELD_NUMBER: _ClassVar[int]
    TOPIC_ID_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    NUM_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    name: str
    topic_id: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    num_partitions: int
    replication_factor: int
    def __init__(self, name: _Optional[str] = ..., topic_id: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., num_partitions: _Optional[int] = ..., replication_factor: _Optional[int] = ...) -> None: ...

class CreateTopicsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "results", "throttle_time_ms")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    results: _containers.RepeatedCompositeFieldContainer[TopicResult]
    throttle_time_ms: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., results: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class DeleteTopicsRequest(_message.Message):
    __slots__ = ("names", "timeout_ms", "permissive_quota")
    NAMES_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PERMISSIVE_QUOTA_FIELD_NUMBER: _ClassVar[int]
    names: _containers.RepeatedScalarFieldContainer[str]
    timeout_ms: int
    permissive_quota: bool
    def __init__(self, names: _Optional[_Iterable[str]] = ..., timeout_ms: _Optional[int] = ..., permissive_quota: _Optional[bool] = ...) -> None: ...

class DeleteTopicsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "results", "throttle_time_ms")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    results: _containers.RepeatedCompositeFieldContainer[TopicResult]
    throttle_time_ms: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., results: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class CreatePartitionsRequest(_message.Message):
    __slots__ = ("topics", "validate_only", "timeout_ms", "permissive_quota")
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    PERMISSIVE_QUOTA_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedCompositeFieldContainer[CreatePartitionsTopic]
    validate_only: bool
    timeout_ms: int
    permissive_quota: bool
    def __init__(self, topics: _Optional[_Iterable[_Union[CreatePartitionsTopic, _Mapping]]] = ..., validate_only: _Optional[bool] = ..., timeout_ms: _Optional[int] = ..., permissive_quota: _Optional[bool] = ...) -> None: ...

class CreatePartitionsTopic(_message.Message):
    __slots__ = ("name", "count", "assignments")
    NAME_FIELD_NUMBER: _ClassVar[int]
    COUNT_FIELD_NUMBER: _ClassVar[int]
    ASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    name: str
    count: int
    assignments: _containers.RepeatedCompositeFieldContainer[ReplicaList]
    def __init__(self, name: _Optional[str] = ..., count: _Optional[int] = ..., assignments: _Optional[_Iterable[_Union[ReplicaList, _Mapping]]] = ...) -> None: ...

class CreatePartitionsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "results", "throttle_time_ms")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    THROTTLE_TIME_MS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    results: _containers.RepeatedCompositeFieldContainer[TopicResult]
    throttle_time_ms: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., results: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ..., throttle_time_ms: _Optional[int] = ...) -> None: ...

class AlterConfigsRequest(_message.Message):
    __slots__ = ("resources", "validate_only")
    RESOURCES_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    resources: _containers.RepeatedCompositeFieldContainer[AlterConfigsResource]
    validate_only: bool
    def __init__(self, resources: _Optional[_Iterable[_Union[AlterConfigsResource, _Mapping]]] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class AlterConfigsResource(_message.Message):
    __slots__ = ("topic", "set", "delete", "list_ops")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    SET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    LIST_OPS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    set: _containers.ScalarMap[str, str]
    delete: _containers.RepeatedScalarFieldContainer[str]
    list_ops: _containers.RepeatedCompositeFieldContainer[ListOp]
    def __init__(self, topic: _Optional[str] = ..., set: _Optional[_Mapping[str, str]] = ..., delete: _Optional[_Iterable[str]] = ..., list_ops: _Optional[_Iterable[_Union[ListOp, _Mapping]]] = ...) -> None: ...

class ListOp(_message.Message):
    __slots__ = ("name", "subtract", "value")
    NAME_FIELD_NUMBER: _ClassVar[int]
    SUBTRACT_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    name: str
    subtract: bool
    value: str
    def __init__(self, name: _Optional[str] = ..., subtract: _Optional[bool] = ..., value: _Optional[str] = ...) -> None: ...

class AlterConfigsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    results: _containers.RepeatedCompositeFieldContainer[TopicResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., results: _Optional[_Iterable[_Union[TopicResult, _Mapping]]] = ...) -> None: ...

class DescribeConfigsRequest(_message.Message):
    __slots__ = ("topics",)
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    topics: _containers.RepeatedScalarFieldContainer[str]
    def __init__(self, topics: _Optional[_Iterable[str]] = ...) -> None: ...

class ConfigEntry(_message.Message):
    __slots__ = ("name", "value", "is_default", "documentation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    IS_DEFAULT_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    is_default: bool
    documentation: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ..., is_default: _Optional[bool] = ..., documentation: _Optional[str] = ...) -> None: ...

class DescribeConfigsResult(_message.Message):
    __slots__ = ("topic", "error_code", "error_message", "entries")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    topic: str
    error_code: _common_pb2.ErrorCode
    error_message: str
    entries: _containers.RepeatedCompositeFieldContainer[ConfigEntry]
    def __init__(self, topic: _Optional[str] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., entries: _Optional[_Iterable[_Union[ConfigEntry, _Mapping]]] = ...) -> None: ...

class DescribeConfigsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    results: _containers.RepeatedCompositeFieldContainer[DescribeConfigsResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., results: _Optional[_Iterable[_Union[DescribeConfigsResult, _Mapping]]] = ...) -> None: ...

class DescribeClusterRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class DescribeClusterResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "cluster_id", "active_controller_id", "metadata_version", "brokers", "topics", "partitions", "default_min_insync_replicas")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    CLUSTER_ID_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    BROKERS_FIELD_NUMBER: _ClassVar[int]
    TOPICS_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    DEFAULT_MIN_INSYNC_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    cluster_id: str
    active_controller_id: int
    metadata_version: int
    brokers: _containers.RepeatedCompositeFieldContainer[BrokerRecord]
    topics: _containers.RepeatedCompositeFieldContainer[TopicRecord]
    partitions: _containers.RepeatedCompositeFieldContainer[PartitionRecord]
    default_min_insync_replicas: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., cluster_id: _Optional[str] = ..., active_controller_id: _Optional[int] = ..., metadata_version: _Optional[int] = ..., brokers: _Optional[_Iterable[_Union[BrokerRecord, _Mapping]]] = ..., topics: _Optional[_Iterable[_Union[TopicRecord, _Mapping]]] = ..., partitions: _Optional[_Iterable[_Union[PartitionRecord, _Mapping]]] = ..., default_min_insync_replicas: _Optional[int] = ...) -> None: ...

class DescribeQuorumRequest(_message.Message):
    __slots__ = ("any_voter", "caller_broker_id")
    ANY_VOTER_FIELD_NUMBER: _ClassVar[int]
    CALLER_BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    any_voter: bool
    caller_broker_id: int
    def __init__(self, any_voter: _Optional[bool] = ..., caller_broker_id: _Optional[int] = ...) -> None: ...

class QuorumVoter(_message.Message):
    __slots__ = ("node_id", "raft_address", "log_end_index", "lag", "last_contact_ms_ago", "is_leader", "connected")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    RAFT_ADDRESS_FIELD_NUMBER: _ClassVar[int]
    LOG_END_INDEX_FIELD_NUMBER: _ClassVar[int]
    LAG_FIELD_NUMBER: _ClassVar[int]
    LAST_CONTACT_MS_AGO_FIELD_NUMBER: _ClassVar[int]
    IS_LEADER_FIELD_NUMBER: _ClassVar[int]
    CONNECTED_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    raft_address: str
    log_end_index: int
    lag: int
    last_contact_ms_ago: int
    is_leader: bool
    connected: bool
    def __init__(self, node_id: _Optional[int] = ..., raft_address: _Optional[str] = ..., log_end_index: _Optional[int] = ..., lag: _Optional[int] = ..., last_contact_ms_ago: _Optional[int] = ..., is_leader: _Optional[bool] = ..., connected: _Optional[bool] = ...) -> None: ...

class DescribeQuorumResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "leader_id", "term", "commit_index", "metadata_version", "voters", "last_applied", "responder_id", "responder_is_active", "active_controller_id", "controller_epoch", "responder_lacks_quorum", "responder_supported_metadata_level", "responder_hears_brokers")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    LEADER_ID_FIELD_NUMBER: _ClassVar[int]
    TERM_FIELD_NUMBER: _ClassVar[int]
    COMMIT_INDEX_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    VOTERS_FIELD_NUMBER: _ClassVar[int]
    LAST_APPLIED_FIELD_NUMBER: _ClassVar[int]
    RESPONDER_ID_FIELD_NUMBER: _ClassVar[int]
    RESPONDER_IS_ACTIVE_FIELD_NUMBER: _ClassVar[int]
    ACTIVE_CONTROLLER_ID_FIELD_NUMBER: _ClassVar[int]
    CONTROLLER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    RESPONDER_LACKS_QUORUM_FIELD_NUMBER: _ClassVar[int]
    RESPONDER_SUPPORTED_METADATA_LEVEL_FIELD_NUMBER: _ClassVar[int]
    RESPONDER_HEARS_BROKERS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    leader_id: int
    term: int
    commit_index: int
    metadata_version: int
    voters: _containers.RepeatedCompositeFieldContainer[QuorumVoter]
    last_applied: int
    responder_id: int
    responder_is_active: bool
    active_controller_id: int
    controller_epoch: int
    responder_lacks_quorum: bool
    responder_supported_metadata_level: int
    responder_hears_brokers: bool
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., leader_id: _Optional[int] = ..., term: _Optional[int] = ..., commit_index: _Optional[int] = ..., metadata_version: _Optional[int] = ..., voters: _Optional[_Iterable[_Union[QuorumVoter, _Mapping]]] = ..., last_applied: _Optional[int] = ..., responder_id: _Optional[int] = ..., responder_is_active: _Optional[bool] = ..., active_controller_id: _Optional[int] = ..., controller_epoch: _Optional[int] = ..., responder_lacks_quorum: _Optional[bool] = ..., responder_supported_metadata_level: _Optional[int] = ..., responder_hears_brokers: _Optional[bool] = ...) -> None: ...

class AllocateProducerIdsRequest(_message.Message):
    __slots__ = ("broker_id", "broker_epoch")
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    BROKER_EPOCH_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    broker_epoch: int
    def __init__(self, broker_id: _Optional[int] = ..., broker_epoch: _Optional[int] = ...) -> None: ...

class AllocateProducerIdsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "producer_id_start", "producer_id_len")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_START_FIELD_NUMBER: _ClassVar[int]
    PRODUCER_ID_LEN_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    producer_id_start: int
    producer_id_len: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., producer_id_start: _Optional[int] = ..., producer_id_len: _Optional[int] = ...) -> None: ...

class TopicPartitions(_message.Message):
    __slots__ = ("topic", "partitions")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partitions: _containers.RepeatedScalarFieldContainer[int]
    def __init__(self, topic: _Optional[str] = ..., partitions: _Optional[_Iterable[int]] = ...) -> None: ...

class ElectLeadersRequest(_message.Message):
    __slots__ = ("election_type", "topic_partitions", "timeout_ms")
    ELECTION_TYPE_FIELD_NUMBER: _ClassVar[int]
    TOPIC_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    election_type: ElectionType
    topic_partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    timeout_ms: int
    def __init__(self, election_type: _Optional[_Union[ElectionType, str]] = ..., topic_partitions: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ..., timeout_ms: _Optional[int] = ...) -> None: ...

class ElectionResult(_message.Message):
    __slots__ = ("topic", "partition", "error_code", "error_message", "leader")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    error_code: _common_pb2.ErrorCode
    error_message: str
    leader: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., leader: _Optional[int] = ...) -> None: ...

class ElectLeadersResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    results: _containers.RepeatedCompositeFieldContainer[ElectionResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., results: _Optional[_Iterable[_Union[ElectionResult, _Mapping]]] = ...) -> None: ...

class ReassignablePartition(_message.Message):
    __slots__ = ("topic", "partition", "replicas", "cancel")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    CANCEL_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    cancel: bool
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., cancel: _Optional[bool] = ...) -> None: ...

class AlterPartitionReassignmentsRequest(_message.Message):
    __slots__ = ("partitions", "timeout_ms", "keep_replication_factor")
    PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    TIMEOUT_MS_FIELD_NUMBER: _ClassVar[int]
    KEEP_REPLICATION_FACTOR_FIELD_NUMBER: _ClassVar[int]
    partitions: _containers.RepeatedCompositeFieldContainer[ReassignablePartition]
    timeout_ms: int
    keep_replication_factor: bool
    def __init__(self, partitions: _Optional[_Iterable[_Union[ReassignablePartition, _Mapping]]] = ..., timeout_ms: _Optional[int] = ..., keep_replication_factor: _Optional[bool] = ...) -> None: ...

class ReassignmentResult(_message.Message):
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

class AlterPartitionReassignmentsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "results")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    RESULTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    results: _containers.RepeatedCompositeFieldContainer[ReassignmentResult]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., results: _Optional[_Iterable[_Union[ReassignmentResult, _Mapping]]] = ...) -> None: ...

class ListPartitionReassignmentsRequest(_message.Message):
    __slots__ = ("topic_partitions",)
    TOPIC_PARTITIONS_FIELD_NUMBER: _ClassVar[int]
    topic_partitions: _containers.RepeatedCompositeFieldContainer[TopicPartitions]
    def __init__(self, topic_partitions: _Optional[_Iterable[_Union[TopicPartitions, _Mapping]]] = ...) -> None: ...

class OngoingReassignment(_message.Message):
    __slots__ = ("topic", "partition", "replicas", "adding_replicas", "removing_replicas", "isr", "leader")
    TOPIC_FIELD_NUMBER: _ClassVar[int]
    PARTITION_FIELD_NUMBER: _ClassVar[int]
    REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ADDING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    REMOVING_REPLICAS_FIELD_NUMBER: _ClassVar[int]
    ISR_FIELD_NUMBER: _ClassVar[int]
    LEADER_FIELD_NUMBER: _ClassVar[int]
    topic: str
    partition: int
    replicas: _containers.RepeatedScalarFieldContainer[int]
    adding_replicas: _containers.RepeatedScalarFieldContainer[int]
    removing_replicas: _containers.RepeatedScalarFieldContainer[int]
    isr: _containers.RepeatedScalarFieldContainer[int]
    leader: int
    def __init__(self, topic: _Optional[str] = ..., partition: _Optional[int] = ..., replicas: _Optional[_Iterable[int]] = ..., adding_replicas: _Optional[_Iterable[int]] = ..., removing_replicas: _Optional[_Iterable[int]] = ..., isr: _Optional[_Iterable[int]] = ..., leader: _Optional[int] = ...) -> None: ...

class ListPartitionReassignmentsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "reassignments")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    REASSIGNMENTS_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    reassignments: _containers.RepeatedCompositeFieldContainer[OngoingReassignment]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., reassignments: _Optional[_Iterable[_Union[OngoingReassignment, _Mapping]]] = ...) -> None: ...

class UnregisterBrokerRequest(_message.Message):
    __slots__ = ("broker_id",)
    BROKER_ID_FIELD_NUMBER: _ClassVar[int]
    broker_id: int
    def __init__(self, broker_id: _Optional[int] = ...) -> None: ...

class UnregisterBrokerResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ...) -> None: ...

class AlterClusterConfigsRequest(_message.Message):
    __slots__ = ("set", "delete", "validate_only", "list_ops")
    class SetEntry(_message.Message):
        __slots__ = ("key", "value")
        KEY_FIELD_NUMBER: _ClassVar[int]
        VALUE_FIELD_NUMBER: _ClassVar[int]
        key: str
        value: str
        def __init__(self, key: _Optional[str] = ..., value: _Optional[str] = ...) -> None: ...
    SET_FIELD_NUMBER: _ClassVar[int]
    DELETE_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    LIST_OPS_FIELD_NUMBER: _ClassVar[int]
    set: _containers.ScalarMap[str, str]
    delete: _containers.RepeatedScalarFieldContainer[str]
    validate_only: bool
    list_ops: _containers.RepeatedCompositeFieldContainer[ListOp]
    def __init__(self, set: _Optional[_Mapping[str, str]] = ..., delete: _Optional[_Iterable[str]] = ..., validate_only: _Optional[bool] = ..., list_ops: _Optional[_Iterable[_Union[ListOp, _Mapping]]] = ...) -> None: ...

class AlterClusterConfigsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ...) -> None: ...

class DescribeClusterConfigsRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class ClusterConfigEntry(_message.Message):
    __slots__ = ("name", "value", "source", "documentation")
    NAME_FIELD_NUMBER: _ClassVar[int]
    VALUE_FIELD_NUMBER: _ClassVar[int]
    SOURCE_FIELD_NUMBER: _ClassVar[int]
    DOCUMENTATION_FIELD_NUMBER: _ClassVar[int]
    name: str
    value: str
    source: str
    documentation: str
    def __init__(self, name: _Optional[str] = ..., value: _Optional[str] = ..., source: _Optional[str] = ..., documentation: _Optional[str] = ...) -> None: ...

class DescribeClusterConfigsResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "entries")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    ENTRIES_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    entries: _containers.RepeatedCompositeFieldContainer[ClusterConfigEntry]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., entries: _Optional[_Iterable[_Union[ClusterConfigEntry, _Mapping]]] = ...) -> None: ...

class DescribeFeaturesRequest(_message.Message):
    __slots__ = ()
    def __init__(self) -> None: ...

class NodeFeatureSupport(_message.Message):
    __slots__ = ("node_id", "role", "supported_max", "problem")
    NODE_ID_FIELD_NUMBER: _ClassVar[int]
    ROLE_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_MAX_FIELD_NUMBER: _ClassVar[int]
    PROBLEM_FIELD_NUMBER: _ClassVar[int]
    node_id: int
    role: str
    supported_max: int
    problem: str
    def __init__(self, node_id: _Optional[int] = ..., role: _Optional[str] = ..., supported_max: _Optional[int] = ..., problem: _Optional[str] = ...) -> None: ...

class DescribeFeaturesResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "name", "finalized_level", "supported_min", "supported_max", "metadata_version", "nodes")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    NAME_FIELD_NUMBER: _ClassVar[int]
    FINALIZED_LEVEL_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_MIN_FIELD_NUMBER: _ClassVar[int]
    SUPPORTED_MAX_FIELD_NUMBER: _ClassVar[int]
    METADATA_VERSION_FIELD_NUMBER: _ClassVar[int]
    NODES_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    name: str
    finalized_level: int
    supported_min: int
    supported_max: int
    metadata_version: int
    nodes: _containers.RepeatedCompositeFieldContainer[NodeFeatureSupport]
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., name: _Optional[str] = ..., finalized_level: _Optional[int] = ..., supported_min: _Optional[int] = ..., supported_max: _Optional[int] = ..., metadata_version: _Optional[int] = ..., nodes: _Optional[_Iterable[_Union[NodeFeatureSupport, _Mapping]]] = ...) -> None: ...

class UpdateFeaturesRequest(_message.Message):
    __slots__ = ("name", "level", "validate_only")
    NAME_FIELD_NUMBER: _ClassVar[int]
    LEVEL_FIELD_NUMBER: _ClassVar[int]
    VALIDATE_ONLY_FIELD_NUMBER: _ClassVar[int]
    name: str
    level: int
    validate_only: bool
    def __init__(self, name: _Optional[str] = ..., level: _Optional[int] = ..., validate_only: _Optional[bool] = ...) -> None: ...

class UpdateFeaturesResponse(_message.Message):
    __slots__ = ("error_code", "error_message", "redirect", "finalized_level")
    ERROR_CODE_FIELD_NUMBER: _ClassVar[int]
    ERROR_MESSAGE_FIELD_NUMBER: _ClassVar[int]
    REDIRECT_FIELD_NUMBER: _ClassVar[int]
    FINALIZED_LEVEL_FIELD_NUMBER: _ClassVar[int]
    error_code: _common_pb2.ErrorCode
    error_message: str
    redirect: ControllerRedirect
    finalized_level: int
    def __init__(self, error_code: _Optional[_Union[_common_pb2.ErrorCode, str]] = ..., error_message: _Optional[str] = ..., redirect: _Optional[_Union[ControllerRedirect, _Mapping]] = ..., finalized_level: _Optional[int] = ...) -> None: ...
