"""cowlink.SnapshotSet on the real filesystems: begin/complete as a context
manager, clones that share blocks, the lock, listing with usage, prune."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

import cowlink


def test_snapshots_clone_complete_and_prune(xfs: Path) -> None:
    root = xfs / "snaps"
    s = cowlink.SnapshotSet(root)
    assert s.path == root
    with s.begin() as b:
        assert (b.base, b.resumed, b.kind) == (None, False, "tree")
        (b.path / "big").write_bytes(os.urandom(1 << 20))
    first = s.list()[0]
    assert (first.state, first.present, first.usage) == ("complete", True, None)

    with s.begin() as b:
        assert b.base == first.name
        assert (b.path / "big").read_bytes() == (first.path / "big").read_bytes()
        # The set is locked while a snapshot is open.
        with pytest.raises(cowlink.InUseError, match=f"process {os.getpid()}"):
            cowlink.SnapshotSet(root).begin()
        (b.path / "new").write_bytes(b"x" * 8192)
    os.sync()
    snaps = s.list(usage=True)
    assert [x.state for x in snaps] == ["complete", "complete"]
    u0, u1 = (x.usage for x in snaps)
    assert u0 is not None and u1 is not None
    assert (u0.exclusive, u0.shared) == (0, 1 << 20)
    assert (u1.exclusive, u1.shared) == (8192, 1 << 20)

    # An exception inside the block leaves the snapshot in progress; the
    # next begin resumes it under its name.
    with pytest.raises(RuntimeError):
        with s.begin() as b:
            name = b.name
            raise RuntimeError("sync failed")
    assert s.list()[-1].state == "open"
    again = s.begin()
    assert (again.name, again.resumed) == (name, True)
    again.release()
    with pytest.raises(ValueError):
        again.complete()

    with pytest.raises(ValueError):
        s.prune()
    r = s.prune(keep_last=1, dry_run=True)
    assert [(v.verdict, v.kept) for v in r.snapshots] == [("remove", False), ("newest", True), ("in_use", True)]
    assert first.path.exists()
    r = s.prune(keep_last=1)
    assert r.errors == []
    assert not first.path.exists()
    assert [x.name for x in s.list()] == [snaps[1].name, name]
