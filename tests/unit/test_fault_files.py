"""The crash-simulation fake file system keeps its own promises (see tidemq.testing.files)."""

from __future__ import annotations

import errno
import random
from collections.abc import Callable
from pathlib import Path

import pytest

from tidemq.store.files import FileHandle, FileSystem
from tidemq.testing.files import CrashMode, FaultFileSystem, SimulatedCrash

DATA = Path("/data")
SEEDS = range(200)
MODES: tuple[CrashMode, ...] = ("prefix", "torn", "lose")


def fresh(*, capacity: int = 1 << 30) -> FaultFileSystem:
    """A file system with a durable, empty /data."""
    fs = FaultFileSystem(capacity=capacity)
    fs.makedirs(DATA)
    fs.sync_dir(Path("/"))
    return fs


def write(fs: FaultFileSystem, path: Path, data: bytes, *, durable: bool = True) -> None:
    """Create `path` holding `data`; `durable` syncs the file and its directory."""
    handle = fs.open(path, create=True)
    handle.append([data])
    if durable:
        handle.sync()
        fs.sync_dir(path.parent)
    handle.close()


def snapshot(fs: FaultFileSystem, root: Path = Path("/")) -> dict[str, bytes | None]:
    """Every name under `root`: file content, or None for a directory."""
    out: dict[str, bytes | None] = {}
    for name in fs.listdir(root):
        path = root / name
        try:
            out[str(path)] = fs.read_bytes(path)
        except IsADirectoryError:
            out[str(path)] = None
            out.update(snapshot(fs, path))
    return out


def outcomes(
    build: Callable[[], FaultFileSystem], mode: CrashMode, path: Path
) -> set[bytes | None]:
    """What `path` holds (None: missing) after crashing `build()` with each seed."""
    seen: set[bytes | None] = set()
    for seed in SEEDS:
        after = build().crash(random.Random(seed), mode)
        seen.add(after.read_bytes(path) if after.exists(path) else None)
    return seen


# -- the FileSystem contract -------------------------------------------------------------


def test_fault_file_system_is_a_file_system() -> None:
    fs: FileSystem = FaultFileSystem()  # mypy checks the protocols structurally
    handle: FileHandle = fs.open(Path("/f"), create=True)
    assert handle.size() == 0


def test_reads_see_unsynced_appends_of_any_buffer_type() -> None:
    fs = fresh()
    handle = fs.open(DATA / "f", create=True)
    handle.append([b"ab", bytearray(b"cd"), memoryview(b"ef")])
    assert handle.size() == 6
    assert handle.pread(2, 2) == b"cd"
    assert fs.read_bytes(DATA / "f") == b"abcdef"


def test_pread_beyond_the_end_returns_fewer_bytes() -> None:
    fs = fresh()
    write(fs, DATA / "f", b"abcdef")
    handle = fs.open(DATA / "f")
    assert handle.pread(4, 10) == b"ef"
    assert handle.pread(100, 5) == b""


def test_missing_names_raise_file_not_found() -> None:
    fs = fresh()
    with pytest.raises(FileNotFoundError):
        fs.open(DATA / "nope")
    with pytest.raises(FileNotFoundError):
        fs.read_bytes(DATA / "nope")
    with pytest.raises(FileNotFoundError):
        fs.remove(DATA / "nope")
    with pytest.raises(FileNotFoundError):
        fs.replace(DATA / "nope", DATA / "other")
    with pytest.raises(FileNotFoundError):
        fs.open(Path("/no/such/dir/f"), create=True)


def test_listdir_names_direct_children_only() -> None:
    fs = fresh()
    fs.makedirs(DATA / "a" / "b")
    write(fs, DATA / "f", b"x")
    assert fs.listdir(DATA) == ["a", "f"]
    assert fs.listdir(Path("/")) == ["data"]
    assert fs.listdir(DATA / "missing") == []
    with pytest.raises(NotADirectoryError):
        fs.listdir(DATA / "f")


def test_paths_are_normalized_to_absolute_keys() -> None:
    fs = fresh()
    write(fs, Path("/data/./x/../f"), b"x")
    assert fs.exists(DATA / "f")
    assert fs.read_bytes(Path("data/f")) == b"x"
    assert fs.listdir(Path("//data/")) == ["f"]


def test_truncate_cuts_and_extends_with_zeros() -> None:
    fs = fresh()
    handle = fs.open(DATA / "f", create=True)
    handle.append([b"0123456789"])
    handle.truncate(4)
    assert fs.read_bytes(DATA / "f") == b"0123"
    handle.truncate(6)
    assert fs.read_bytes(DATA / "f") == b"0123\0\0"


def test_removed_file_stays_usable_through_an_open_handle() -> None:
    fs = fresh()
    write(fs, DATA / "f", b"abc")
    handle = fs.open(DATA / "f")
    fs.remove(DATA / "f")
    handle.append([b"d"])
    assert handle.pread(0, 10) == b"abcd"
    assert not fs.exists(DATA / "f")


def test_closed_handle_raises_ebadf() -> None:
    fs = fresh()
    handle = fs.open(DATA / "f", create=True)
    handle.close()
    handle.close()
    with pytest.raises(OSError, match="Bad file descriptor") as info:
        handle.append([b"x"])
    assert info.value.errno == errno.EBADF


def test_directory_misuse_raises_like_posix() -> None:
    fs = fresh()
    write(fs, DATA / "f", b"x")
    fs.makedirs(DATA / "d" / "sub")
    with pytest.raises(IsADirectoryError):
        fs.open(DATA / "d")
    with pytest.raises(IsADirectoryError):
        fs.remove(DATA / "d")
    with pytest.raises(IsADirectoryError):
        fs.replace(DATA / "f", DATA / "d")
    with pytest.raises(FileExistsError):
        fs.makedirs(DATA / "f")
    with pytest.raises(NotADirectoryError):
        fs.remove_tree(DATA / "f")
    with pytest.raises(OSError, match="not empty"):
        fs.replace(DATA / "d" / "sub", DATA)
    fs.makedirs(DATA / "d")  # existing directory: no error


def test_remove_tree_removes_everything_below() -> None:
    fs = fresh()
    fs.makedirs(DATA / "t" / "u")
    write(fs, DATA / "t" / "u" / "f", b"x")
    fs.remove_tree(DATA / "t")
    assert snapshot(fs) == {"/data": None}


def test_directory_rename_moves_its_children() -> None:
    fs = fresh()
    fs.makedirs(DATA / "old" / "sub")
    write(fs, DATA / "old" / "sub" / "f", b"x")
    fs.replace(DATA / "old", DATA / "new")
    assert snapshot(fs) == {"/data": None, "/data/new": None, "/data/new/sub": None,
                            "/data/new/sub/f": b"x"}  # fmt: skip


def test_disk_usage_reports_capacity_minus_stored_bytes() -> None:
    fs = fresh(capacity=1000)
    write(fs, DATA / "f", b"x" * 300)
    assert fs.disk_usage(DATA) == (1000, 700)
    fs.capacity = 500
    assert fs.disk_usage(Path("/")) == (500, 200)
    with pytest.raises(FileNotFoundError):
        fs.disk_usage(DATA / "missing")


# -- crashes ------------------------------------------------------------------------------


@pytest.mark.parametrize("mode", MODES)
def test_synced_data_survives_every_crash_mode(mode: CrashMode) -> None:
    for seed in SEEDS:
        fs = fresh()
        write(fs, DATA / "f", b"durable")
        fs.open(DATA / "f").append([b"-pending"])
        write(fs, DATA / "g", b"unsynced", durable=False)
        after = fs.crash(random.Random(seed), mode)
        assert after.read_bytes(DATA / "f")[:7] == b"durable"


def test_unsynced_append_can_be_lost_on_crash() -> None:
    def build() -> FaultFileSystem:
        fs = fresh()
        write(fs, DATA / "f", b"ab")
        fs.open(DATA / "f").append([b"cd"])
        return fs

    assert outcomes(build, "lose", DATA / "f") == {b"ab"}
    assert {b"ab", b"abcd"} <= outcomes(build, "prefix", DATA / "f")


def test_prefix_crash_keeps_a_prefix_of_the_pending_bytes() -> None:
    def build() -> FaultFileSystem:
        fs = fresh()
        write(fs, DATA / "f", b"D")
        handle = fs.open(DATA / "f")
        for chunk in (b"abc", b"def", b"ghi"):
            handle.append([chunk])
        return fs

    seen = outcomes(build, "prefix", DATA / "f")
    assert all(s is not None and b"Dabcdefghi".startswith(s) and s for s in seen)
    assert {b"D", b"Dabcdefghi", b"Dabcd"} <= seen  # none, all, and a cut mid-append


def test_torn_crash_damages_only_the_tail_of_the_last_kept_append() -> None:
    def build() -> FaultFileSystem:
        fs = fresh()
        write(fs, DATA / "f", b"D")
        handle = fs.open(DATA / "f")
        handle.append([b"abc"])
        handle.append([b"defgh"])
        return fs

    seen = outcomes(build, "torn", DATA / "f")
    damaged = {s for s in seen if s is not None and not b"Dabcdefgh".startswith(s)}
    assert damaged, "torn mode never damaged anything"
    assert any(s.endswith(b"\0") for s in damaged)
    for s in seen:
        assert s is not None
        assert s[:1] == b"D"
        assert len(s) <= 9
        if len(s) > 4:  # the second append was reached: the first one is intact
            assert s[:4] == b"Dabc"


def test_pending_truncate_can_be_undone_by_crash() -> None:
    def build() -> FaultFileSystem:
        fs = fresh()
        write(fs, DATA / "f", b"0123456789")
        fs.open(DATA / "f").truncate(4)
        return fs

    assert outcomes(build, "prefix", DATA / "f") == {b"0123", b"0123456789"}
    assert outcomes(build, "lose", DATA / "f") == {b"0123456789"}


def test_unsynced_create_may_vanish_on_crash() -> None:
    def build(*, sync_dir: bool) -> FaultFileSystem:
        fs = fresh()
        write(fs, DATA / "f", b"x", durable=False)
        fs.open(DATA / "f").sync()  # data durable, directory entry not
        if sync_dir:
            fs.sync_dir(DATA)
        return fs

    assert outcomes(lambda: build(sync_dir=False), "prefix", DATA / "f") == {None, b"x"}
    assert outcomes(lambda: build(sync_dir=False), "lose", DATA / "f") == {None}
    assert outcomes(lambda: build(sync_dir=True), "lose", DATA / "f") == {b"x"}


def test_file_in_an_unsynced_directory_is_lost_with_it() -> None:
    def build(*, sync_parent: bool) -> FaultFileSystem:
        fs = fresh()
        fs.makedirs(DATA / "sub")
        write(fs, DATA / "sub" / "f", b"x")  # syncs the file and /data/sub, not /data
        if sync_parent:
            fs.sync_dir(DATA)
        return fs

    assert outcomes(lambda: build(sync_parent=False), "prefix", DATA / "sub" / "f") == {
        None,
        b"x",
    }
    assert outcomes(lambda: build(sync_parent=True), "torn", DATA / "sub" / "f") == {b"x"}


def test_unsynced_remove_may_be_undone_by_crash() -> None:
    def build() -> FaultFileSystem:
        fs = fresh()
        write(fs, DATA / "f", b"x")
        fs.remove(DATA / "f")
        return fs

    assert outcomes(build, "prefix", DATA / "f") == {None, b"x"}
    assert outcomes(build, "lose", DATA / "f") == {b"x"}


@pytest.mark.parametrize("mode", MODES)
@pytest.mark.parametrize("tmp_entry_durable", [True, False])
def test_rename_is_atomic_across_crash(mode: CrashMode, tmp_entry_durable: bool) -> None:
    renamed = (b"new", None)  # (target, tmp)
    not_renamed = (b"old", b"new") if tmp_entry_durable else (b"old", None)
    if not tmp_entry_durable and mode != "lose":
        expected = {renamed, not_renamed, (b"old", b"new")}  # tmp's creation alone survived
    else:
        expected = {not_renamed} if mode == "lose" else {renamed, not_renamed}
    seen = set()
    for seed in SEEDS:
        fs = fresh()
        write(fs, DATA / "target", b"old")
        write(fs, DATA / "tmp", b"new", durable=False)
        fs.open(DATA / "tmp").sync()
        if tmp_entry_durable:
            fs.sync_dir(DATA)
        fs.replace(DATA / "tmp", DATA / "target")
        after = fs.crash(random.Random(seed), mode)
        state = snapshot(after, DATA)
        seen.add((state.get("/data/target"), state.get("/data/tmp")))
    assert seen == expected  # never target missing, never both names


def test_sync_dir_makes_a_rename_durable() -> None:
    def build() -> FaultFileSystem:
        fs = fresh()
        write(fs, DATA / "target", b"old")
        write(fs, DATA / "tmp", b"new", durable=False)
        fs.open(DATA / "tmp").sync()
        fs.replace(DATA / "tmp", DATA / "target")
        fs.sync_dir(DATA)
        return fs

    for mode in MODES:
        assert outcomes(build, mode, DATA / "target") == {b"new"}
        assert outcomes(build, mode, DATA / "tmp") == {None}


def busy_workload(fs: FaultFileSystem) -> None:
    """Appends, syncs, renames and removes across two directories."""
    fs.makedirs(DATA / "log")
    fs.sync_dir(DATA)
    log = fs.open(DATA / "log" / "0001", create=True)
    for i in range(5):
        log.append([b"record-%d;" % i])
        if i % 2:
            log.sync()
    write(fs, DATA / "ckpt.tmp", b"checkpoint", durable=False)
    fs.replace(DATA / "ckpt.tmp", DATA / "ckpt")
    fs.sync_dir(DATA / "log")
    write(fs, DATA / "log" / "0002", b"next")
    fs.remove(DATA / "log" / "0001")


@pytest.mark.parametrize("mode", MODES)
def test_crash_is_deterministic_per_seed_and_leaves_the_source_unchanged(
    mode: CrashMode,
) -> None:
    fs = fresh()
    busy_workload(fs)
    for seed in range(20):
        first = snapshot(fs.crash(random.Random(seed), mode))
        assert snapshot(fs.crash(random.Random(seed), mode)) == first


def test_crashed_file_system_and_its_handles_refuse_further_use() -> None:
    fs = fresh()
    handle = fs.open(DATA / "f", create=True)
    fs.crash(random.Random(0), "torn")
    with pytest.raises(SimulatedCrash):
        fs.exists(DATA)
    with pytest.raises(SimulatedCrash):
        handle.append([b"x"])
    handle.close()  # cleanup code in a dead store must not blow up


def test_crash_process_keeps_the_page_cache_but_not_durability() -> None:
    fs = fresh()
    write(fs, DATA / "f", b"synced")
    handle = fs.open(DATA / "f")
    handle.append([b"+cached"])
    write(fs, DATA / "g", b"unsynced", durable=False)
    restarted = fs.crash_process()
    with pytest.raises(SimulatedCrash):
        handle.pread(0, 1)
    assert snapshot(restarted, DATA) == {"/data/f": b"synced+cached", "/data/g": b"unsynced"}
    power_lost = restarted.crash(random.Random(0), "lose")
    assert snapshot(power_lost, DATA) == {"/data/f": b"synced"}


def test_simulated_crash_escapes_except_exception() -> None:
    def careless_store_code(fs: FaultFileSystem) -> None:
        try:
            fs.makedirs(DATA / "x")
        except Exception:
            pytest.fail("SimulatedCrash was swallowed")

    fs = fresh()
    fs.crash_at_write(1)
    with pytest.raises(SimulatedCrash):
        careless_store_code(fs)


# -- fault injection ----------------------------------------------------------------------


def test_mutations_count_mutating_calls_only() -> None:
    fs = FaultFileSystem()
    handle = fs.open(Path("/f"), create=True)  # 1
    handle.append([b"abc"])  # 2
    handle.truncate(1)  # 3
    handle.sync()  # 4
    fs.makedirs(Path("/d"))  # 5
    fs.sync_dir(Path("/"))  # 6
    fs.replace(Path("/f"), Path("/g"))  # 7
    with pytest.raises(FileNotFoundError):
        fs.remove(Path("/f"))  # 8: failed calls count too, so replays line up
    fs.remove_tree(Path("/d"))  # 9
    fs.open(Path("/g")).pread(0, 1)
    fs.read_bytes(Path("/g"))
    fs.listdir(Path("/"))
    fs.exists(Path("/g"))
    fs.disk_usage(Path("/"))
    handle.size()
    assert fs.mutations == 9


def test_crash_at_write_stops_before_the_nth_mutation() -> None:
    counting = fresh()
    start = counting.mutations
    busy_workload(counting)
    total = counting.mutations - start
    assert total > 15
    for n in range(1, total + 1):
        fs = fresh()
        fs.crash_at_write(n)
        with pytest.raises(SimulatedCrash):
            busy_workload(fs)
        assert fs.mutations == start + n
        with pytest.raises(SimulatedCrash):
            fs.listdir(DATA)  # halted: nothing more gets in after the power went out
        survivor = fs.crash(random.Random(n), "torn")
        assert survivor.mutations == 0
        survivor.makedirs(DATA / "after")  # the successor is fully usable


def test_crashing_operation_has_no_effect() -> None:
    fs = fresh()
    handle = fs.open(DATA / "f", create=True)
    fs.crash_at_write(1)
    with pytest.raises(SimulatedCrash):
        handle.append([b"never"])
    assert fs.crash_process().read_bytes(DATA / "f") == b""


def test_enospc_short_write() -> None:
    fs = fresh()
    handle = fs.open(DATA / "f", create=True)
    fs.fail_append(written=3)
    with pytest.raises(OSError, match="No space") as info:
        handle.append([b"abc", b"def"])
    assert info.value.errno == errno.ENOSPC
    assert fs.read_bytes(DATA / "f") == b"abc"  # the caller truncates back
    handle.truncate(0)
    handle.append([b"xyz"])  # one-shot: the next append works
    assert fs.read_bytes(DATA / "f") == b"xyz"


def test_fail_append_counts_only_appends_to_the_given_path() -> None:
    fs = fresh()
    a = fs.open(DATA / "a", create=True)
    b = fs.open(DATA / "b", create=True)
    fs.fail_append(2, path=Path("/data/./a"))
    a.append([b"1"])
    b.append([b"1"])
    b.append([b"2"])
    with pytest.raises(OSError, match="No space"):
        a.append([b"2"])
    assert (fs.read_bytes(DATA / "a"), fs.read_bytes(DATA / "b")) == (b"1", b"12")


def test_sync_eio_makes_nothing_durable() -> None:
    fs = fresh()
    write(fs, DATA / "f", b"a")
    handle = fs.open(DATA / "f")
    handle.append([b"b"])
    fs.fail_sync()
    with pytest.raises(OSError, match="Input/output") as info:
        handle.sync()
    assert info.value.errno == errno.EIO
    assert fs.crash_process().crash(random.Random(0), "lose").read_bytes(DATA / "f") == b"a"


def test_sync_dir_eio_leaves_entries_pending() -> None:
    fs = fresh()
    write(fs, DATA / "f", b"x", durable=False)
    fs.fail_sync(path=DATA)
    with pytest.raises(OSError, match="Input/output"):
        fs.sync_dir(DATA)
    assert not fs.crash(random.Random(0), "lose").exists(DATA / "f")


def test_full_disk_writes_what_fits_then_raises_enospc() -> None:
    fs = fresh(capacity=10)
    write(fs, DATA / "old", b"1234")
    handle = fs.open(DATA / "f", create=True)
    with pytest.raises(OSError, match="No space"):
        handle.append([b"abcdefgh"])
    assert fs.read_bytes(DATA / "f") == b"abcdef"
    assert fs.disk_usage(DATA) == (10, 0)
    fs.remove(DATA / "old")  # freeing space lets appends through again
    handle.append([b"gh"])
    assert fs.disk_usage(DATA) == (10, 2)


def test_fault_arguments_are_validated() -> None:
    fs = fresh()
    with pytest.raises(ValueError, match="counts from 1"):
        fs.crash_at_write(0)
    with pytest.raises(ValueError, match="counts from 1"):
        fs.fail_append(0)
    with pytest.raises(ValueError, match="unknown crash mode"):
        fs.crash(random.Random(0), "bogus")  # type: ignore[arg-type]
