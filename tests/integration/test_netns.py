"""`tidemq.testing.netns`: hosts in network namespaces reach each other and the root
namespace through the bridge, a partitioned host reaches nobody until healed, and
nothing is left behind (also by a run that crashed). Skipped where namespaces are not
permitted, with the reason."""

from __future__ import annotations

import socket
import subprocess
import sys

import pytest

from tidemq.testing import netns

#: A listener in a host: prints its readiness line, then sends "hi" to each connection.
_SERVER = """
import socket, sys
s = socket.create_server((sys.argv[1], 0))
print(s.getsockname()[1], flush=True)
while True:
    c, _ = s.accept()
    c.sendall(b"hi")
    c.close()
"""
#: Connects from inside a host; exit status 0 if it got "hi".
_CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=float(sys.argv[3])) as c:
    sys.exit(0 if c.recv(2) == b"hi" else 1)
"""
#: A connection that gets no answer within this is taken as cut off.
_CUT_OFF_S = 1.0


@pytest.fixture(autouse=True)
def _namespaces_permitted() -> None:
    usable, why = netns.available()
    if not usable:
        pytest.skip(why)


def _greeted(address: str, port: int, timeout_s: float = 5.0) -> bool:
    try:
        with socket.create_connection((address, port), timeout=timeout_s) as conn:
            return conn.recv(2) == b"hi"
    except OSError:
        return False


def _greeted_from(net: netns.HostNetwork, host: str, address: str, port: int) -> bool:
    done = net.popen(
        host, [sys.executable, "-c", _CLIENT, address, str(port), str(_CUT_OFF_S)],
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    return done.wait(timeout=_CUT_OFF_S + 10) == 0


def _links() -> str:
    return subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout


def _namespaces() -> str:
    return subprocess.run(
        ["ip", "netns", "list"], capture_output=True, text=True, check=True
    ).stdout


def test_a_partitioned_host_reaches_nobody_until_healed() -> None:
    with netns.host_network(["a", "b"]) as net:
        server = net.popen(
            "a", [sys.executable, "-c", _SERVER, net.address("a")],
            stdout=subprocess.PIPE, stderr=subprocess.DEVNULL,
        )  # fmt: skip
        try:
            assert server.stdout is not None
            port = int(server.stdout.readline())  # its readiness line
            assert _greeted(net.address("a"), port)
            assert _greeted_from(net, "b", net.address("a"), port)
            net.partition("a")
            assert net.partitioned("a")
            assert not _greeted(net.address("a"), port, timeout_s=_CUT_OFF_S)
            assert not _greeted_from(net, "b", net.address("a"), port)
            net.heal("a")
            assert _greeted(net.address("a"), port)
            assert _greeted_from(net, "b", net.address("a"), port)
        finally:
            server.kill()
            server.wait(timeout=10)
            if server.stdout is not None:
                server.stdout.close()
        bridge = net.bridge
        assert bridge in _links()
    assert bridge not in _links()
    assert net.namespace("a") not in _namespaces()


def test_a_network_left_by_a_dead_process_is_removed_by_the_next() -> None:
    dead = subprocess.Popen([sys.executable, "-c", "pass"])
    dead.wait(timeout=10)
    net = netns.HostNetwork.create(["x"])
    try:
        subprocess.run(
            ["ip", "link", "set", "dev", net.bridge, "alias", f"tidemq-test pid={dead.pid}"],
            check=True, timeout=netns.COMMAND_TIMEOUT_S,
        )  # fmt: skip
        assert net.index in netns.remove_leftovers()
        assert net.bridge not in _links()
        assert net.namespace("x") not in _namespaces()
    finally:
        net.close()  # nothing left to remove: not an error


def _serve_in_root(address: str) -> tuple[subprocess.Popen[bytes], int]:
    """`_SERVER` in this (the root) namespace on `address`; the process and its port."""
    server = subprocess.Popen(
        [sys.executable, "-c", _SERVER, address], stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
    )  # fmt: skip
    assert server.stdout is not None
    return server, int(server.stdout.readline())  # its readiness line


def test_a_cut_host_misses_one_address_and_reaches_the_others() -> None:
    with netns.host_network(["a", "b"]) as net:
        service, service_port = _serve_in_root(net.service_address)
        other, other_port = _serve_in_root(net.bridge_address)
        try:
            assert _greeted_from(net, "a", net.service_address, service_port)
            net.cut("a", net.service_address)
            assert net.is_cut("a", net.service_address)
            assert not _greeted_from(net, "a", net.service_address, service_port)
            assert _greeted_from(net, "a", net.bridge_address, other_port)
            assert _greeted_from(net, "b", net.service_address, service_port)
            net.mend("a", net.service_address)
            assert not net.is_cut("a", net.service_address)
            assert _greeted_from(net, "a", net.service_address, service_port)
        finally:
            for server in (service, other):
                server.kill()
                server.wait(timeout=10)
                if server.stdout is not None:
                    server.stdout.close()
