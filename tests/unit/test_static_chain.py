"""The static-topic chain format and its pure functions (tidemq.core.static_chain), and
the record rebase the brokers use to serve links under logical offsets."""

from __future__ import annotations

import msgspec
import pytest

from tidemq.broker.static_view import LinkView
from tidemq.core.batch import MessageRecord, encode_batch, parse_envelope
from tidemq.core.errors import InvalidRequest
from tidemq.core.record import encode_header, parse_header, rebase_record, verify_payload
from tidemq.core.static_chain import (
    Link,
    QueueChain,
    check_chain,
    decode_chain,
    encode_chain,
    link_for,
    newest,
    plan_remap,
    prune_through,
    retire,
    to_logical,
)

#: a [0, 10) sealed, b [10, 15) sealed, a [15, ...) open from a's physical 10.
CHAIN = QueueChain(
    queue=1,
    epoch=3,
    links=(
        Link(broker="a", logical_start=0, physical_start=0, physical_end=10),
        Link(broker="b", logical_start=10, physical_start=0, physical_end=5),
        Link(broker="a", logical_start=15, physical_start=10),
    ),
)


def test_a_well_formed_chain_passes_and_round_trips() -> None:
    check_chain(CHAIN, 4)
    assert decode_chain(encode_chain(CHAIN)) == CHAIN
    assert CHAIN.write_end == CHAIN.links[2]
    assert CHAIN.logical_end is None
    assert CHAIN.links[1].logical_end == 15


@pytest.mark.parametrize(
    ("links", "problem"),
    [
        ((), "1..1024 links"),
        ((Link(broker="a", logical_start=0, physical_start=0), CHAIN.links[1]), "is open but"),
        (
            (CHAIN.links[0], Link(broker="b", logical_start=11, physical_start=0)),
            "starts at logical offset 11, not where link 0 ended \\(10\\)",
        ),
        ((Link(broker="", logical_start=0, physical_start=0),), "names no broker"),
        ((Link(broker="a", logical_start=0, physical_start=5, physical_end=2),), "ends before"),
        ((Link(broker="a", logical_start=-1, physical_start=0),), "start at 0 or later"),
    ],
)
def test_malformed_chains_are_refused_with_the_problem_named(
    links: tuple[Link, ...], problem: str
) -> None:
    with pytest.raises(InvalidRequest, match=problem):
        check_chain(QueueChain(queue=0, epoch=1, links=links), 2)


def test_queue_epoch_and_target_are_checked() -> None:
    with pytest.raises(InvalidRequest, match="outside"):
        check_chain(QueueChain(queue=4, epoch=1, links=CHAIN.links), 4)
    with pytest.raises(InvalidRequest, match="epoch must be >= 1"):
        check_chain(QueueChain(queue=0, epoch=0, links=CHAIN.links), 4)
    with pytest.raises(InvalidRequest, match="target with an open last link"):
        check_chain(QueueChain(queue=0, epoch=1, links=CHAIN.links, target="c"), 4)


def test_offsets_map_to_the_link_that_holds_them() -> None:
    assert [link_for(CHAIN, o) for o in (0, 9, 10, 14, 15, 10**9)] == [
        CHAIN.links[0], CHAIN.links[0], CHAIN.links[1], CHAIN.links[1], CHAIN.links[2],
        CHAIN.links[2],
    ]  # fmt: skip
    sealed = QueueChain(queue=0, epoch=2, links=CHAIN.links[:2], target="c")
    assert link_for(sealed, 15) is None  # past a sealed last link: nowhere yet
    # a's physical queue is one run of offsets over its two links.
    assert [to_logical(CHAIN, "a", p) for p in (0, 9, 10, 12)] == [0, 9, 15, 17]
    assert to_logical(CHAIN, "b", 5) == 15  # the end of b's sealed link
    assert to_logical(CHAIN, "c", 0) is None


def test_the_newest_chain_wins_by_epoch_then_links() -> None:
    resealed = Link(broker="a", logical_start=15, physical_start=10, physical_end=12)
    sealed = QueueChain(queue=1, epoch=4, links=(*CHAIN.links[:2], resealed), target="b")
    opened = QueueChain(
        queue=1,
        epoch=4,
        links=(*sealed.links, Link(broker="b", logical_start=17, physical_start=5)),
    )
    assert newest([CHAIN, sealed])[1] is sealed
    assert newest([opened, sealed, CHAIN])[1] is opened


def test_plan_remap_moves_as_few_queues_as_possible_and_balances() -> None:
    ends = {0: "a", 1: "b", 2: "a", 3: "b", 4: "a", 5: "b", 6: "a", 7: "b"}
    moves = plan_remap(ends, ["a", "b", "c"])
    assert len(moves) == 2
    assert set(moves.values()) == {"c"}
    after = {**ends, **moves}
    counts = sorted(list(after.values()).count(b) for b in "abc")
    assert counts == [2, 3, 3]
    assert plan_remap(ends, ["a", "b"]) == {}
    assert plan_remap(ends, ["c"]) == dict.fromkeys(range(8), "c")
    with pytest.raises(InvalidRequest, match="at least one target"):
        plan_remap(ends, [])


def test_rebase_rewrites_the_header_only() -> None:
    payload = encode_batch([MessageRecord(value=b"x", key=b"k"), MessageRecord(value=b"y")])
    env = parse_envelope(payload)
    header = encode_header(
        payload_size=len(payload), properties=b"p", flags=0, topic_id=3, queue_id=1, count=2,
        base_offset=7, store_time_ms=1, producer_id=-1, base_sequence=-1, producer_epoch=0,
        payload_crc=env.crc,
    )  # fmt: skip
    record = header + b"p" + payload
    moved = rebase_record(record, 1007)
    parsed = parse_header(moved)  # checks the redone header CRC
    assert parsed.base_offset == 1007
    assert (parsed.topic_id, parsed.queue_id, parsed.count) == (3, 1, 2)
    assert moved[24:32] != record[24:32]
    assert moved[:4] == record[:4]
    assert moved[32:] == record[32:]  # everything after the base offset, payload included
    assert verify_payload(parsed, moved).count == 2
    assert parse_header(record).base_offset == 7  # the original is not touched


def test_pruning_drops_leading_links_and_makes_a_newer_chain() -> None:
    moved = QueueChain(
        queue=1,
        epoch=4,
        links=(
            *CHAIN.links[:2],
            Link(broker="a", logical_start=15, physical_start=10, physical_end=20),
            Link(broker="c", logical_start=25, physical_start=0),
        ),
    )
    pruned = prune_through(moved, "a")  # a's last link is the third: all three go
    assert [link.broker for link in pruned.links] == ["c"]
    assert pruned.pruned == 3
    check_chain(pruned, 4)
    assert pruned.version > moved.version
    assert newest([moved, pruned])[1] is pruned
    assert prune_through(moved, "b").links == moved.links[2:]
    assert prune_through(moved, "x") is moved
    with pytest.raises(InvalidRequest, match="holds its write end"):
        prune_through(moved, "c")
    with pytest.raises(InvalidRequest, match="holds its write end"):
        prune_through(CHAIN, "a")
    pending = QueueChain(queue=1, epoch=4, links=CHAIN.links[:2], target="a")
    with pytest.raises(InvalidRequest, match="switch to it"):
        prune_through(pending, "b")


def test_retiring_marks_a_brokers_links_as_in_the_tier_and_makes_a_newer_chain() -> None:
    moved = QueueChain(
        queue=1,
        epoch=4,
        links=(*CHAIN.links[:2], Link(broker="a", logical_start=15, physical_start=10,
                                      physical_end=12),
               Link(broker="c", logical_start=17, physical_start=0)),
    )  # fmt: skip
    retired = retire(moved, "a")
    assert [link.tiered for link in retired.links] == [True, False, True, False]
    assert [msgspec.structs.replace(link, tiered=False) for link in retired.links] == list(
        moved.links
    )
    check_chain(retired, 4)
    assert retired.version > moved.version
    assert newest([moved, retired])[1] is retired
    assert decode_chain(encode_chain(retired)) == retired
    assert retire(retired, "a") is retired  # nothing left to mark
    # Pruning after a retirement is newer still; a switch is newer than both.
    assert prune_through(retired, "b").version > retired.version
    assert msgspec.structs.replace(moved, epoch=5).version > retired.version
    with pytest.raises(InvalidRequest, match="holds its write end"):
        retire(moved, "c")
    with pytest.raises(InvalidRequest, match="holds its write end"):
        retire(CHAIN, "a")
    pending = QueueChain(queue=1, epoch=4, links=CHAIN.links[:2], target="b")
    with pytest.raises(InvalidRequest, match="switch to it"):
        retire(pending, "b")
    open_tiered = msgspec.structs.replace(
        CHAIN, links=(*CHAIN.links[:2], msgspec.structs.replace(CHAIN.links[2], tiered=True))
    )
    with pytest.raises(InvalidRequest, match="open but marked"):
        check_chain(open_tiered, 4)


def test_a_brokers_view_reports_the_readable_start_past_empty_and_expired_links() -> None:
    """Found by the kill -9 test: an empty first link (a remap right after create) on a
    broker that got the queue back later made the queue's min offset that later link's."""
    chain = QueueChain(
        queue=3,
        epoch=4,
        links=(
            Link(broker="a", logical_start=0, physical_start=0, physical_end=0),
            Link(broker="b", logical_start=0, physical_start=0, physical_end=16),
            Link(broker="a", logical_start=16, physical_start=0, physical_end=32),
            Link(broker="c", logical_start=48, physical_start=0),
        ),
    )
    a = LinkView(chain, "a")
    assert a.bounds(0, 32) == (0, 48)  # b's link is readable from its start
    assert a.bounds(32, 32) == (0, 48)  # a's own empty link, then b's
    c = LinkView(chain, "c")
    assert c.bounds(0, 10) == (0, 58)
    expired = QueueChain(queue=3, epoch=4, links=chain.links[2:])
    assert LinkView(expired, "a").bounds(20, 32) == (36, 48)
    assert LinkView(expired, "a").bounds(32, 32) == (48, 48)
    link, physical = a.physical(20)
    assert (link, physical) == (chain.links[2], 4)
