"""A small tmpfs for tests that need a real full disk (root only; otherwise the reason
to skip)."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

__all__ = ["mount_tmpfs", "unmount", "used_fraction"]


def mount_tmpfs(where: Path, size_bytes: int) -> str | None:
    """Mount a tmpfs of `size_bytes` at `where`; None, or why it cannot be done."""
    where.mkdir()
    if os.geteuid() != 0:
        return "mounting a small tmpfs needs root"
    done = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_bytes}", "tmpfs", str(where)],
        capture_output=True,
        text=True,
        check=False,
    )
    if done.returncode != 0:
        return f"mount -t tmpfs is not permitted here: {done.stderr.strip()}"
    return None


def unmount(mnt: Path) -> None:
    """Unmount; lazily if something still holds it open (a test that failed midway)."""
    subprocess.run(["umount", str(mnt)], check=False, capture_output=True)
    if os.path.ismount(mnt):
        subprocess.run(["umount", "-l", str(mnt)], check=False)


def used_fraction(path: Path) -> float:
    st = os.statvfs(path)
    return 1.0 - st.f_bavail / st.f_blocks
