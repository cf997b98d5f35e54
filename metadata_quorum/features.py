"""Finalized feature levels: what every node of the cluster may be asked to apply (Kafka's KIP-584 / KIP-778).

A release that adds a metadata command, or a new kind of value to an existing one, cannot let the active
controller write it while an older release still runs among the voters or brokers: the older code refuses it
when it applies the Raft entry, and the nodes' metadata diverge (an ACL one voter holds and another does not). So
such a change is gated on ``brook.metadata.version``, a level stored in the metadata itself:

- every node knows the range of levels its code supports (``SUPPORTED_MIN`` .. ``SUPPORTED_MAX``), and reports
  it: brokers in their registration and heartbeats, controllers in DescribeQuorum;
- the level is raised only by an operator (``brook features upgrade``, Kafka's UpdateFeatures), after a rolling
  upgrade, and the active controller raises it only when every voter and every registered broker supports it;
- a broker whose code does not support the finalized level is refused registration (UNSUPPORTED_VERSION), so a
  node rolled back to an older release cannot rejoin a cluster that uses what it cannot read;
- a level is never lowered: what it let the controller write stays in the metadata.

A cluster made before this existed, or never upgraded, is at level 1: exactly what every release applies.
"""

from __future__ import annotations

METADATA_VERSION = "brook.metadata.version"
# Level 1: everything every release of Brook applies. Level 2: ACLs on the resource types TRANSACTIONAL_ID,
# DELEGATION_TOKEN and USER, with the operations CREATE_TOKENS and DESCRIBE_TOKENS (stored and listed as
# Kafka's are; releases before it refuse such a binding). Level 3: see CONTROLLER_LIST_OPS. Level 4: ATOMIC_SCRAM.
# Level 5: REPLICATION_FACTOR_CHANGE.
SUPPORTED_MIN = 1
SUPPORTED_MAX = 5
LEVEL_FEATURES = {
    1: "the baseline",
    2: "ACLs on TRANSACTIONAL_ID, DELEGATION_TOKEN and USER resources",
    3: "APPEND/SUBTRACT of list configs made atomic by the controller",
    4: "a user's SCRAM credential changes (Kafka's AlterUserScramCredentials) applied together",
    5: "reassignments that change a partition's replica count (a topic's replication factor)",
}
# The level each gated change needs.
EXTENDED_ACLS = 2
# Level 3: brokers send IncrementalAlterConfigs' APPEND/SUBTRACT to the controller (ListOp), which reads, changes
# and writes the value one request at a time; below it, brokers read the value and send a SET (two admins at once
# can each miss the other's change). A controller of a release before it ignores ListOp, hence the level.
CONTROLLER_LIST_OPS = 3
# Level 4: the controller applies one user's upsertions and deletions of an AlterUserScramCredentials request as one
# command (AlterScramCredentials), as Kafka writes a request's records in one batch; below it they are separate
# commands, so a failure between them (a lost quorum, a race) can leave some applied, the user without any.
ATOMIC_SCRAM = 4
# Level 5: a reassignment's target may have more or fewer replicas than the partition (Kafka changes a replication
# factor so, kafka-reassign-partitions with longer or shorter lists), and a topic's partitions may then differ in
# replica count. Releases before it refuse such a target when they apply it, and hold every partition of a topic to
# one replica count.
REPLICATION_FACTOR_CHANGE = 5
FEATURES = (METADATA_VERSION,)


def unsupported_feature(name: str) -> str:
    return f"unknown feature {name!r}: Brook has {', '.join(FEATURES)}"


def needs_level(level: int, current: int, what: str) -> str:
    """The refusal of ``what`` on a cluster whose finalized level is below ``level``."""
    return (f"{what} needs {METADATA_VERSION} {level} (the cluster's finalized level is {current}): once every "
            f"node runs a release that supports it, run `brook features upgrade --level {level}`")
