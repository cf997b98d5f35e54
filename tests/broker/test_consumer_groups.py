"""The consumer protocol's state machine (KIP-848, broker/consumer_groups.py), with simulated clients."""

from __future__ import annotations

import contextlib
import random
import re
import uuid

import pytest

from broker import consumer_groups as cg
from broker import topic_regex
from proto.common_pb2 import ErrorCode

T1 = uuid.UUID(int=1)
T2 = uuid.UUID(int=2)


class Topics:
    """The cluster's topics as the coordinator looks them up; ``version`` moves with every change, as the
    metadata's does. ``lookups`` counts the lookups."""

    def __init__(self, **counts: int) -> None:
        self.known = {name: (uuid.UUID(int=i + 1), n) for i, (name, n) in enumerate(counts.items())}
        self.version = 1
        self.lookups = 0

    def __call__(self, name: str) -> tuple[uuid.UUID, int] | None:
        self.lookups += 1
        return self.known.get(name)

    def add(self, name: str, topic: tuple[uuid.UUID, int]) -> None:
        self.known[name] = topic
        self.version += 1


def consumer_groups(topics: Topics, members_max: int = 100) -> cg.ConsumerGroups:
    return cg.ConsumerGroups(topics, members_max=members_max, metadata_version=lambda: topics.version,
                             topic_count=lambda: len(topics.known), topic_names=lambda: list(topics.known))


class Client:
    """A consumer as librdkafka behaves: it owns what it was last given, and gives up revoked partitions at once."""

    def __init__(self, groups: cg.ConsumerGroups, member_id: str, topics: list[str], *, instance: str | None = None,
                 rebalance_timeout_ms: int = 30_000, assignor: str | None = None, regex: str | None = None,
                 describable: cg.Describable | None = None) -> None:
        self.groups = groups
        self.regex = regex
        self.describable = describable
        self.member_id = member_id
        self.topics = topics
        self.instance = instance
        self.rebalance_timeout_ms = rebalance_timeout_ms
        self.assignor = assignor
        self.epoch = 0
        self.owned: dict[uuid.UUID, frozenset[int]] = {}
        self.resend_full = False

    def beat(self, now: int = 0, full: bool = False, lost: bool = False) -> cg.HeartbeatAnswer:
        """One heartbeat; ``lost``: its answer never arrives (the client carries on as before it, and sends its
        next heartbeat in full, as Kafka's clients do after a failed one)."""
        joining = self.epoch == 0
        full = full or self.resend_full
        self.resend_full = lost
        hb = cg.Heartbeat("g", self.member_id, self.epoch, instance_id=self.instance,
                          rebalance_timeout_ms=self.rebalance_timeout_ms if joining or full else -1,
                          subscribed_topic_names=self.topics if joining or full else None,
                          subscribed_topic_regex=self.regex if joining or full else None,
                          server_assignor=self.assignor if joining else None,
                          owned=[(t, sorted(p)) for t, p in self.owned.items()])
        try:
            answer = self.groups.heartbeat(hb, 0, now, self.describable)
        except cg.HeartbeatError as exc:
            if exc.code in (cg.FENCED_MEMBER_EPOCH, ErrorCode.UNKNOWN_MEMBER_ID):
                self.owned, self.epoch = {}, 0  # as librdkafka: give everything up, rejoin
            raise
        if lost:
            return answer
        self.epoch = answer.member_epoch
        if answer.assignment is not None:
            self.owned = {t: p for t, p in answer.assignment.items() if p}
        return answer

    def leave(self, now: int = 0, static: bool = False) -> None:
        epoch = cg.STATIC_LEAVE_EPOCH if static else cg.LEAVE_EPOCH
        self.groups.heartbeat(cg.Heartbeat("g", self.member_id, epoch, instance_id=self.instance), 0, now)
        self.owned, self.epoch = {}, 0

    def count(self) -> int:
        return sum(len(p) for p in self.owned.values())


def owned_disjoint(clients: list[Client]) -> None:
    seen: dict[tuple[uuid.UUID, int], str] = {}
    for c in clients:
        for t, parts in c.owned.items():
            for p in parts:
                assert (t, p) not in seen, f"{t}-{p} owned by {seen[(t, p)]} and {c.member_id}"
                seen[(t, p)] = c.member_id


def groups(**counts: int) -> cg.ConsumerGroups:
    return consumer_groups(Topics(**counts))


def test_a_partition_moves_only_once_its_owner_gave_it_up() -> None:
    g = groups(t=6)
    a, b = Client(g, "a", ["t"]), Client(g, "b", ["t"])
    first = a.beat()
    assert (first.member_epoch, a.count()) == (1, 6)
    assert first.heartbeat_interval_ms == cg.HEARTBEAT_INTERVAL_MS
    b.beat()
    # b is at the new epoch with nothing yet: its target's partitions are still a's.
    assert (b.epoch, b.count()) == (2, 0)
    assert g.groups["g"].members["b"].state == cg.UNRELEASED
    owned_disjoint([a, b])
    answer = a.beat()  # told to give up three; stays at its epoch until it has
    assert (answer.member_epoch, a.count()) == (1, 3)
    assert g.groups["g"].members["a"].state == cg.UNREVOKED
    assert g.groups["g"].state() == "Reconciling"
    b.beat()
    assert b.count() == 0  # a has not said yet that it gave them up
    a.beat()  # its heartbeat names only the three it kept
    assert (a.epoch, a.count()) == (2, 3)
    b.beat()
    assert (b.epoch, b.count()) == (2, 3)
    owned_disjoint([a, b])
    assert g.groups["g"].state() == "Stable"
    quiet = b.beat()
    assert quiet.assignment is None  # nothing changed: not sent again


def test_epochs_are_fenced_as_kafka_fences_them() -> None:
    g = groups(t=2)
    a = Client(g, "a", ["t"])
    a.beat()
    with pytest.raises(cg.HeartbeatError) as ahead:
        g.heartbeat(cg.Heartbeat("g", "a", 5, owned=[]), 0, 0)
    assert ahead.value.code == cg.FENCED_MEMBER_EPOCH
    Client(g, "b", ["t"]).beat()
    a.beat()
    a.beat()
    assert a.epoch == 2
    # The answer that moved it to 2 was lost: its previous epoch with no more than it has is accepted...
    assert g.heartbeat(cg.Heartbeat("g", "a", 1, owned=[(T1, [0])]), 0, 0).member_epoch == 2
    # ...but not while it claims a partition it does not have, nor an older epoch.
    for epoch, owned in ((1, [(T1, [0, 1])]), (0 + 1, None)):
        with pytest.raises(cg.HeartbeatError) as stale:
            g.heartbeat(cg.Heartbeat("g", "a", epoch, owned=owned), 0, 0)
        assert stale.value.code == cg.FENCED_MEMBER_EPOCH
    with pytest.raises(cg.HeartbeatError) as unknown:
        g.heartbeat(cg.Heartbeat("g", "nobody", 2, owned=[]), 0, 0)
    assert unknown.value.code == ErrorCode.UNKNOWN_MEMBER_ID
    # A fenced client rejoins at epoch 0 with its member id: it starts over, owning nothing.
    again = Client(g, "a", ["t"])
    again.beat()
    assert again.epoch > 2


def test_requests_kafka_refuses_are_refused_and_change_nothing() -> None:
    g = groups(t=2)
    cases = [
        (cg.Heartbeat("", "a", 0, rebalance_timeout_ms=1, subscribed_topic_names=["t"], owned=[]),
         ErrorCode.INVALID_REQUEST),
        (cg.Heartbeat("g", "a", 0, subscribed_topic_names=["t"], owned=[]), ErrorCode.INVALID_REQUEST),
        (cg.Heartbeat("g", "a", 0, rebalance_timeout_ms=1, subscribed_topic_names=["t"], owned=[(T1, [0])]),
         ErrorCode.INVALID_REQUEST),
        (cg.Heartbeat("g", "a", 0, rebalance_timeout_ms=1, subscribed_topic_names=[], owned=[]),
         ErrorCode.INVALID_REQUEST),
        (cg.Heartbeat("g", "a", 0, rebalance_timeout_ms=1, subscribed_topic_names=[], subscribed_topic_regex="",
                      owned=[]), ErrorCode.INVALID_REQUEST),
        # RE2 syntax (as Kafka's RE2/J): no backreferences or lookaround; unbalanced is invalid everywhere
        *[(cg.Heartbeat("g", "a", 0, rebalance_timeout_ms=1, subscribed_topic_regex=bad, owned=[]),
           topic_regex.INVALID_REGULAR_EXPRESSION)
          for bad in ("(t", "(t)\\1", "t(?=x)", "t" * (topic_regex.PATTERN_MAX_CHARS + 1))],
        (cg.Heartbeat("g", "a", 0, rebalance_timeout_ms=1, subscribed_topic_names=["t"], owned=[],
                      server_assignor="sticky"), cg.UNSUPPORTED_ASSIGNOR),
        (cg.Heartbeat("g", "a", -3), ErrorCode.INVALID_REQUEST),
        (cg.Heartbeat("g", "", 3), ErrorCode.INVALID_REQUEST),
        (cg.Heartbeat("g", "a", -2), ErrorCode.INVALID_REQUEST),  # a static leave needs its instance id
        (cg.Heartbeat("g", "a", 3, owned=[]), ErrorCode.UNKNOWN_MEMBER_ID),  # no such group (a coordinator change)
    ]
    # librdkafka sends an empty regex beside its topic names: no regex.
    g.heartbeat(cg.Heartbeat("h", "a", 0, rebalance_timeout_ms=1, subscribed_topic_names=["t"],
                             subscribed_topic_regex="", owned=[]), 0, 0)
    g.groups.clear()
    for hb, code in cases:
        with pytest.raises(cg.HeartbeatError) as refused:
            g.heartbeat(hb, 0, 0)
        assert refused.value.code == code, hb
    assert g.groups == {}


def test_leaving_and_timing_out_free_the_partitions() -> None:
    g = groups(t=4)
    a, b = Client(g, "a", ["t"]), Client(g, "b", ["t"])
    for _ in range(3):
        a.beat()
        b.beat()
    assert (a.count(), b.count()) == (2, 2)
    b.leave()
    a.beat()
    assert a.count() == 4
    c = Client(g, "c", ["t"])
    c.beat(now=1000)
    a.beat(now=1000)
    a.beat(now=1000)
    c.beat(now=1000)
    assert (a.count(), c.count()) == (2, 2)
    # c keeps heartbeating; a goes silent and its session runs out.
    c.beat(now=40_000)
    assert g.expire(1000 + cg.SESSION_TIMEOUT_MS - 1) == []
    assert [m for _, m, _ in g.expire(1000 + cg.SESSION_TIMEOUT_MS)] == ["a"]
    c.beat(now=46_000)
    assert c.count() == 4


def test_a_member_that_keeps_revoked_partitions_past_its_rebalance_timeout_is_removed() -> None:
    g = groups(t=2)
    a = Client(g, "a", ["t"], rebalance_timeout_ms=5000)
    a.beat(now=0)
    Client(g, "b", ["t"]).beat(now=0)
    # a is told to give one up, and goes on naming it as owned.
    g.heartbeat(cg.Heartbeat("g", "a", 1, owned=[(T1, [0, 1])]), 0, 100)
    assert g.groups["g"].members["a"].state == cg.UNREVOKED
    g.heartbeat(cg.Heartbeat("g", "a", 1, owned=[(T1, [0, 1])]), 0, 4000)
    assert g.expire(5099) == []
    assert [(m, why) for _, m, why in g.expire(5100)] == [
        ("a", "it did not give up its revoked partitions within its rebalance timeout")]


def test_a_static_member_keeps_its_partitions_while_it_restarts() -> None:
    g = groups(t=4)
    a, b = Client(g, "a1", ["t"], instance="i-a"), Client(g, "b", ["t"])
    for _ in range(3):
        a.beat()
        b.beat()
    # Another process with its instance id while it is still in: refused.
    with pytest.raises(cg.HeartbeatError) as in_use:
        g.heartbeat(cg.Heartbeat("g", "a2", 0, instance_id="i-a", rebalance_timeout_ms=1,
                                 subscribed_topic_names=["t"], owned=[]), 0, 0)
    assert in_use.value.code == cg.UNRELEASED_INSTANCE_ID
    kept = dict(a.owned)
    a.leave(static=True)
    b.beat()
    b.beat()
    assert b.count() == 2  # a's partitions are not handed out while it is away
    restarted = Client(g, "a2", ["t"], instance="i-a")
    restarted.beat()
    assert restarted.owned == kept  # the new process takes them over
    owned_disjoint([restarted, b])
    with pytest.raises(cg.HeartbeatError) as replaced:
        g.heartbeat(cg.Heartbeat("g", "a1", 3, instance_id="i-a", owned=[]), 0, 0)
    assert replaced.value.code == ErrorCode.FENCED_INSTANCE_ID
    # Away too long: its session ends and the partitions go to the others.
    restarted.leave(static=True)
    b.beat(now=1000)
    g.expire(cg.SESSION_TIMEOUT_MS)
    b.beat(now=cg.SESSION_TIMEOUT_MS)
    assert b.count() == 4


def test_topics_made_later_and_subscription_changes_are_assigned() -> None:
    topics = Topics(t=2)
    g = consumer_groups(topics)
    a = Client(g, "a", ["t", "later"])
    a.beat()
    assert a.owned == {T1: frozenset({0, 1})}
    looked = topics.lookups
    a.beat()
    assert topics.lookups == looked  # nothing changed: nothing looked up again
    topics.add("later", (T2, 3))
    a.beat()  # the metadata moved: the group's names are looked up again
    assert a.owned == {T1: frozenset({0, 1}), T2: frozenset({0, 1, 2})}
    a.topics = ["later"]
    a.beat(full=True)  # gives up t's partitions first
    assert a.owned == {T2: frozenset({0, 1, 2})}
    a.beat()
    assert g.groups["g"].state() == "Stable"
    assert set(g.groups["g"].subscribers) == {"later"}


def test_a_group_names_a_bounded_number_of_topics() -> None:
    g = groups(t=1)
    names = [f"n{i}" for i in range(cg.SUBSCRIBED_NAMES_MIN_BOUND)]
    Client(g, "a", names[:600]).beat()
    with pytest.raises(cg.HeartbeatError) as refused:
        Client(g, "b", names[300:] + ["one-more"]).beat()
    assert refused.value.code == ErrorCode.INVALID_REQUEST and "at most 1000" in refused.value.message
    assert set(g.groups["g"].members) == {"a"}
    Client(g, "c", names[300:]).beat()  # exactly the bound


def test_offset_commits_follow_the_member_epoch() -> None:
    g = groups(t=2)
    a = Client(g, "a", ["t"])
    a.beat()
    g.validate_commit("g", "a", 1)
    g.validate_commit("other", "", -1)  # not a consumer group: the classic rules apply
    for member, epoch, code in (("a", 0, cg.STALE_MEMBER_EPOCH), ("nobody", 1, ErrorCode.UNKNOWN_MEMBER_ID),
                                ("", -1, ErrorCode.UNKNOWN_MEMBER_ID)):
        with pytest.raises(cg.HeartbeatError) as refused:
            g.validate_commit("g", member, epoch)
        assert refused.value.code == code
    a.leave()
    g.validate_commit("g", "", -1)  # empty: an admin may reset its offsets


def test_group_size_is_bounded() -> None:
    g = consumer_groups(Topics(t=1), members_max=2)
    Client(g, "a", ["t"]).beat()
    Client(g, "b", ["t"]).beat()
    with pytest.raises(cg.HeartbeatError) as full:
        Client(g, "c", ["t"]).beat()
    assert full.value.code == ErrorCode.GROUP_MAX_SIZE_REACHED


@pytest.mark.parametrize("seed", range(40))
def test_random_runs_never_give_a_partition_to_two_clients_and_settle(seed: int) -> None:
    rng = random.Random(seed)
    g = groups(t=rng.randint(1, 12), u=rng.randint(1, 5))
    assignor = rng.choice([None, "uniform", "range"])
    clients: list[Client] = []
    now = 0
    for step in range(300):
        now += 10
        roll = rng.random()
        if roll < 0.08 and len(clients) < 6:
            clients.append(Client(g, f"m{seed}-{step}", rng.choice([["t"], ["t", "u"], ["u"]]), assignor=assignor))
            clients[-1].beat(now)
        elif roll < 0.12 and clients:
            clients.pop(rng.randrange(len(clients))).leave(now)
        elif clients:
            with contextlib.suppress(cg.HeartbeatError):  # fenced after a lost answer: it rejoins next time
                rng.choice(clients).beat(now, lost=rng.random() < 0.1)
        owned_disjoint(clients)
    for _ in range(10):  # everyone heartbeats a few rounds: the group settles with every partition owned once
        for c in clients:
            with contextlib.suppress(cg.HeartbeatError):
                c.beat(now)
    owned_disjoint(clients)
    if clients:
        group = g.groups["g"]
        assert group.state() == "Stable"
        subscribed = {t for c in clients for t in c.topics}
        owned = sum(c.count() for c in clients)
        assert owned == sum(group.topics[t][1] for t in subscribed)


def test_groups_left_empty_are_forgotten_and_expiry_waits_for_the_first_deadline() -> None:
    g = groups(t=1)
    a = Client(g, "a", ["t"])
    a.beat()
    a.leave()
    assert g.groups == {}  # made-up groups cost only while their members are in
    b = Client(g, "b", ["t"])
    b.beat(now=1000)
    assert g.expire(2000) == []
    assert g.next_due_ms == 1000 + cg.SESSION_TIMEOUT_MS  # no walk over the members before then
    b.beat(now=3000)
    assert g.expire(1000 + cg.SESSION_TIMEOUT_MS) == []  # its heartbeat moved its deadline on
    assert [m for _, m, _ in g.expire(3000 + cg.SESSION_TIMEOUT_MS)] == ["b"]
    assert g.groups == {}


# ---------------------------------------------------------------------------- regular expressions


def partitions_of(client: Client, topics: Topics, *names: str) -> int:
    ids = {topics.known[n][0] for n in names}
    return sum(len(p) for t, p in client.owned.items() if t in ids)


def test_a_regex_subscription_is_assigned_the_topics_it_fully_matches() -> None:
    topics = Topics(**{"logs-a": 2, "logs-b": 1, "other": 3, "xlogs-c": 1})
    g = consumer_groups(topics)
    a = Client(g, "a", [], regex="logs-.*")
    a.beat()
    a.beat()
    assert a.count() == 3 and partitions_of(a, topics, "logs-a", "logs-b") == 3  # not other, not xlogs-c (full match)
    # names and a regex: the union
    b = Client(g, "b", ["other"], regex="logs-a")
    for _ in range(3):
        a.beat()
        b.beat()
    owned_disjoint([a, b])
    assert a.count() + b.count() == 6 and partitions_of(b, topics, "other") == 3
    [member] = [m for m in g.groups["g"].members.values() if m.member_id == "b"]
    assert (member.topic_names, member.regex, member.subscribed) == (
        frozenset({"other"}), "logs-a", frozenset({"other", "logs-a"}))


def test_a_topic_made_later_is_matched_at_kafkas_pace() -> None:
    """A new matching topic joins the subscription once the metadata moved and 10 s passed since the group's
    last match; with no metadata change (an ACL), every regex_refresh_interval_ms."""
    topics = Topics(**{"logs-a": 2})
    g = consumer_groups(topics)
    a = Client(g, "a", [], regex="logs-.*")
    a.beat(now=0)
    a.beat(now=0)
    assert a.count() == 2
    topics.add("logs-b", (uuid.UUID(int=50), 2))
    a.beat(now=cg.REGEX_REFRESH_MIN_MS - 1)
    assert a.count() == 2, "matched again sooner than Kafka does"
    a.beat(now=cg.REGEX_REFRESH_MIN_MS)
    a.beat(now=cg.REGEX_REFRESH_MIN_MS)
    assert a.count() == 4

    allowed = {"logs-a", "logs-b"}
    a.describable = lambda names: names & allowed
    topics.known["logs-c"] = (uuid.UUID(int=51), 1)  # appears with no version move (as an ACL change would)
    a.beat(now=cg.REGEX_REFRESH_MIN_MS * 2)
    assert a.count() == 4
    allowed.add("logs-c")
    a.beat(now=cg.REGEX_REFRESH_MIN_MS + g.regex_refresh_interval_ms)
    a.beat(now=cg.REGEX_REFRESH_MIN_MS + g.regex_refresh_interval_ms)
    assert a.count() == 5


def test_a_regex_matches_only_what_the_member_may_describe() -> None:
    topics = Topics(**{"logs-a": 2, "logs-secret": 4})
    g = consumer_groups(topics)
    a = Client(g, "a", [], regex="logs-.*", describable=lambda names: names - {"logs-secret"})
    a.beat()
    a.beat()
    assert a.count() == 2 and partitions_of(a, topics, "logs-secret") == 0


def test_a_regex_change_and_the_last_member_leaving_forget_the_pattern() -> None:
    topics = Topics(**{"logs-a": 2, "metrics-a": 3})
    g = consumer_groups(topics)
    a = Client(g, "a", [], regex="logs-.*")
    b = Client(g, "b", [], regex="logs-.*")
    for _ in range(3):
        a.beat()
        b.beat()
    assert a.count() + b.count() == 2
    b.regex = "metrics-.*"
    for _ in range(3):
        b.beat(full=True)
        a.beat()
    assert (a.count(), b.count()) == (2, 3)
    group = g.groups["g"]
    assert group.regexes == {"logs-.*": 1, "metrics-.*": 1}
    b.leave()
    assert group.regexes == {"logs-.*": 1} and set(group.resolved) == {"logs-.*"}


def test_regex_refusals_change_nothing_and_a_group_has_at_most_its_bound_of_patterns() -> None:
    topics = Topics(t=1)
    g = consumer_groups(topics)
    clients = [Client(g, f"m{i}", [], regex=f"t{i}.*") for i in range(cg.GROUP_REGEXES_MAX)]
    for c in clients:
        c.beat()
    before = dict(g.groups["g"].regexes)
    with pytest.raises(cg.HeartbeatError) as refused:
        Client(g, "one-too-many", [], regex="u.*").beat()
    assert refused.value.code == ErrorCode.INVALID_REQUEST
    with pytest.raises(cg.HeartbeatError) as refused:
        Client(g, "bad", [], regex="(u").beat()
    assert refused.value.code == topic_regex.INVALID_REGULAR_EXPRESSION and "missing )" in refused.value.message
    # a pattern the group already has is taken whatever the bound
    Client(g, "same", [], regex="t0.*").beat()
    assert set(g.groups["g"].regexes) == set(before) and "bad" not in g.groups["g"].members


def test_a_static_member_restart_keeps_its_regex() -> None:
    topics = Topics(**{"logs-a": 2, "other": 2})
    g = consumer_groups(topics)
    a = Client(g, "a", [], regex="logs-.*", instance="i1")
    a.beat()
    a.beat()
    a.leave(static=True)
    a2 = Client(g, "a2", [], regex="logs-.*", instance="i1")
    a2.beat()
    a2.beat()
    assert a2.count() == 2 and g.groups["g"].regexes == {"logs-.*": 1}


def test_resolution_of_many_patterns_against_many_names_matches_each_in_full() -> None:
    names = [f"topic-{i}" for i in range(5000)] + ["__consumer_offsets"]
    patterns = [f"topic-{i}.*" for i in range(10)] + ["topic-1", "nothing", ".*offsets"]
    got = topic_regex.resolve(patterns, names)
    for pattern in patterns:
        expected = frozenset(n for n in names if re.fullmatch(pattern, n))
        assert got[pattern] == expected, pattern
