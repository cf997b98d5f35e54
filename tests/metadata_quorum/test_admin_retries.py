"""Admin retries of controller writes whose per-topic answer says the controller moved.

Two scripted ControllerService servers on real gRPC sockets stand for the old and the
new active controller, answering exactly what was seen after a controller failover:
per-topic NOT_CONTROLLER ("proposed by the controller of epoch 1") and REQUEST_TIMED_OUT
whose proposal committed after all. (The servers are scripted because a real quorum
cannot be made to produce these answers on cue; the admin client under test is real.)
"""

from __future__ import annotations

import threading
from collections.abc import Iterator
from concurrent import futures

import grpc
import pytest

from client import errors
from client.admin import Admin, NewTopic
from proto import common_pb2
from proto import controller_pb2 as pb
from proto import controller_pb2_grpc as pb_grpc
from proto.errors import ErrorCode


class Scripted(pb_grpc.ControllerServiceServicer):
    """A controller that is active until ``deposed`` is set; CreateTopics answers come from ``answers``."""

    def __init__(self, node_id: int, answers: dict[str, tuple[int, str]]) -> None:
        self.node_id = node_id
        self.answers = answers  # name -> (error code, topic id) while active
        self.deposed = threading.Event()
        self.redirect_to: tuple[int, int] | None = None  # (node id, port) once deposed
        self.requests: list[list[str]] = []

    def _redirect(self) -> pb.ControllerRedirect:
        if self.redirect_to is None:
            return pb.ControllerRedirect(leader_id=-1)
        node, port = self.redirect_to
        return pb.ControllerRedirect(leader_id=node, leader=common_pb2.Endpoint(name="CONTROLLER", host="127.0.0.1",
                                                                                   port=port))

    def DescribeQuorum(self, request, context):  # noqa: N802
        if self.deposed.is_set():
            return pb.DescribeQuorumResponse(error_code=ErrorCode.NOT_CONTROLLER, redirect=self._redirect())
        return pb.DescribeQuorumResponse(leader_id=self.node_id, responder_id=self.node_id, responder_is_active=True)

    def CreateTopics(self, request, context):  # noqa: N802
        names = [t.name for t in request.topics]
        self.requests.append(names)
        if self.deposed.is_set():
            return pb.CreateTopicsResponse(error_code=ErrorCode.NOT_CONTROLLER, redirect=self._redirect())
        response = pb.CreateTopicsResponse()
        for name in names:
            code, topic_id = self.answers[name]
            response.results.add(name=name, error_code=code, topic_id=topic_id,
                                 error_message=ErrorCode.Name(code) if code else "")
        # What the old controller answers is its last word: it is deposed from now on.
        if self.redirect_to is not None:
            self.deposed.set()
        return response


@pytest.fixture
def controllers() -> Iterator[tuple[Scripted, Scripted, list[tuple[str, int]]]]:
    old = Scripted(1, {})
    new = Scripted(2, {})
    servers, endpoints = [], []
    for servicer in (old, new):
        server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        pb_grpc.add_ControllerServiceServicer_to_server(servicer, server)
        endpoints.append(("127.0.0.1", server.add_insecure_port("127.0.0.1:0")))
        server.start()
        servers.append(server)
    old.redirect_to = (2, endpoints[1][1])
    try:
        yield old, new, endpoints
    finally:
        for server in servers:
            server.stop(0)


def admin_for(endpoints: list[tuple[str, int]]) -> Admin:
    # Only the old controller is known at first: the new one is found through the redirect.
    return Admin("127.0.0.1:1", controller_endpoints=endpoints[:1], request_timeout_ms=20_000)


def test_per_topic_not_controller_and_timeouts_are_retried_on_the_new_controller(controllers) -> None:  # type: ignore[no-untyped-def]
    old, new, endpoints = controllers
    old.answers = {"refused": (ErrorCode.NOT_CONTROLLER, ""),  # the state refused it: not created
                   "lost": (ErrorCode.NOT_CONTROLLER, "id-lost"),  # "not committed, leadership changed"
                   "late": (ErrorCode.REQUEST_TIMED_OUT, "id-late"),  # committed after the answer
                   "fine": (ErrorCode.NONE, "id-fine")}
    new.answers = {"refused": (ErrorCode.NONE, "id-refused-2"),
                   "lost": (ErrorCode.NONE, "id-lost-2"),
                   "late": (ErrorCode.TOPIC_ALREADY_EXISTS, "id-late")}  # our own first attempt
    with admin_for(endpoints) as admin:
        result = admin.create_topics([NewTopic(n, 1, 1) for n in ("refused", "lost", "late", "fine")],
                                     wait_for_leaders=False)
    assert result == {"refused": None, "lost": None, "late": None, "fine": None}
    assert old.requests == [["refused", "lost", "late", "fine"]]
    assert new.requests == [["refused", "lost", "late"]]  # only the unfinished topics, to the new controller


def test_someone_elses_topic_is_still_reported_as_existing(controllers) -> None:  # type: ignore[no-untyped-def]
    old, new, endpoints = controllers
    old.answers = {"t": (ErrorCode.REQUEST_TIMED_OUT, "id-ours")}
    new.answers = {"t": (ErrorCode.TOPIC_ALREADY_EXISTS, "id-theirs")}
    with admin_for(endpoints) as admin, pytest.raises(errors.TopicAlreadyExistsError):
        admin.create_topics([NewTopic("t", 1, 1)], wait_for_leaders=False)


def test_retries_stop_at_the_request_timeout(controllers) -> None:  # type: ignore[no-untyped-def]
    old, _, endpoints = controllers
    old.redirect_to = None  # it stays "active" and keeps answering NOT_CONTROLLER per topic
    old.answers = {"t": (ErrorCode.NOT_CONTROLLER, "")}
    with Admin("127.0.0.1:1", controller_endpoints=endpoints[:1], request_timeout_ms=1500) as admin:
        result = admin.create_topics([NewTopic("t", 1, 1)], wait_for_leaders=False, raise_on_error=False)
    assert isinstance(result["t"], errors.NotControllerError), result
    assert 2 <= len(old.requests) <= 40, len(old.requests)
