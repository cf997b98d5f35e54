"""The commands that change cluster metadata, and their wire form in the Raft log.

Every change to ``MetadataState`` is one of these dataclasses. The active controller
fills in everything that needs a clock, a socket or a random source (topic ids,
replica assignments, broker epochs come from the state itself) *before* proposing, so
applying a command is a pure function of the state and the command.

In the Raft log a command travels as a plain dict of builtins (``to_dict``), never as a
pickled class: pysyncobj pickles its traffic, and a dict of str/int/list/dict is the
smallest surface to trust. ``from_dict`` rebuilds and type-checks the dataclass.
"""

from __future__ import annotations

from dataclasses import MISSING, dataclass, field, fields
from typing import Any

from proto import errors


@dataclass(frozen=True, slots=True)
class ActivateController:
    """Written by a newly elected Raft leader; it becomes active once this is applied."""

    node_id: int
    term: int
    unclean_leader_election_default: bool = False


@dataclass(frozen=True, slots=True)
class RegisterBroker:
    node_id: int
    incarnation_id: str
    endpoints: list[list[Any]]  # [listener name, host, port]
    rack: str = ""
    # Most partition replicas the broker may hold (from its descriptor limit and max.partitions.per.broker);
    # 0 = unbounded: what a broker of an older release reports, and what a journal written before this field
    # existed replays as.
    partition_capacity: int = 0
    # Its log directories were found empty and made at this start (a replaced or wiped disk): it leaves every
    # ISR, the last member's place included. False in a journal written before this field existed.
    storage_created: bool = False


@dataclass(frozen=True, slots=True)
class FenceBroker:
    node_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class UnfenceBroker:
    node_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class BeginControlledShutdown:
    node_id: int
    broker_epoch: int


@dataclass(frozen=True, slots=True)
class UnregisterBroker:
    node_id: int


@dataclass(frozen=True, slots=True)
class CreateTopic:
    name: str
    topic_id: str
    configs: dict[str, str]
    assignments: list[list[int]]  # replicas per partition, in partition order
    request_id: str = ""  # the client's id for this creation: its retries are known as such


@dataclass(frozen=True, slots=True)
class DeleteTopic:
    name: str
    topic_id: str


@dataclass(frozen=True, slots=True)
class CreatePartitions:
    name: str
    topic_id: str
    expected_count: int  # today's count the assignments were computed for (compare-and-set)
    assignments: list[list[int]]  # the new partitions only


@dataclass(frozen=True, slots=True)
class AlterConfigs:
    name: str
    topic_id: str
    set: dict[str, str] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class PartitionChangeItem:
    """One partition's change; ``partition_epoch`` is the compare-and-set guard.

    ``leader_epoch`` -1 skips the leader-epoch check (controller-made changes).
    ``new_isr`` None keeps the ISR; ``new_leader`` None keeps the leader.
    """

    topic: str
    partition: int
    partition_epoch: int
    leader_epoch: int = -1
    new_isr: list[int] | None = None
    new_leader: int | None = None


@dataclass(frozen=True, slots=True)
class ChangePartition:
    """ISR changes from partition leaders (broker_id >= 0) or leader moves by the controller (-1)."""

    items: list[PartitionChangeItem]
    broker_id: int = -1
    broker_epoch: int = -1


@dataclass(frozen=True, slots=True)
class AllocateProducerIds:
    broker_id: int
    broker_epoch: int
    block_size: int = 1000


@dataclass(frozen=True, slots=True)
class UpsertScramCredential:
    """One user's salted SCRAM credential for one mechanism (hex strings; never the password)."""

    user: str
    mechanism: str
    salt: str
    stored_key: str
    server_key: str
    iterations: int


@dataclass(frozen=True, slots=True)
class DeleteScramCredential:
    user: str
    mechanism: str = ""  # empty: every mechanism of the user


@dataclass(frozen=True, slots=True)
class CreateAcls:
    acls: list[list[str]]  # 7 fields each, see metadata_quorum/security.py AclBinding


@dataclass(frozen=True, slots=True)
class DeleteAcls:
    acls: list[list[str]]  # exact bindings (the controller resolved the filters)


@dataclass(frozen=True, slots=True)
class AlterClientQuota:
    entity: str  # "User:alice" or "<default>"
    set: dict[str, float] = field(default_factory=dict)
    remove: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class AlterReassignment:
    """Start moving a partition to ``target`` replicas (same count), or cancel the move in progress
    (``target`` None). ``partition_epoch`` is the compare-and-set guard."""

    topic: str
    partition: int
    partition_epoch: int
    target: list[int] | None = None


@dataclass(frozen=True, slots=True)
class CompleteReassignment:
    """Finish a reassignment whose target replicas are all in sync: the leaving replicas go."""

    topic: str
    partition: int
    partition_epoch: int


@dataclass(frozen=True, slots=True)
class AlterClusterConfigs:
    """Dynamic cluster-wide broker configs (metadata_quorum/cluster_configs.py): set and delete keys."""

    set: dict[str, str] = field(default_factory=dict)
    delete: list[str] = field(default_factory=list)


@dataclass(frozen=True, slots=True)
class UpdateFeature:
    """Raise a finalized feature level (metadata_quorum/features.py). Proposed only once every voter and
    registered broker supports ``level``: a release without this command refuses it."""

    name: str
    level: int


@dataclass(frozen=True, slots=True)
class AlterScramCredentials:
    """One user's SCRAM changes of one Kafka AlterUserScramCredentials request, applied together or not at all:
    ``upsertions`` as UpsertScramCredential's fields in order, ``deletions`` as [user, mechanism]. Proposed only at
    brook.metadata.version 4 (features.ATOMIC_SCRAM): a release without this command refuses it."""

    upsertions: list[list[str | int]]
    deletions: list[list[str]]


Command = (
    ActivateController | RegisterBroker | FenceBroker | UnfenceBroker | BeginControlledShutdown
    | UnregisterBroker | CreateTopic | DeleteTopic | CreatePartitions | AlterConfigs | ChangePartition
    | AllocateProducerIds | UpsertScramCredential | DeleteScramCredential | CreateAcls | DeleteAcls
    | AlterClientQuota | AlterReassignment | CompleteReassignment | AlterClusterConfigs | UpdateFeature
    | AlterScramCredentials
)

COMMAND_TYPES: dict[str, type] = {
    cls.__name__: cls
    for cls in (
        ActivateController, RegisterBroker, FenceBroker, UnfenceBroker, BeginControlledShutdown,
        UnregisterBroker, CreateTopic, DeleteTopic, CreatePartitions, AlterConfigs, ChangePartition,
        AllocateProducerIds, UpsertScramCredential, DeleteScramCredential, CreateAcls, DeleteAcls,
        AlterClientQuota, AlterReassignment, CompleteReassignment, AlterClusterConfigs, UpdateFeature,
        AlterScramCredentials,
    )
}

def _plain(value: Any) -> Any:
    """Deep copy into builtins only (lists, dicts with str keys, scalars)."""
    if isinstance(value, bool | int | str | float) or value is None:
        return value
    if isinstance(value, list | tuple):
        return [_plain(v) for v in value]
    if isinstance(value, dict):
        return {str(k): _plain(v) for k, v in value.items()}
    if isinstance(value, PartitionChangeItem):
        return {f.name: _plain(getattr(value, f.name)) for f in fields(value)}
    raise errors.InvalidRequestError(f"command field of type {type(value).__name__} is not plain data")


def to_dict(cmd: Command) -> dict[str, Any]:
    """The command as a dict of builtins, tagged with its type name. A field that holds its default is left
    out (``from_dict`` restores it): a field added in a later release then reaches the journal only when a
    command uses it, and voters of the release before, which refuse fields they do not know, apply every
    other command of a mixed-version quorum the same."""
    out: dict[str, Any] = {"type": type(cmd).__name__}
    for f in fields(cmd):  # type: ignore[arg-type]
        value = getattr(cmd, f.name)
        if f.default is not MISSING and value == f.default:
            continue
        out[f.name] = _plain(value)
    return out


def unknown_to_this_release(data: Any) -> str | None:
    """Why a command dict cannot be read by this release at all (a type or fields it does not know, as a newer
    release writes them), or None. Other malformed commands are refused by ``from_dict``."""
    if not isinstance(data, dict):
        return None
    cls = COMMAND_TYPES.get(data.get("type", ""))
    if cls is None:
        return f"command type {str(data.get('type'))[:64]!r} is unknown to this release"
    unknown = set(data) - {"type"} - {f.name for f in fields(cls)}
    if unknown:
        return f"{cls.__name__} has fields unknown to this release: {sorted(str(k)[:64] for k in unknown)[:8]}"
    if cls is ChangePartition and isinstance(data.get("items"), list):
        known = {f.name for f in fields(PartitionChangeItem)}
        for item in data["items"]:
            extra = set(item) - known if isinstance(item, dict) else set()
            if extra:
                return f"PartitionChangeItem has fields unknown to this release: {sorted(str(k)[:64] for k in extra)[:8]}"
    return None


def from_dict(data: Any) -> Command:
    """Rebuild a command from its dict form; InvalidRequestError if it is not one."""
    if not isinstance(data, dict):
        raise errors.InvalidRequestError(f"command must be a dict, got {type(data).__name__}")
    cls = COMMAND_TYPES.get(data.get("type", ""))
    if cls is None:
        raise errors.InvalidRequestError(f"unknown command type {data.get('type')!r}")
    kwargs = {k: v for k, v in data.items() if k != "type"}
    names = {f.name for f in fields(cls)}
    unknown = set(kwargs) - names
    if unknown:
        raise errors.InvalidRequestError(f"{cls.__name__}: unknown fields {sorted(unknown)}")
    if cls is ChangePartition:
        items = kwargs.get("items", [])
        if not isinstance(items, list):
            raise errors.InvalidRequestError("ChangePartition.items must be a list")
        kwargs["items"] = [_item_from_dict(i) for i in items]
    _check_types(cls, kwargs)
    try:
        return cls(**kwargs)
    except TypeError as exc:
        raise errors.InvalidRequestError(f"{cls.__name__}: {exc}") from None


def _is_int(v: Any) -> bool:
    return isinstance(v, int) and not isinstance(v, bool)


# Field annotation (as written in this module) -> check of a wire value. A malformed command
# is refused here, as INVALID_REQUEST, so the state machine never meets one: any exception
# inside it is a programming error (see MetadataState.apply).
_TYPE_CHECKS: dict[str, Any] = {
    "int": _is_int,
    "str": lambda v: isinstance(v, str),
    "bool": lambda v: isinstance(v, bool),
    "int | None": lambda v: v is None or _is_int(v),
    "list[int] | None": lambda v: v is None or (isinstance(v, list) and all(_is_int(x) for x in v)),
    "list[str]": lambda v: isinstance(v, list) and all(isinstance(x, str) for x in v),
    "dict[str, str]": lambda v: isinstance(v, dict) and all(isinstance(k, str) and isinstance(x, str)
                                                            for k, x in v.items()),
    "list[list[int]]": lambda v: isinstance(v, list) and all(
        isinstance(r, list) and all(_is_int(x) for x in r) for r in v),
    "list[PartitionChangeItem]": lambda v: isinstance(v, list) and all(isinstance(x, PartitionChangeItem) for x in v),
    # AlterScramCredentials' upsertions: UpsertScramCredential's six fields each.
    "list[list[str | int]]": lambda v: isinstance(v, list) and all(
        isinstance(r, list) and len(r) == 6 and all(isinstance(x, str) for x in r[:5]) and _is_int(r[5]) for r in v),
    "list[list[str]]": lambda v: isinstance(v, list) and all(
        isinstance(r, list) and all(isinstance(x, str) for x in r) for r in v),
}


def _check_types(cls: type, kwargs: dict[str, Any]) -> None:
    for f in fields(cls):
        if f.name not in kwargs:
            continue
        check = _TYPE_CHECKS.get(str(f.type))
        if check is not None and not check(kwargs[f.name]):
            raise errors.InvalidRequestError(
                f"{cls.__name__}.{f.name} must be {f.type}, got {type(kwargs[f.name]).__name__}")


def _item_from_dict(data: Any) -> PartitionChangeItem:
    if isinstance(data, PartitionChangeItem):
        return data
    if not isinstance(data, dict):
        raise errors.InvalidRequestError("partition change item must be a dict")
    try:
        _check_types(PartitionChangeItem, data)
        return PartitionChangeItem(**data)
    except TypeError as exc:
        raise errors.InvalidRequestError(f"PartitionChangeItem: {exc}") from None
