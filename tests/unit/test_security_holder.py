"""What a name server keeps of the cluster's users and ACL entries (ADR 15): the newest
snapshot pushed, checked against its digest; one broker asked to push per version."""

from __future__ import annotations

import pytest

from tidemq.cluster.security_holder import PUSH_ASK_MS, SecurityHolder
from tidemq.core.errors import InvalidRequest
from tidemq.core.scram import make_credentials
from tidemq.protocol.acl_messages import AclEntryMsg
from tidemq.protocol.security_messages import SecuritySnapshot, UserRow, snapshot_digest


def _snapshot(counter: int, *names: str) -> SecuritySnapshot:
    users = []
    for name in names:
        c = make_credentials("a-long-enough-password", b"s" * 16, 4096)
        users.append(
            UserRow(
                name=name,
                salt=c.salt,
                iterations=c.iterations,
                stored_key=c.stored_key,
                server_key=c.server_key,
            )
        )
    acls = [
        AclEntryMsg(
            principal=f"User:{n}",
            resource_type="topic",
            resource_name="t",
            operation="read",
            permission="allow",
        )
        for n in names
    ]
    return SecuritySnapshot(
        counter=counter, digest=snapshot_digest(users, acls), users=users, acls=acls
    )


def test_the_digest_ignores_row_order() -> None:
    s = _snapshot(1, "a", "b")
    assert snapshot_digest(reversed(s.users), reversed(s.acls)) == s.digest


def test_a_newer_snapshot_replaces_the_held_one_and_an_older_one_does_not() -> None:
    holder = SecurityHolder()
    assert holder.offer(_snapshot(2, "alice"))
    assert holder.credentials("alice") is not None
    assert not holder.offer(_snapshot(1, "bob"))
    assert holder.credentials("bob") is None
    assert holder.offer(_snapshot(3, "bob"))  # a deletion converges: alice is gone
    assert holder.credentials("alice") is None
    assert holder.held[0] == 3


def test_a_snapshot_whose_digest_does_not_match_is_refused_whole() -> None:
    holder = SecurityHolder()
    forged = _snapshot(5, "alice")
    forged.users.append(_snapshot(5, "mallory").users[0])
    with pytest.raises(InvalidRequest, match="digest"):
        holder.offer(forged)
    assert holder.held == (0, 0)
    assert holder.credentials("mallory") is None


def test_one_broker_is_asked_to_push_a_version_until_it_is_overdue() -> None:
    holder = SecurityHolder()
    version = (4, 99)
    assert holder.report("b1", version, now_ms=0)
    assert not holder.report("b2", version, now_ms=100)  # b1 was asked just now
    assert holder.report("b1", version, now_ms=200)  # the one asked is asked again
    assert holder.report("b2", version, now_ms=200 + PUSH_ASK_MS)  # b1 never pushed
    assert not holder.report("b3", (0, 0), now_ms=0)  # older than held: nothing to push
    assert holder.reported("b2") == version


def test_the_users_are_current_once_a_broker_reported_no_newer_version() -> None:
    """A name server keeps nothing on disk: until a broker's registration says which
    version is current, and it holds that version, it cannot check a login."""
    holder = SecurityHolder()
    assert not holder.current  # just started: no broker has reported
    snapshot = _snapshot(4, "alice")
    assert holder.report("broker-a", (snapshot.counter, snapshot.digest), 0)  # asked to push
    assert not holder.current
    assert holder.offer(snapshot)
    assert holder.current
    holder.report("broker-b", (0, 0), 0)  # a broker behind does not make it stale
    assert holder.current
