"""FIFO pop across a static queue's links (tidemq.core.static_fifo): a broker pops a link
only once every link of another broker before it is finished; what each broker reports;
how the consumer joins the reports."""

from __future__ import annotations

from hypothesis import given
from hypothesis import strategies as st

from tidemq.core.static_chain import Link, QueueChain
from tidemq.core.static_fifo import contiguous_finished, finished_logical, pop_limit

#: a [0, 10) sealed, b [10, 15) sealed, a [15, ...) open from a's physical 10.
CHAIN = QueueChain(
    queue=0,
    epoch=3,
    links=(
        Link(broker="a", logical_start=0, physical_start=0, physical_end=10),
        Link(broker="b", logical_start=10, physical_start=0, physical_end=5),
        Link(broker="a", logical_start=15, physical_start=10),
    ),
)


def test_a_link_is_popped_only_after_the_other_brokers_links_before_it() -> None:
    # a's first link has nothing before it; its second waits for b's [10, 15).
    assert pop_limit(CHAIN, "a", -1) == 10
    assert pop_limit(CHAIN, "a", 14) == 10
    assert pop_limit(CHAIN, "a", 15) is None
    # b's link waits for a's first one.
    assert pop_limit(CHAIN, "b", 9) == 0
    assert pop_limit(CHAIN, "b", 10) is None
    # A broker with no link: nothing to limit.
    assert pop_limit(CHAIN, "c", -1) is None


def test_each_broker_reports_how_far_its_own_links_are_finished() -> None:
    assert finished_logical(CHAIN, "a", 0) == 0
    assert finished_logical(CHAIN, "a", 7) == 7
    # a's first link done: its report is where its next link starts (b's is not a's).
    assert finished_logical(CHAIN, "a", 10) == 15
    assert finished_logical(CHAIN, "a", 12) == 17
    assert finished_logical(CHAIN, "b", 3) == 13
    assert finished_logical(CHAIN, "b", 5) == 15  # all of b's link


def test_the_consumer_stops_at_the_first_link_not_finished() -> None:
    assert contiguous_finished(CHAIN, {}) == 0
    assert contiguous_finished(CHAIN, {"a": 7}) == 7
    # a reports 15 (its first link done) but b has not reported: stop at b's link.
    assert contiguous_finished(CHAIN, {"a": 15}) == 10
    assert contiguous_finished(CHAIN, {"a": 15, "b": 13}) == 13
    assert contiguous_finished(CHAIN, {"a": 15, "b": 15}) == 15
    assert contiguous_finished(CHAIN, {"a": 18, "b": 15}) == 18


@given(
    sizes=st.lists(st.integers(0, 5), min_size=1, max_size=6),
    brokers=st.lists(st.sampled_from("abc"), min_size=6, max_size=6),
    progress=st.dictionaries(st.sampled_from("abc"), st.integers(0, 40)),
)
def test_no_broker_may_pop_past_an_unfinished_link_of_another(
    sizes: list[int], brokers: list[str], progress: dict[str, int]
) -> None:
    """For any chain and any pop progress per broker: joining the reports never claims an
    offset some broker has not finished, and every limit stops before a link that follows
    another broker's unfinished one."""
    links = []
    logical, physical = 0, dict.fromkeys("abc", 0)
    for n, size in enumerate(sizes):
        b = brokers[n]
        last = n == len(sizes) - 1
        end = -1 if last else physical[b] + size
        links.append(
            Link(broker=b, logical_start=logical, physical_start=physical[b], physical_end=end)
        )
        logical += size
        physical[b] += size
    chain = QueueChain(queue=0, epoch=1, links=tuple(links))
    reports = {b: finished_logical(chain, b, min(p, physical[b])) for b, p in progress.items()}
    done = contiguous_finished(chain, reports)
    for link in links:
        if link.logical_start < done:  # claimed (partly): its broker finished that much
            finished = min(progress[link.broker], physical[link.broker])
            link_end = link.logical_end
            claimed_end = min(done, link_end if link_end is not None else done)
            assert link.physical_start + claimed_end - link.logical_start <= finished
    for b in "abc":
        bound = pop_limit(chain, b, done)
        for i, link in enumerate(links):
            if link.broker != b:
                continue
            blocked = any(o.broker != b and (o.logical_end or 0) > done for o in links[:i])
            if blocked:
                assert bound is not None
                assert bound <= link.physical_start
