"""Test hosts in Linux network namespaces, joined by a bridge, that a test can cut off
from the network and join again (network partitions). Only for tests: nothing in tidemq
imports this module, and it imports nothing of tidemq.

Layout of one `HostNetwork` (N is the network's index, chosen free at creation)::

    root namespace                             namespace tmqN-m0        namespace tmqN-m1
    bridge tmqNbr 10.77.N.1/24                 tmqNn0 10.77.N.2/24      tmqNn1 10.77.N.3/24
      +-- tmqNh0 (veth) ------------------------+                        |
      +-- tmqNh1 (veth) -------------------------------------------------+

The test's own servers (etcd, a name server) listen on the bridge's address in the root
namespace; each host's processes run in its namespace (`popen`) and listen on its
address; the test's clients, in the root namespace, reach every host through the bridge.

* **Partition.** `partition(host)` sets the host's end of its veth pair down: nothing goes
  in or out of the host any more (no reset either: its peers' connections hang, as when a
  cable is pulled), while its processes run on. `heal(host)` sets it up again. netem and
  iptables are not needed (many kernels and containers lack them); `ip` is.
* **Cutting one link.** The bridge has a second address, `service_address` (.254), for a
  root-namespace server that a test wants to cut one host off from alone (etcd, say):
  `cut(host, address)` adds a blackhole route to `address` in the host's namespace, so
  what the host sends there fails at once while it still reaches every other address;
  `mend(host, address)` removes the route.
* **Names.** Everything is named with `PREFIX` and the network's index, and the bridge's
  alias names the creating process (`tidemq-test pid=1234`). The index is claimed by
  creating the bridge (creation fails when another process holds it), so parallel test
  workers never share a network, and a network whose creator is dead (a crashed run) is
  removed by the next one created (`remove_leftovers`).
* **Bounds.** Every `ip` command runs under `COMMAND_TIMEOUT_S`; a failure raises
  `NetnsError` naming the command and its message. Nothing here waits for a process to
  be ready: callers wait on the process's own readiness line.
* **Permission.** Namespaces need root (CAP_SYS_ADMIN and CAP_NET_ADMIN) and the kernel's
  bridge and veth drivers. `available()` tries it once and says why not, for a skip.
"""

from __future__ import annotations

import contextlib
import functools
import ipaddress
import os
import re
import shutil
import subprocess
import sys
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any, Final

__all__ = [
    "COMMAND_TIMEOUT_S",
    "PREFIX",
    "HostNetwork",
    "NetnsError",
    "available",
    "host_network",
    "remove_leftovers",
]

#: Every interface and namespace made here starts with this.
PREFIX: Final = "tmq"
#: The longest one `ip` command may take (they take milliseconds).
COMMAND_TIMEOUT_S: Final = 10.0
#: Networks are 10.77.N.0/24, N in this range (the host number goes up to 254).
_NET_INDEXES: Final = range(1, 255)
_FIRST_OCTETS: Final = "10.77"
#: Host names: short, so that `tmqN-NAME` stays readable; the interface names use the
#: host's number, not its name (an interface name has at most 15 characters).
_HOST_NAME: Final = re.compile(r"[a-z][a-z0-9]{0,11}")
_ALIAS: Final = re.compile(r"tidemq-test pid=(\d+)")
_MAX_HOSTS: Final = 200


class NetnsError(Exception):
    """An `ip` command failed or timed out."""


def _ip(*args: str, ok_missing: bool = False) -> str:
    """Run `ip ARGS`; its stdout. With `ok_missing`, "does not exist" is no error (a
    teardown of something already gone)."""
    command = ["ip", *args]
    try:
        done = subprocess.run(
            command, capture_output=True, timeout=COMMAND_TIMEOUT_S, check=False, text=True
        )
    except subprocess.TimeoutExpired:
        raise NetnsError(f"`{' '.join(command)}` took over {COMMAND_TIMEOUT_S} s") from None
    except OSError as exc:
        raise NetnsError(f"`{' '.join(command)}`: {exc}") from None
    if done.returncode != 0:
        message = done.stderr.strip()
        gone = ("Cannot find device", "No such file", "does not exist")
        if ok_missing and any(g in message for g in gone):
            return ""
        raise NetnsError(f"`{' '.join(command)}` failed ({done.returncode}): {message}")
    return done.stdout


@functools.cache
def available() -> tuple[bool, str]:
    """(True, "") when this process may create namespaces, a bridge and veth pairs (tried
    once, then cached); else (False, why), for `pytest.skip`."""
    if not sys.platform.startswith("linux"):
        return False, f"network namespaces are Linux only (this is {sys.platform})"
    if shutil.which("ip") is None:
        return False, "the `ip` command (iproute2) is not installed"
    if os.geteuid() != 0:
        return False, "network namespaces need root (CAP_SYS_ADMIN, CAP_NET_ADMIN)"
    tag = f"{PREFIX}p{os.getpid() % 10_000_000}"
    try:
        _ip("link", "add", tag, "type", "bridge")
        _ip("link", "add", f"{tag}a", "type", "veth", "peer", "name", f"{tag}b")
        _ip("netns", "add", tag)
        _ip("link", "set", f"{tag}b", "netns", tag)
        _ip("netns", "exec", tag, "ip", "link", "set", "lo", "up")
    except NetnsError as exc:
        return False, f"network namespaces are not permitted here: {exc}"
    finally:
        with contextlib.suppress(NetnsError):
            _ip("link", "del", f"{tag}a", ok_missing=True)
            _ip("netns", "del", tag, ok_missing=True)
            _ip("link", "del", tag, ok_missing=True)
    return True, ""


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _owner(bridge: str) -> int | None:
    """The pid in a bridge's alias (None: not ours, or unreadable)."""
    try:
        alias = Path(f"/sys/class/net/{bridge}/ifalias").read_text().strip()
    except OSError:
        return None
    found = _ALIAS.fullmatch(alias)
    return int(found.group(1)) if found else None


def _bridges() -> list[str]:
    names = []
    for line in _ip("-o", "link", "show", "type", "bridge").splitlines():
        name = line.split(":")[1].strip().split("@")[0]
        if re.fullmatch(rf"{PREFIX}\d+br", name):
            names.append(name)
    return names


def _namespaces() -> list[str]:
    return [line.split()[0] for line in _ip("netns", "list").splitlines() if line.strip()]


def _remove_index(index: int) -> None:
    """Remove every interface and namespace of network `index`."""
    for ns in _namespaces():
        if ns.startswith(f"{PREFIX}{index}-"):
            _ip("netns", "del", ns, ok_missing=True)
    links = _ip("-o", "link", "show").splitlines()
    for line in links:
        name = line.split(":")[1].strip().split("@")[0]
        if re.fullmatch(rf"{PREFIX}{index}h\d+", name):
            _ip("link", "del", name, ok_missing=True)
    _ip("link", "del", f"{PREFIX}{index}br", ok_missing=True)


def remove_leftovers() -> list[int]:
    """Remove the networks whose creating process is gone (a crashed run); the indexes
    removed."""
    removed = []
    for bridge in _bridges():
        pid = _owner(bridge)
        if pid is not None and not _alive(pid):
            index = int(bridge[len(PREFIX) : -2])
            _remove_index(index)
            removed.append(index)
    return removed


def _used_subnets() -> set[str]:
    """The 10.77.N prefixes of addresses already on this machine (not ours to take)."""
    out = _ip("-o", "-4", "addr", "show")
    return set(re.findall(rf"inet ({re.escape(_FIRST_OCTETS)}\.\d+)\.\d+/", out))


class HostNetwork:
    """A bridge in the root namespace and one namespace per host (see the module's
    docstring). Made by `create`, removed by `close` (also after a failure)."""

    def __init__(self, index: int, hosts: Sequence[str]) -> None:
        self.index = index
        self.hosts = tuple(hosts)
        self.bridge = f"{PREFIX}{index}br"
        subnet = ipaddress.IPv4Network(f"{_FIRST_OCTETS}.{index}.0/24")
        self.subnet = subnet
        #: The bridge's address: servers of the root namespace listen here for the hosts.
        self.bridge_address = str(subnet.network_address + 1)
        #: The bridge's second address, for a server that `cut` may separate from a host
        #: (above every host's: at most `_MAX_HOSTS` of them from .2).
        self.service_address = str(subnet.broadcast_address - 1)
        self._number = {h: i for i, h in enumerate(self.hosts)}
        self._partitioned: set[str] = set()
        self._cut: set[tuple[str, str]] = set()

    # ---------------------------------------------------------------- naming

    def namespace(self, host: str) -> str:
        return f"{PREFIX}{self.index}-{host}"

    def address(self, host: str) -> str:
        """The host's address (on the bridge's subnet)."""
        return str(self.subnet.network_address + 2 + self._number[host])

    def _outer(self, host: str) -> str:
        """The host's end of the veth pair in the root namespace (on the bridge)."""
        return f"{PREFIX}{self.index}h{self._number[host]}"

    def _inner(self, host: str) -> str:
        return f"{PREFIX}{self.index}n{self._number[host]}"

    # ---------------------------------------------------------------- building

    @classmethod
    def create(cls, hosts: Sequence[str]) -> HostNetwork:
        """Claim a free index, build the bridge and every host; on a failure, remove
        what was built and raise `NetnsError`."""
        assert hosts, "a test network needs at least one host"
        assert len(hosts) <= _MAX_HOSTS, f"at most {_MAX_HOSTS} hosts"
        assert len(set(hosts)) == len(hosts), "host names must differ"
        for host in hosts:
            assert _HOST_NAME.fullmatch(host), f"host name {host!r}: [a-z][a-z0-9]{{0,11}}"
        remove_leftovers()
        network = cls(cls._claim(), hosts)
        try:
            network._build()
        except BaseException:
            network.close()
            raise
        return network

    @staticmethod
    def _claim() -> int:
        """The first free index from one that depends on this process (parallel
        workers start apart), taken by creating its bridge."""
        used = _used_subnets()
        start = os.getpid() % len(_NET_INDEXES)
        for step in range(len(_NET_INDEXES)):
            index = _NET_INDEXES[(start + step) % len(_NET_INDEXES)]
            if f"{_FIRST_OCTETS}.{index}" in used:
                continue
            try:
                _ip("link", "add", f"{PREFIX}{index}br", "type", "bridge")
            except NetnsError as exc:
                if "File exists" in str(exc):
                    continue  # another process's network
                raise
            # Leftovers of a crashed run that held this index without its bridge.
            for ns in _namespaces():
                if ns.startswith(f"{PREFIX}{index}-"):
                    _ip("netns", "del", ns, ok_missing=True)
            return index
        raise NetnsError(f"no free network index in {_FIRST_OCTETS}.1-254")

    def _build(self) -> None:
        bridge = self.bridge
        _ip("link", "set", "dev", bridge, "alias", f"tidemq-test pid={os.getpid()}")
        _ip("addr", "add", f"{self.bridge_address}/24", "dev", bridge)
        _ip("addr", "add", f"{self.service_address}/24", "dev", bridge)
        _ip("link", "set", bridge, "up")
        for host in self.hosts:
            ns, outer, inner = self.namespace(host), self._outer(host), self._inner(host)
            _ip("netns", "add", ns)
            _ip("link", "add", outer, "type", "veth", "peer", "name", inner)
            _ip("link", "set", inner, "netns", ns)
            _ip("link", "set", outer, "master", bridge)
            _ip("link", "set", outer, "up")
            _ip("-n", ns, "addr", "add", f"{self.address(host)}/24", "dev", inner)
            _ip("-n", ns, "link", "set", inner, "up")
            _ip("-n", ns, "link", "set", "lo", "up")

    # ---------------------------------------------------------------- using

    def popen(self, host: str, argv: Sequence[str], **kwargs: Any) -> subprocess.Popen[bytes]:
        """Start `argv` in the host's namespace (`ip netns exec`, which execs it: the
        Popen's pid is the command's own, for signals). `kwargs` go to `Popen`."""
        return subprocess.Popen(["ip", "netns", "exec", self.namespace(host), *argv], **kwargs)

    def partition(self, host: str) -> None:
        """Cut the host off from every other host and from the root namespace."""
        _ip("link", "set", self._outer(host), "down")
        self._partitioned.add(host)

    def heal(self, host: str) -> None:
        """Join a partitioned host to the network again."""
        _ip("link", "set", self._outer(host), "up")
        self._partitioned.discard(host)

    def partitioned(self, host: str) -> bool:
        return host in self._partitioned

    def cut(self, host: str, address: str) -> None:
        """Cut the host off from `address` alone (a blackhole route in its namespace):
        its packets to it are dropped at once, everything else still flows."""
        _ip("-n", self.namespace(host), "route", "add", "blackhole", f"{address}/32")
        self._cut.add((host, address))

    def mend(self, host: str, address: str) -> None:
        """Undo `cut`."""
        _ip("-n", self.namespace(host), "route", "del", "blackhole", f"{address}/32")
        self._cut.discard((host, address))

    def is_cut(self, host: str, address: str) -> bool:
        return (host, address) in self._cut

    def close(self) -> None:
        """Remove the hosts and the bridge. Processes still running in a namespace keep
        it alive until they exit (the caller stops them first), but its link to the
        bridge goes now."""
        self._partitioned.clear()
        self._cut.clear()
        _remove_index(self.index)


@contextlib.contextmanager
def host_network(hosts: Sequence[str]) -> Iterator[HostNetwork]:
    """`HostNetwork.create(hosts)`, closed when the block ends."""
    network = HostNetwork.create(hosts)
    try:
        yield network
    finally:
        network.close()
