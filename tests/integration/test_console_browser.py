"""The web console in a real browser: headless Chromium (Debian's) driven by Playwright,
against a `tidemq server` process holding data this test made. Every page loads and shows
that data; the offset reset (dry run, then applied), the redrive, the cancel of a delayed
message and the rollback of a transaction work end to end, checked through the admin API
afterwards. A screenshot of every page is saved (tests/support/browser.py)."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest
from playwright.sync_api import Page, expect
from tests.support.browser import SCREENSHOTS, chromium_page
from tests.support.server_process import ServerProcess, server_process

import tidemq

pytestmark = pytest.mark.timeout(240)

N = 24


@dataclass
class Made:
    """What the test put in the cluster."""

    server: ServerProcess
    delayed_id: str
    txn_id: str
    typed_id: str


def _make_data(server: ServerProcess) -> Iterator[Made]:
    b = server.address
    registry = tidemq.SchemaRegistry(f"http://{server.http_address}")
    with tidemq.Admin(b) as admin:
        admin.create_topic("orders", 2)
        admin.create_topic("payments", 1)
        admin.create_topic("typed", 1)
    with tidemq.Producer(b) as producer:
        for i in range(N):
            producer.send("orders", b"order-%d" % i, key=b"k%d" % (i % 3), tag="paid")
        for i in range(3):
            producer.send("payments", b"payment-%d" % i, key=b"p%d" % i)
        to_bytes = tidemq.AvroSerializer(registry, _avro_schema())
        typed = producer.send("typed", to_bytes("typed", {"item": "lamp", "amount": 42}))
        delayed = producer.send("orders", b"later", queue=0, delay=3600.0)
    # Dead letters: each payment fails once with max_attempts 1.
    with tidemq.SimpleConsumer(
        b, "billing", {"payments": "*"}, max_attempts=1, await_duration=0.2
    ) as consumer:
        failed = 0
        while failed < 3:
            for m in consumer.receive(3 - failed):
                m.nack(reason="card declined")
                failed += 1
        assert consumer.receive(10) == []  # this receive dead-letters them
    with tidemq.Admin(b) as admin:
        # A group that read nothing yet: committed at the start, lagging by N.
        admin.reset_offsets("audit", "orders", to="earliest", execute=True)
    with tidemq.TransactionProducer(b, "g-tx") as txns:
        txn = txns.begin()
        txn.send("orders", b"half", queue=1)
        with tidemq.Admin(b) as admin:
            (open_txn,) = admin.transaction_status().open
        yield Made(server, delayed.message_id, open_txn.txn_id, typed.message_id)


def _avro_schema() -> str:
    return (
        '{"type":"record","name":"Order","fields":['
        '{"name":"item","type":"string"},{"name":"amount","type":"int"}]}'
    )


@pytest.fixture
def made(tmp_path: Path) -> Iterator[Made]:
    # Check-backs after an hour: the open transaction stays open while the test looks.
    settings = ["--http-port", "0", "--set", "broker.txn_check_delay_ms=3600000"]
    with server_process(tmp_path, settings) as server:
        yield from _make_data(server)


@pytest.fixture
def page() -> Iterator[Page]:
    with chromium_page() as p:
        yield p


def _open(page: Page, made: Made, path: str, name: str) -> None:
    page.goto(f"http://{made.server.http_address}/ui/#/{path}")
    expect(page.locator("#main")).to_have_attribute("data-loaded", re.compile(".+"))
    expect(page.locator("#page-error")).to_have_count(0)
    SCREENSHOTS.mkdir(parents=True, exist_ok=True)
    page.screenshot(path=SCREENSHOTS / f"{name}.png", full_page=True)


def _check_topic_pages(page: Page, made: Made) -> None:
    """The filter, and pages of TOPICS_PAGE topics (one here: ?limit= is the API's)."""
    page.fill("#topic-filter input[name=prefix]", "pay")
    page.click("#topic-filter button")
    expect(page.locator("#topics tbody tr")).to_have_count(1)
    expect(page.locator("#topics")).to_contain_text("payments")
    expect(page.locator("#next-topics")).to_have_count(0)
    page.goto(f"http://{made.server.http_address}/ui/#/topics?after=orders")
    expect(page.locator("#topics")).not_to_contain_text("orders")
    expect(page.locator("#topics")).to_contain_text("payments")


def test_every_page_shows_the_data_and_the_actions_work(page: Page, made: Made) -> None:
    b = made.server.address

    _open(page, made, "cluster", "cluster")
    expect(page.locator("#brokers")).to_contain_text(b)
    expect(page.locator("#brokers")).to_contain_text("free of")
    expect(page.locator("#name-servers")).to_contain_text(b)

    _open(page, made, "topics", "topics")
    expect(page.locator("#topics")).to_contain_text("orders")
    expect(page.locator("#topics")).not_to_contain_text("%DLQ%billing")
    _check_topic_pages(page, made)
    _open(page, made, "topics", "topics")
    page.click("text=orders")
    expect(page.locator("#queues tbody tr")).to_have_count(2)
    expect(page.locator("#topic-summary")).to_contain_text(f"{N} messages retained")
    page.screenshot(path=SCREENSHOTS / "topic.png", full_page=True)

    _check_group_reset(page, made)
    _check_messages(page, made)
    _check_dead_letters(page, made)
    _check_delayed(page, made)
    _check_transactions(page, made)

    _open(page, made, "schemas", "schemas")
    expect(page.locator("#schemas")).to_contain_text("typed-value")
    expect(page.locator("#schemas")).to_contain_text('"amount"')


def _check_group_reset(page: Page, made: Made) -> None:
    _open(page, made, "groups", "groups")
    expect(page.locator("#groups")).to_contain_text("audit")
    _open(page, made, "group/audit", "group")
    expect(page.locator("#lag tbody tr")).to_have_count(2)
    expect(page.locator("#lag")).to_contain_text("orders")
    page.select_option("#reset-form select[name=to]", "latest")
    page.click("#reset-dry-run")
    expect(page.locator("#reset-apply")).to_be_visible()
    page.screenshot(path=SCREENSHOTS / "group-reset-plan.png", full_page=True)
    with tidemq.Admin(made.server.address) as admin:  # a dry run changed nothing
        assert sum(o.lag for o in admin.describe_group("audit").offsets) == N
    page.click("#reset-apply")
    expect(page.locator("#reset-done")).to_be_visible()
    with tidemq.Admin(made.server.address) as admin:
        assert sum(o.lag for o in admin.describe_group("audit").offsets) == 0


def _check_messages(page: Page, made: Made) -> None:
    _open(page, made, "messages?topic=orders&queue=0&offset=0", "messages")
    expect(page.locator("#messages tbody tr").first).to_contain_text("order-")
    # The Avro value is shown decoded with its registered schema.
    page.fill("#id-form input[name=id]", made.typed_id)
    page.click("#find-id")
    expect(page.locator("#messages")).to_contain_text('"amount": 42')
    expect(page.locator("#messages")).to_contain_text("[schema ")
    page.screenshot(path=SCREENSHOTS / "message-by-id.png", full_page=True)
    # By key: every order with key k1 (8 of the 24), newest first.
    page.fill("#key-form input[name=topic]", "orders")
    page.fill("#key-form input[name=key]", "k1")
    page.click("#find-key")
    expect(page.locator("#messages tbody tr")).to_have_count(N // 3)
    expect(page.locator("#messages tbody tr").first).to_contain_text(f"order-{N - 2}")
    page.screenshot(path=SCREENSHOTS / "messages-by-key.png", full_page=True)


def _check_dead_letters(page: Page, made: Made) -> None:
    _open(page, made, "dlq", "dead-letter-groups")
    expect(page.locator("#dlq-groups")).to_contain_text("billing")
    _open(page, made, "dlq/billing", "dead-letters")
    expect(page.locator("#dead-letters tbody tr")).to_have_count(3)
    expect(page.locator("#dead-letters")).to_contain_text("card declined")
    page.click("#redrive")
    expect(page.locator("#redrive-result")).to_contain_text("3 message(s) sent back")
    with tidemq.Admin(made.server.address) as admin:
        assert admin.redrive_position("billing") == 3
        assert admin.describe_topic("payments").queue_info[0].max_offset == 6


def _check_delayed(page: Page, made: Made) -> None:
    _open(page, made, "timers", "delayed")
    expect(page.locator("#timers")).to_contain_text("orders")
    page.fill("#cancel-form input[name=id]", made.delayed_id)
    page.click("#cancel")
    expect(page.locator("#cancel-result")).to_contain_text("Cancelled 1 message(s) for orders")
    with tidemq.Admin(made.server.address) as admin:
        assert admin.timer_status().topics == ()


def _check_transactions(page: Page, made: Made) -> None:
    _open(page, made, "transactions", "transactions")
    expect(page.locator("#open-transactions")).to_contain_text(made.txn_id)
    page.click(f"#open-transactions button[data-txn='{made.txn_id}']")
    expect(page.locator("#rollback-result")).to_contain_text("Rolled back")
    with tidemq.Admin(made.server.address) as admin:
        assert admin.transaction_status().open == ()
