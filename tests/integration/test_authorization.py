"""ACL authorization over the wire (issue 16), opt-in with `broker.authorization_enabled`:
every request code is refused to a user without the ACL entries it needs and served once
they exist (a table over `RequestCode`, so that a new request kind without an entry in
`REQUEST_ACLS` fails here); list answers are cut to what the user may describe; `%SYS%`
topics are the broker's alone, super users included; entries survive a restart; and the
`tidemq acl` commands manage them."""

from __future__ import annotations

import json
from collections.abc import Callable
from typing import TYPE_CHECKING, Any

import msgspec
import pytest
from typer.testing import CliRunner

import tidemq
import tidemq.aio
from tidemq.broker.broker import Broker
from tidemq.broker.config import BrokerConfig
from tidemq.broker.request_permissions import REQUEST_ACLS
from tidemq.cli.main import app
from tidemq.client.cluster import ClientConfig
from tidemq.core.errors import AuthorizationFailed, ConfigError, TopicNotFound
from tidemq.net.client import ClientConnection
from tidemq.protocol import commands as c
from tidemq.protocol.acl_messages import (
    AclCreateRequest,
    AclDeleteRequest,
    AclEntryMsg,
    AclListRequest,
)
from tidemq.protocol.codes import RequestCode
from tidemq.protocol.commands import REQUESTS
from tidemq.protocol.kv_messages import CompactRequest, KvGetRequest
from tidemq.protocol.query_messages import OriginMessageRequest, QueryMessagesRequest
from tidemq.protocol.replica_messages import (
    ElectLeaderRequest,
    ReplicaFetchRequest,
    ReplicaFileRequest,
)
from tidemq.protocol.security_messages import (
    SecurityPullRequest,
    SecurityPushRequest,
    SecuritySnapshot,
)
from tidemq.protocol.static_messages import (
    StaticOpenRequest,
    StaticSealRequest,
    StaticTimersAdoptRequest,
    StaticTimersHandedRequest,
    StaticTimersTakeRequest,
    StaticUpdateRequest,
)
from tidemq.protocol.tier_messages import (
    TierFilesRequest,
    TierOffloadRequest,
    TierStatusRequest,
)
from tidemq.store.config import StoreConfig

if TYPE_CHECKING:
    from tests.integration.conftest import BrokerEnv, Loop, StartBroker, ThreadedBroker

pytestmark = pytest.mark.timeout(90)

ADMIN, ADMIN_PASSWORD = "admin", "admin-secret-1"
BOB, BOB_PASSWORD = "bob", "bob-secret-1"
T, G, X, NEW, GONE = "acl-t", "acl-g", "acl-x", "acl-new", "acl-gone"
_FRAME = 8 << 20

_ENTRY = AclEntryMsg(
    principal="User:nobody",
    resource_type="topic",
    resource_name="x",
    operation="read",
    permission="allow",
)

#: One request of each code, naming the test's resources. A new RequestCode needs a
#: sample here and its requirements in broker/authorization.py's REQUEST_ACLS.
SAMPLES: dict[RequestCode, msgspec.Struct] = {
    RequestCode.PRODUCE: c.ProduceRequest(topic=T, queue=0),
    RequestCode.FETCH: c.FetchRequest(topic=T, queue=0, offset=0, max_bytes=1024, max_wait_ms=0),
    RequestCode.LIST_OFFSETS: c.ListOffsetsRequest(topic=T, queue=0),
    RequestCode.INIT_PRODUCER: c.InitProducerRequest(),
    RequestCode.CREATE_TOPIC: c.CreateTopicRequest(name=NEW, queues=1),
    RequestCode.CREATE_TOPICS: c.CreateTopicsRequest(
        topics=[c.CreateTopicRequest(name=NEW + "-batch", queues=1)]
    ),
    RequestCode.QUERY_MESSAGES: QueryMessagesRequest(topic=T, key=b"k"),
    RequestCode.ORIGIN_MESSAGE: OriginMessageRequest(message_id="0" * 28),
    RequestCode.ALTER_TOPIC: c.AlterTopicRequest(name=T, queues=1),
    RequestCode.DELETE_TOPIC: c.DeleteTopicRequest(name=GONE),
    RequestCode.LIST_TOPICS: c.ListTopicsRequest(),
    RequestCode.DESCRIBE_TOPIC: c.DescribeTopicRequest(name=T),
    RequestCode.JOIN_GROUP: c.JoinGroupRequest(group=G, topics=[T]),
    RequestCode.HEARTBEAT: c.HeartbeatRequest(group=G, member_id="m", generation=1),
    RequestCode.LEAVE_GROUP: c.LeaveGroupRequest(group=G, member_id="m"),
    RequestCode.COMMIT_OFFSETS: c.CommitOffsetsRequest(
        group=G, offsets=[c.QueueOffset(topic=T, queue=0, offset=0)]
    ),
    RequestCode.FETCH_OFFSETS: c.FetchOffsetsRequest(group=G),
    RequestCode.LIST_GROUPS: c.ListGroupsRequest(),
    RequestCode.DESCRIBE_GROUP: c.DescribeGroupRequest(group=G),
    RequestCode.RESET_OFFSETS: c.ResetOffsetsRequest(group=G, topic=T, to="earliest"),
    RequestCode.GET_ROUTES: c.GetRoutesRequest(topics=[T]),
    RequestCode.REGISTER_BROKER: c.RegisterBrokerRequest(
        broker_name="evil", address="127.0.0.1:1", topics=[]
    ),
    RequestCode.UNREGISTER_BROKER: c.UnregisterBrokerRequest(broker_name="evil"),
    RequestCode.SECURITY_PUSH: SecurityPushRequest(broker_name="evil", snapshot=SecuritySnapshot()),
    RequestCode.SECURITY_PULL: SecurityPullRequest(broker_name="evil"),
    RequestCode.ELECT_LEADER: ElectLeaderRequest(group="g", member="m1"),
    RequestCode.REPLICA_FETCH: ReplicaFetchRequest(
        group="g", member="evil", epoch=1, position=0, durable=0
    ),
    RequestCode.REPLICA_FILE: ReplicaFileRequest(
        group="g", member="evil", epoch=1, topic_id=1, queue_id=0, generation=1, offset=0
    ),
    RequestCode.CLUSTER_STATUS: c.ClusterStatusRequest(),
    RequestCode.STATUS: c.StatusRequest(),
    RequestCode.CANCEL_DELAYED: c.CancelDelayedRequest(message_id="0" * 32),
    RequestCode.TIMER_STATUS: c.TimerStatusRequest(),
    RequestCode.BEGIN_TXN: c.BeginTxnRequest(group=X),
    RequestCode.END_TXN: c.EndTxnRequest(txn_ids=["unknown"], commit=True),
    RequestCode.SINK_MARKER: c.SinkMarkerRequest(sink_id=X),
    RequestCode.CHECK_TXN: c.CheckTxnRequest(
        txn_id="t", group=X, messages=0, topics=[], first_send_ms=0, check=0
    ),
    RequestCode.REGISTER_CHECKER: c.RegisterCheckerRequest(group=X),
    RequestCode.TXN_STATUS: c.TxnStatusRequest(),
    RequestCode.POP_RECEIVE: c.PopReceiveRequest(
        group=G, subscriptions=[c.PopSubscription(topic=T)], max_messages=1, invisible_ms=1000
    ),
    RequestCode.POP_ACK: c.PopAckRequest(group=G, handles=[]),
    RequestCode.POP_CHANGE_INVISIBLE: c.PopChangeInvisibleRequest(
        group=G, handle="h", invisible_ms=1000
    ),
    RequestCode.POP_NACK: c.PopNackRequest(group=G, handle="h"),
    RequestCode.POP_STATUS: c.PopStatusRequest(group=G),
    RequestCode.POP_RESUME: c.PopResumeRequest(group=G, message_id="0" * 32),
    RequestCode.SASL_HANDSHAKE: c.SaslHandshakeRequest(mechanism="SCRAM-SHA-256"),
    RequestCode.SASL_AUTHENTICATE: c.SaslAuthenticateRequest(message=b"n,,n=x,r=y"),
    RequestCode.USER_UPSERT: c.UserUpsertRequest(
        name="carol", salt=b"s" * 16, iterations=4096, stored_key=b"k" * 32, server_key=b"v" * 32
    ),
    RequestCode.USER_DELETE: c.UserDeleteRequest(name="nobody"),
    RequestCode.USER_LIST: c.UserListRequest(),
    RequestCode.ACL_CREATE: AclCreateRequest(entries=[_ENTRY]),
    RequestCode.ACL_DELETE: AclDeleteRequest(entries=[_ENTRY]),
    RequestCode.ACL_LIST: AclListRequest(),
    RequestCode.KV_GET: KvGetRequest(topic=T, queue=0, key=b"k"),
    RequestCode.COMPACT: CompactRequest(topic=T),
    RequestCode.STATIC_OPEN: StaticOpenRequest(topic=T, queues=1),
    RequestCode.STATIC_SEAL: StaticSealRequest(topic=T, queue=0, epoch=2, target="b"),
    RequestCode.STATIC_UPDATE: StaticUpdateRequest(topic=T),
    RequestCode.STATIC_TIMERS_TAKE: StaticTimersTakeRequest(topic=T, queue=0, dest="b"),
    RequestCode.STATIC_TIMERS_ADOPT: StaticTimersAdoptRequest(topic=T, queue=0, source="b"),
    RequestCode.STATIC_TIMERS_HANDED: StaticTimersHandedRequest(topic=T, queue=0, through=0),
    RequestCode.TIER_STATUS: TierStatusRequest(),
    RequestCode.TIER_FILES: TierFilesRequest(topic=T),
    RequestCode.TIER_OFFLOAD: TierOffloadRequest(topic=T),
}
#: Codes that stay refused to a user with every ACL entry: user management is for the
#: super users only (the Authenticator's own check).
SUPER_USERS_ONLY = {RequestCode.USER_UPSERT, RequestCode.USER_DELETE, RequestCode.USER_LIST}


def _needed(code: RequestCode) -> list[tidemq.Acl]:
    """The entries that let bob send SAMPLES[code] (END_TXN's unknown transaction has no
    group, so only its sink id, which it does not give, would count)."""
    out = []
    for rule in REQUEST_ACLS[code]:
        for name in rule.names(SAMPLES[code]):
            if code is RequestCode.END_TXN and name == "unknown":
                continue  # a transaction id, resolved to its group (none: unknown)
            out.append(
                tidemq.Acl(
                    principal=f"User:{BOB}",
                    resource_type=rule.requirement.resource_type.value,
                    resource_name=name,
                    operation=rule.requirement.operation.value,
                )
            )
    return out


def test_every_request_code_has_requirements_and_a_sample() -> None:
    missing = sorted(code.name for code in RequestCode if code not in REQUEST_ACLS)
    assert not missing, (
        f"request codes {missing} have no entry in REQUEST_ACLS "
        "(src/tidemq/broker/authorization.py): say what each needs, () for nothing"
    )
    unsampled = sorted(code.name for code in RequestCode if code not in SAMPLES)
    assert not unsampled, f"add a request of {unsampled} to SAMPLES in this test"
    for code, sample in SAMPLES.items():
        assert isinstance(sample, REQUESTS[code][0]), code


def test_authorization_needs_authentication(tmp_path: Any) -> None:
    with pytest.raises(ConfigError, match=r"authorization_enabled needs broker\.auth_enabled"):
        BrokerConfig(store=StoreConfig(data_dir=tmp_path), authorization_enabled=True)


def _start(start_broker: StartBroker) -> BrokerEnv:
    return start_broker(
        auth_enabled=True,
        authorization_enabled=True,
        bootstrap_user=ADMIN,
        bootstrap_password=ADMIN_PASSWORD,
    )


def _config(username: str, password: str) -> ClientConfig:
    return ClientConfig(
        username=username,
        password=password,
        retries=0,
        connect_timeout_ms=5_000,
        request_timeout_ms=5_000,
    )


async def _answers(address: str) -> dict[RequestCode, BaseException | None]:
    """Each sample sent as bob: the error it got, or None."""
    conn = await ClientConnection.open(
        address, max_frame_bytes=_FRAME, username=BOB, password=BOB_PASSWORD
    )
    out: dict[RequestCode, BaseException | None] = {}
    try:
        for code in RequestCode:
            try:
                await conn.request(SAMPLES[code], REQUESTS[code][1], timeout_s=10)
                out[code] = None
            except Exception as exc:  # the test looks at which
                out[code] = exc
    finally:
        conn.close()
    return out


def _refused(error: BaseException | None) -> bool:
    return isinstance(error, AuthorizationFailed)


def test_each_request_code_is_refused_without_its_acl_and_served_with_it(
    loop: Loop, start_broker: StartBroker
) -> None:
    env = _start(start_broker)
    admin_config = _config(ADMIN, ADMIN_PASSWORD)

    async def prepare() -> None:
        async with tidemq.aio.Admin(env.address, client_config=admin_config) as admin:
            await admin.create_topic(T, 1)
            await admin.create_topic(GONE, 1)
            await admin.create_user(BOB, BOB_PASSWORD)

    loop.run(prepare())
    before = loop.run(_answers(env.address))
    for code in RequestCode:
        needs = bool(_needed(code)) or code in SUPER_USERS_ONLY
        if code is RequestCode.END_TXN:
            needs = False  # its one transaction is unknown: no group to need WRITE on
        assert _refused(before[code]) == needs, (code.name, before[code])
        if needs:
            assert f"User:{BOB} may not" in str(before[code]) or code in SUPER_USERS_ONLY

    async def grant() -> int:
        async with tidemq.aio.Admin(env.address, client_config=admin_config) as admin:
            return await admin.create_acls([a for code in RequestCode for a in _needed(code)])

    assert loop.run(grant()) > 0
    after = loop.run(_answers(env.address))
    for code in RequestCode:
        if code in SUPER_USERS_ONLY:
            assert "only the super users" in str(after[code]), (code.name, after[code])
        else:
            assert not _refused(after[code]), (code.name, after[code])


def test_lists_show_only_what_the_user_may_describe_and_sys_topics_are_the_brokers(
    loop: Loop, start_broker: StartBroker
) -> None:
    env = _start(start_broker)
    admin_config = _config(ADMIN, ADMIN_PASSWORD)
    bob_config = _config(BOB, BOB_PASSWORD)

    async def go() -> None:
        async with tidemq.aio.Admin(env.address, client_config=admin_config) as admin:
            for name in ("orders-eu", "orders-us", "payroll"):
                await admin.create_topic(name, 1)
            await admin.create_user(BOB, BOB_PASSWORD)
            grant = tidemq.Acl(
                principal=f"User:{BOB}",
                resource_type="topic",
                resource_name="orders-",
                pattern_type="prefixed",
                operation="write",
            )
            assert await admin.create_acls([grant]) == 1
            assert await admin.create_acls([grant]) == 0  # already there
            assert await admin.list_acls(principal=f"User:{BOB}") == [grant]
        # Super users too: no entry grants writes to %SYS% topics (the client refuses
        # such names; a raw request, as a forger would send it).
        conn = await ClientConnection.open(
            env.address, max_frame_bytes=_FRAME, username=ADMIN, password=ADMIN_PASSWORD
        )
        try:
            forged = c.ProduceRequest(topic="%SYS%timer", queue=0)
            with pytest.raises(AuthorizationFailed, match="WRITE topic '%SYS%timer'"):
                await conn.request(forged, c.ProduceResponse, b"forged", timeout_s=10)
        finally:
            conn.close()
        async with tidemq.aio.Admin(env.address, client_config=bob_config) as admin:
            names = {t.name for t in await admin.list_topics()}
            assert names == {"orders-eu", "orders-us"}  # WRITE implies DESCRIBE
            # A topic bob may not describe is refused by name, whether it exists or not
            # (the same answer for both: its existence is not revealed); lists leave it out.
            for name in ("payroll", "no-such-topic"):
                with pytest.raises(AuthorizationFailed, match=f"may not describe topic '{name}'"):
                    await admin.describe_topic(name)
        async with tidemq.aio.Producer(env.address, client_config=bob_config) as p:
            await p.send("orders-eu", b"ok")
            with pytest.raises(AuthorizationFailed, match="may not describe topic 'payroll'"):
                await p.send("payroll", b"no")
        async with tidemq.aio.Admin(env.address, client_config=admin_config) as admin:
            with pytest.raises(TopicNotFound):  # a user who may describe anything is told
                await admin.describe_topic("no-such-topic")

    loop.run(go(), timeout_s=60)


def test_cli_manages_entries(start_sync_broker: Callable[..., ThreadedBroker]) -> None:
    tb = start_sync_broker(
        auth_enabled=True,
        authorization_enabled=True,
        bootstrap_user=ADMIN,
        bootstrap_password=ADMIN_PASSWORD,
    )
    runner = CliRunner()
    login = {"TIDEMQ_USERNAME": ADMIN, "TIDEMQ_PASSWORD": ADMIN_PASSWORD}
    where = ["--bootstrap", tb.address]
    add = ["acl", "add", "--allow-principal", "User:alice", "--operation", "read"]
    add += ["--operation", "describe", "--topic", "orders", "--group", "billing", *where]
    result = runner.invoke(app, add, env=login)
    assert result.exit_code == 0, result.output
    assert "4 of 4 ACL entries added" in result.output
    listed = runner.invoke(app, ["acl", "list", "-o", "json", *where], env=login)
    assert listed.exit_code == 0, listed.output
    assert {(a["operation"], a["resource_type"]) for a in json.loads(listed.output)} == {
        ("read", "topic"),
        ("describe", "topic"),
        ("read", "group"),
        ("describe", "group"),
    }
    bad = runner.invoke(app, [*add[:4], "--operation", "fly", "--topic", "t", *where], env=login)
    assert bad.exit_code == 2
    assert "ACL operation 'fly': one of" in bad.output
    alice = {"TIDEMQ_USERNAME": "alice", "TIDEMQ_PASSWORD": "whatever"}
    refused = runner.invoke(app, ["acl", "list", *where], env=alice)
    assert refused.exit_code == 1
    remove = ["acl", "remove", "--allow-principal", "User:alice", "--operation", "read"]
    result = runner.invoke(app, [*remove, "--topic", "orders", *where], env=login)
    assert result.exit_code == 0, result.output
    assert "1 of 1 ACL entry removed" in result.output


def test_entries_survive_a_restart(loop: Loop, start_broker: StartBroker) -> None:
    env = _start(start_broker)
    entry = tidemq.Acl(
        principal="User:alice", resource_type="group", resource_name="billing", operation="read"
    )

    async def add() -> None:
        async with tidemq.aio.Admin(env.address, client_config=_config(ADMIN, ADMIN_PASSWORD)) as a:
            assert await a.create_acls([entry]) == 1

    loop.run(add())
    loop.run(env.broker.stop())
    config = BrokerConfig(
        port=0,
        store=StoreConfig(data_dir=env.data_dir),
        auth_enabled=True,
        authorization_enabled=True,
        bootstrap_user=ADMIN,
        shutdown_timeout_ms=5_000,
    )
    again = Broker(config, embedded_nameserver=True)

    async def check() -> list[tidemq.Acl]:
        address = await again.start()
        try:
            async with tidemq.aio.Admin(address, client_config=_config(ADMIN, ADMIN_PASSWORD)) as a:
                return await a.list_acls()
        finally:
            await again.stop()

    assert loop.run(check(), timeout_s=30) == [entry]


def test_a_producer_may_cancel_the_delayed_messages_of_topics_it_writes(
    loop: Loop, start_broker: StartBroker
) -> None:
    """CANCEL_DELAYED needs WRITE on the message's topic (the broker looks it up from the
    id), not an operator's ACL: bob, who may write `jobs`, cancels his delayed message;
    carol, who may not, is refused, and the message stays scheduled."""
    env = _start(start_broker)
    admin_config = _config(ADMIN, ADMIN_PASSWORD)

    def write(user: str, topic: str) -> list[tidemq.Acl]:
        return [
            tidemq.Acl(principal=f"User:{user}", resource_type="topic", resource_name=topic,
                       operation=op)
            for op in ("write", "describe")
        ]  # fmt: skip

    async def go() -> None:
        async with tidemq.aio.Admin(env.address, client_config=admin_config) as admin:
            await admin.create_topic("jobs", 1)
            await admin.create_topic("other", 1)
            await admin.create_user(BOB, BOB_PASSWORD)
            await admin.create_user("carol", "carol-secret-1")
            await admin.create_acls([*write(BOB, "jobs"), *write("carol", "other")])
        async with tidemq.aio.Producer(
            env.address, client_config=_config(BOB, BOB_PASSWORD)
        ) as bob:
            first = await bob.send("jobs", b"later", delay=3600)
            second = await bob.send("jobs", b"later too", delay=3600)
            async with tidemq.aio.Producer(
                env.address, client_config=_config("carol", "carol-secret-1")
            ) as carol:
                with pytest.raises(AuthorizationFailed, match="may not WRITE topic 'jobs'"):
                    await carol.cancel(first.message_id)
            assert (await bob.cancel(first.message_id)).count == 1
        async with tidemq.aio.Admin(env.address, client_config=admin_config) as admin:
            status = await admin.timer_status("jobs")
        assert status.topics[0].pending_batches == 1  # the second one
        assert second.message_id != first.message_id

    loop.run(go())


def test_unchanged_route_answers_respect_each_users_acls(
    loop: Loop, start_broker: StartBroker
) -> None:
    """A route token says "unchanged" only to the user it was given to, and only while the
    ACLs are those it was given under: bob's routes are cut to what he may describe."""
    env = _start(start_broker)
    admin_config = _config(ADMIN, ADMIN_PASSWORD)

    async def routes(user: str, password: str, known: int) -> c.GetRoutesResponse:
        conn = await ClientConnection.open(
            env.address, max_frame_bytes=_FRAME, username=user, password=password
        )
        try:
            request = c.GetRoutesRequest(known=known)
            answer, _ = await conn.request(request, c.GetRoutesResponse, timeout_s=10)
            return answer
        finally:
            conn.close()

    def names(answer: c.GetRoutesResponse) -> set[str]:
        return {r.topic for r in answer.routes if not r.topic.startswith("%")}

    async def go() -> None:
        async with tidemq.aio.Admin(env.address, client_config=admin_config) as admin:
            await admin.create_topic("orders", 1)
            await admin.create_topic("payroll", 1)
            await admin.create_user(BOB, BOB_PASSWORD)
            first = await routes(BOB, BOB_PASSWORD, 0)
            assert names(first) == set()
            assert not first.unchanged
            again = await routes(BOB, BOB_PASSWORD, first.generation)
            assert again.unchanged
            assert again.routes == []
            assert again.generation == first.generation
            # Another user's token is no use to bob, nor bob's to the admin.
            mine = await routes(ADMIN, ADMIN_PASSWORD, 0)
            assert names(mine) == {"orders", "payroll"}
            assert mine.generation != first.generation
            assert not (await routes(ADMIN, ADMIN_PASSWORD, first.generation)).unchanged
            assert not (await routes(BOB, BOB_PASSWORD, mine.generation)).unchanged
            grant = tidemq.Acl(
                principal=f"User:{BOB}",
                resource_type="topic",
                resource_name="orders",
                operation="describe",
            )
            assert await admin.create_acls([grant]) == 1
            # No topic changed, but bob may see more now: his old token is stale.
            granted = await routes(BOB, BOB_PASSWORD, first.generation)
            assert not granted.unchanged
            assert names(granted) == {"orders"}
            assert (await routes(BOB, BOB_PASSWORD, granted.generation)).unchanged
            # The admin's token was not about ACLs' effects on him, but it is mixed with
            # their version too: one full answer after any ACL change, then unchanged.
            assert not (await routes(ADMIN, ADMIN_PASSWORD, mine.generation)).unchanged

    loop.run(go(), timeout_s=60)


def test_a_delayed_message_by_id_needs_read_on_its_topic(
    loop: Loop, start_broker: StartBroker
) -> None:
    """ORIGIN_MESSAGE names the broker's timer topic; the broker checks READ on the
    message's own topic once it has read it."""
    env = _start(start_broker)
    admin_config = _config(ADMIN, ADMIN_PASSWORD)
    bob_config = _config(BOB, BOB_PASSWORD)

    async def go() -> None:
        async with tidemq.aio.Admin(env.address, client_config=admin_config) as admin:
            await admin.create_topic("payroll", 1)
            await admin.create_user(BOB, BOB_PASSWORD)
            async with tidemq.aio.Producer(env.address, client_config=admin_config) as p:
                receipt = await p.send("payroll", b"salary", delay=3600)
            async with tidemq.aio.Admin(env.address, client_config=bob_config) as bob:
                with pytest.raises(AuthorizationFailed, match="READ topic 'payroll'"):
                    await bob.get_message(receipt.message_id)
                grant = tidemq.Acl(
                    principal=f"User:{BOB}",
                    resource_type="topic",
                    resource_name="payroll",
                    operation="read",
                )
                assert await admin.create_acls([grant]) == 1
                found = await bob.get_message(receipt.message_id)
                assert found is not None
                assert found.value == b"salary"

    loop.run(go(), timeout_s=60)
