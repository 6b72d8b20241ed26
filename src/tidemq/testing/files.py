"""An in-memory `FileSystem` that forgets what was never made durable, for crash tests.

`FaultFileSystem` implements `tidemq.store.files.FileSystem` over memory and models what a
power loss leaves behind, in the spirit of LazyFS and ALICE:

* File data. Each file (inode) has durable bytes and a list of pending operations (appends
  and truncates) since its last `FileHandle.sync`. Reads see the volatile view: durable plus
  everything pending. `sync` makes the inode's data durable, whatever name it is under.
* Directory entries. Every create, remove, replace, makedirs level and remove_tree entry is a
  pending namespace operation until `sync_dir` of the directory holding the name. A replace
  is one atomic operation (old or new, never neither); everything else is one operation per
  name. `sync_dir` also makes durable any earlier pending operation on a name that a
  committed operation touches, so each name's history stays in order.
* `crash(rng, mode)` returns a new file system holding what survives a power loss. Each
  pending namespace operation survives with probability 1/2 unless an earlier operation on
  one of its names was lost (per-name order is kept; unrelated names are independent). A
  name whose directory did not survive is gone. Each surviving file keeps its durable bytes
  plus, by mode: "prefix", a random prefix of its pending operations whose last append may
  be cut at any byte; "torn", the same, and the tail of that last append may further be
  replaced by zeros or garbage; "lose", nothing pending (namespace operations included).
  Durable bytes are never damaged.
* `crash_process()` models kill -9: the page cache survives, so the new file system sees
  the full volatile state, with the same pending operations still exposed to a later crash.

Faults: `crash_at_write(n)` raises `SimulatedCrash` instead of the n-th mutating operation
(see `mutations`); from then on, and after `crash()`/`crash_process()`, the instance and its
handles raise `SimulatedCrash` on any use, so nothing written "after the power went out"
can sneak in. `fail_append` makes an append write a prefix and raise ENOSPC, `fail_sync`
makes a sync raise EIO (the data stays pending: not durable, not dropped). Appends beyond
`capacity` write the bytes that fit, then raise ENOSPC, like a short write on a full disk.

All randomness comes from the `random.Random` passed to `crash`. Not thread-safe: drive it
from one thread, or the mutation counter (and so crash points) is not reproducible.
"""

from __future__ import annotations

import copy
import errno
import os
import posixpath
import random
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Literal, TypeAlias

from tidemq.store.files import Buffer, sync_each

__all__ = ["CrashMode", "FaultFile", "FaultFileSystem", "SimulatedCrash"]

CrashMode = Literal["prefix", "torn", "lose"]
_MODES: tuple[CrashMode, ...] = ("prefix", "torn", "lose")
_ROOT = Path("/")


class SimulatedCrash(BaseException):
    """The simulated machine lost power (or the process died) here.

    A BaseException so that `except Exception` in store code cannot swallow it and carry on.
    """


class _Dir:
    """The entry of a directory (directories carry no data)."""


_DIR = _Dir()


@dataclass(eq=False)  # compared and hashed by identity: an inode may have several names
class _Inode:
    data: bytearray = field(default_factory=bytearray)  # what reads see
    durable: bytearray = field(default_factory=bytearray)  # what survives power loss
    pending: list[bytes | int] = field(default_factory=list)  # bytes: append, int: truncate


_Node: TypeAlias = _Inode | _Dir
_Change: TypeAlias = dict[Path, _Node | None]  # one atomic namespace operation; None: removed


@dataclass
class _Fault:
    countdown: int
    path: Path | None
    written: int = 0


def _norm(path: Path) -> Path:
    # One key per name: absolute, no "." or "..", and no POSIX "//" prefix.
    return Path("/" + posixpath.normpath(posixpath.join("/", os.fspath(path))).lstrip("/"))


def _err(code: int, path: Path) -> OSError:
    return OSError(code, os.strerror(code), str(path))  # picks the subclass, e.g. ENOENT


def _apply(content: bytearray, op: bytes | int) -> None:
    if isinstance(op, bytes):
        content += op
    elif op < len(content):
        del content[op:]
    else:
        content.extend(bytes(op - len(content)))


def _apply_change(names: dict[Path, _Node], change: _Change) -> None:
    for name, node in change.items():
        if node is None:
            names.pop(name, None)
        else:
            names[name] = node


def _arm(faults: list[_Fault], nth: int, path: Path | None, written: int = 0) -> None:
    if nth < 1:
        raise ValueError("nth counts from 1")
    faults.append(_Fault(nth, None if path is None else _norm(path), written))


def _take_fault(faults: list[_Fault], path: Path) -> _Fault | None:
    fired = None
    for fault in list(faults):
        if fault.path is None or fault.path == path:
            fault.countdown -= 1
            if fault.countdown == 0:
                faults.remove(fault)
                fired = fired or fault
    return fired


def _surviving_content(inode: _Inode, rng: random.Random, mode: CrashMode) -> bytearray:
    content = bytearray(inode.durable)
    ops = inode.pending
    if mode == "lose" or not ops:
        return content
    reached = rng.randint(0, len(ops))
    for op in ops[:reached]:
        _apply(content, op)
    tail = 0  # bytes at the end that came from the last, possibly partial, append
    if reached < len(ops) and isinstance(cut := ops[reached], bytes):
        part = cut[: rng.randint(0, len(cut))]
        content += part
        tail = len(part)
    elif reached and isinstance(last := ops[reached - 1], bytes):
        tail = len(last)
    if mode == "torn" and tail:
        start = len(content) - rng.randint(1, tail)
        damage = rng.randrange(3)  # 0: intact, 1: zeros (size hit disk first), 2: garbage
        if damage == 1:
            content[start:] = bytes(len(content) - start)
        elif damage == 2:
            content[start:] = rng.randbytes(len(content) - start)
    return content


class FaultFile:
    """A `FileHandle` on one inode; keeps working after its name is removed, as in POSIX."""

    __slots__ = ("_closed", "_fs", "_inode", "path")

    def __init__(self, fs: FaultFileSystem, path: Path, inode: _Inode) -> None:
        self.path = path
        self._fs = fs
        self._inode = inode
        self._closed = False

    def _live(self, *, mutating: bool = False) -> _Inode:
        if mutating:
            self._fs._mutate()
        self._fs._check_power()
        if self._closed:
            raise _err(errno.EBADF, self.path)
        return self._inode

    def append(self, buffers: Sequence[Buffer]) -> None:
        """All bytes at the end, or OSError(ENOSPC) after a prefix of them (see module)."""
        inode, data = self._live(mutating=True), b"".join(buffers)
        fault = _take_fault(self._fs._append_faults, self.path)
        keep = len(data) if fault is None else min(len(data), fault.written)
        keep = min(keep, max(0, self._fs.capacity - self._fs._used()))
        if keep:
            inode.data += data[:keep]
            inode.pending.append(data[:keep])
        if fault is not None or keep < len(data):
            raise _err(errno.ENOSPC, self.path)

    def pread(self, position: int, size: int) -> bytes:
        """Up to `size` bytes from `position` of the volatile view."""
        inode = self._live()
        if position < 0 or size < 0:
            raise _err(errno.EINVAL, self.path)
        return bytes(inode.data[position : position + size])

    def sync(self) -> None:
        """Make this inode's data durable, or raise OSError(EIO) if a fault is armed."""
        inode = self._live(mutating=True)
        if _take_fault(self._fs._sync_faults, self.path):
            raise _err(errno.EIO, self.path)
        for op in inode.pending:
            _apply(inode.durable, op)
        inode.pending.clear()

    def truncate(self, size: int) -> None:
        """Cut or zero-extend to `size` (pending until sync). Extending never hits ENOSPC."""
        inode = self._live(mutating=True)
        if size < 0:
            raise _err(errno.EINVAL, self.path)
        _apply(inode.data, size)
        inode.pending.append(size)

    def size(self) -> int:
        return len(self._live().data)

    def close(self) -> None:
        """Idempotent; also a no-op after a crash, so cleanup code in dead stores is harmless."""
        self._closed = True


class FaultFileSystem:
    """In-memory `FileSystem` with crash and fault injection; see the module docstring.

    `capacity` (bytes) is the disk size reported by `disk_usage`; it may be changed at any
    time, e.g. to the current usage to simulate a full disk.
    """

    def __init__(self, *, capacity: int = 1 << 40) -> None:
        self.capacity = capacity
        self._names: dict[Path, _Node] = {_ROOT: _DIR}  # volatile namespace
        self._durable_names: dict[Path, _Node] = {_ROOT: _DIR}
        self._log: list[_Change] = []  # pending namespace operations, oldest first
        self._mutations = 0
        self._halted = False
        self._crash_at: int | None = None
        self._append_faults: list[_Fault] = []
        self._sync_faults: list[_Fault] = []

    @property
    def mutations(self) -> int:
        """Mutating calls so far: append, truncate, sync, sync_dir, open(create=True),
        makedirs, remove, remove_tree, replace, counted on entry whether or not they fail."""
        return self._mutations

    def crash_at_write(self, n: int) -> None:
        """Raise `SimulatedCrash` instead of doing the n-th mutating call from now (1: next).

        The call has no effect, and the instance stays halted: every later call raises
        `SimulatedCrash` too, until `crash()` or `crash_process()` gives a successor.
        """
        if n < 1:
            raise ValueError("n counts from 1")
        self._crash_at = self._mutations + n

    def fail_append(self, nth: int = 1, *, written: int = 0, path: Path | None = None) -> None:
        """The nth append from now (of `path` only, if given) writes its first `written`
        bytes, then raises OSError(ENOSPC)."""
        _arm(self._append_faults, nth, path, written)

    def fail_sync(self, nth: int = 1, *, path: Path | None = None) -> None:
        """The nth `FileHandle.sync` or `sync_dir` from now (on `path` only, if given) raises
        OSError(EIO) and makes nothing durable; what was pending stays pending."""
        _arm(self._sync_faults, nth, path)

    def crash(self, rng: random.Random, mode: CrashMode = "torn") -> FaultFileSystem:
        """A new file system holding what survives a power loss now (modes: see module).

        Halts this instance but does not change it, so one crash point can be crashed
        several times with different seeds or modes. Faults are not carried over.
        """
        if mode not in _MODES:
            raise ValueError(f"unknown crash mode {mode!r}")
        self._halted = True
        names = dict(self._durable_names)
        lost: set[Path] = set()
        for change in self._log:
            # Once a name's operation is lost, its later ones are too: no reordering per name.
            if mode == "lose" or not lost.isdisjoint(change) or rng.random() < 0.5:
                lost.update(change)
                continue
            _apply_change(names, change)
        survivor = FaultFileSystem(capacity=self.capacity)
        contents: dict[_Inode, _Inode] = {}
        for path in sorted(names, key=lambda p: len(p.parts)):  # parents before children
            node = names[path]
            if path == _ROOT or not isinstance(survivor._names.get(path.parent), _Dir):
                continue  # the root is already there; an orphan's directory is gone
            if isinstance(node, _Inode):
                if node not in contents:
                    content = _surviving_content(node, rng, mode)
                    contents[node] = _Inode(content, bytearray(content))
                node = contents[node]
            survivor._names[path] = node
        survivor._durable_names = dict(survivor._names)
        return survivor

    def crash_process(self) -> FaultFileSystem:
        """A new file system after kill -9: same volatile view, same pending operations (a
        later `crash` can still lose them), no open handles, no armed faults. Halts this
        instance."""
        self._halted = True
        survivor = FaultFileSystem(capacity=self.capacity)
        # One deepcopy keeps inodes shared between the volatile, durable and pending views.
        state = copy.deepcopy((self._names, self._durable_names, self._log))
        survivor._names, survivor._durable_names, survivor._log = state
        return survivor

    def open(self, path: Path, *, create: bool = False) -> FaultFile:
        """Open read-write; FileNotFoundError if missing and not `create`."""
        key = _norm(path)
        if create:
            self._mutate()
        else:
            self._check_power()
        node = self._names.get(key)
        if node is None:
            if not create:
                raise _err(errno.ENOENT, key)
            self._parent_dir(key)
            node = _Inode()
            self._change({key: node})
        if isinstance(node, _Dir):
            raise _err(errno.EISDIR, key)
        return FaultFile(self, key, node)

    def exists(self, path: Path) -> bool:
        self._check_power()
        return _norm(path) in self._names

    def listdir(self, path: Path) -> list[str]:
        """Sorted names of direct children (files and directories); [] if missing."""
        self._check_power()
        key = _norm(path)
        node = self._names.get(key)
        if node is None:
            return []
        if not isinstance(node, _Dir):
            raise _err(errno.ENOTDIR, key)
        return sorted(p.name for p in self._names if p.parent == key and p != key)

    def makedirs(self, path: Path) -> None:
        """Like mkdir -p; each created level is its own pending entry in its parent."""
        self._mutate()
        key = _norm(path)
        for level in [*reversed(key.parents), key]:
            node = self._names.get(level)
            if node is None:
                self._change({level: _DIR})
            elif not isinstance(node, _Dir):
                raise _err(errno.EEXIST if level == key else errno.ENOTDIR, level)

    def remove(self, path: Path) -> None:
        """Unlink a file; open handles keep working on its data."""
        self._mutate()
        key = _norm(path)
        self._file(key)
        self._change({key: None})

    def remove_tree(self, path: Path) -> None:
        """Remove a directory and everything under it, one pending entry per name."""
        self._mutate()
        key = _norm(path)
        self._dir(key)
        if key == _ROOT:
            raise _err(errno.EBUSY, key)
        for name in sorted(self._subtree(key), key=lambda p: -len(p.parts)):  # leaves first
            self._change({name: None})

    def replace(self, source: Path, target: Path) -> None:
        """Atomic rename over `target` (file over file, or directory over empty directory)."""
        self._mutate()
        src, dst = _norm(source), _norm(target)
        node = self._lookup(src)
        self._parent_dir(dst)
        if src == dst:
            return
        old = self._names.get(dst)
        if isinstance(node, _Dir):
            if src in dst.parents:
                raise _err(errno.EINVAL, dst)
            if old is not None and not isinstance(old, _Dir):
                raise _err(errno.ENOTDIR, dst)
            if old is not None and len(self._subtree(dst)) > 1:
                raise _err(errno.ENOTEMPTY, dst)
        elif isinstance(old, _Dir):
            raise _err(errno.EISDIR, dst)
        change: _Change = dict.fromkeys(self._subtree(dst))
        for name in self._subtree(src):
            change[name] = None
            change[dst / name.relative_to(src)] = self._names[name]
        self._change(change)

    def sync_dir(self, path: Path) -> None:
        """Make the directory's pending entries durable (and earlier operations on the same
        names); OSError(EIO) if a sync fault is armed."""
        self._mutate()
        key = _norm(path)
        self._dir(key)
        if _take_fault(self._sync_faults, key):
            raise _err(errno.EIO, key)
        touched: set[Path] = set()
        committed: list[_Change] = []
        rest: list[_Change] = []
        for change in reversed(self._log):
            if any(p.parent == key for p in change) or not touched.isdisjoint(change):
                touched.update(change)
                committed.append(change)
            else:
                rest.append(change)
        for change in reversed(committed):
            _apply_change(self._durable_names, change)
        self._log = rest[::-1]

    def sync_dirs(self, paths: Sequence[Path]) -> None:
        """`sync_dir` of each, in order (the real one may sync the whole filesystem)."""
        for path in paths:
            self.sync_dir(path)

    def sync_files(self, paths: Sequence[Path]) -> None:
        """`sync` of each file, in order (the real one may sync the whole filesystem: the
        contract is only these files); OSError(EIO) at the first armed sync fault."""
        sync_each(self, paths)

    def read_bytes(self, path: Path) -> bytes:
        self._check_power()
        return bytes(self._file(_norm(path)).data)

    def disk_usage(self, path: Path) -> tuple[int, int]:
        """(capacity, capacity - bytes in named files, floored at 0)."""
        self._check_power()
        self._lookup(_norm(path))
        return self.capacity, max(0, self.capacity - self._used())

    def _check_power(self) -> None:
        if self._halted:
            raise SimulatedCrash("this FaultFileSystem has crashed; use the one crash() returned")

    def _mutate(self) -> None:
        self._check_power()
        self._mutations += 1
        if self._mutations == self._crash_at:
            self._halted = True
            raise SimulatedCrash(f"simulated crash at mutating operation {self._mutations}")

    def _used(self) -> int:
        # Unlinked files still open are not counted: close enough for a fake.
        return sum(len(n.data) for n in self._names.values() if isinstance(n, _Inode))

    def _lookup(self, key: Path) -> _Node:
        node = self._names.get(key)
        if node is None:
            raise _err(errno.ENOENT, key)
        return node

    def _file(self, key: Path) -> _Inode:
        node = self._lookup(key)
        if isinstance(node, _Dir):
            raise _err(errno.EISDIR, key)
        return node

    def _dir(self, key: Path) -> None:
        if not isinstance(self._lookup(key), _Dir):
            raise _err(errno.ENOTDIR, key)

    def _parent_dir(self, key: Path) -> None:
        parent = self._names.get(key.parent)
        if parent is None:
            raise _err(errno.ENOENT, key)
        if not isinstance(parent, _Dir):
            raise _err(errno.ENOTDIR, key)

    def _subtree(self, key: Path) -> list[Path]:
        return [p for p in self._names if p == key or key in p.parents]

    def _change(self, change: _Change) -> None:
        _apply_change(self._names, change)
        self._log.append(change)
