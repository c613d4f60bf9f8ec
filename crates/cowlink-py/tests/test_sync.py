"""sync: DST equals SRC as rsync -aHAX sees it, only what differs touched,
the trailing-slash rule and `contents`, exclusions, failures raised."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import data, rich_tree, write

import cowlink


def rsync_differences(a: Path, b: Path) -> list[str]:
    """What rsync would change to make b equal to a, deletions included."""
    out = subprocess.run(
        ["rsync", "-aniHAX", "--checksum", "--delete", f"{a}/", f"{b}/"],
        capture_output=True,
        check=True,
    ).stdout
    return [line for line in out.decode(errors="replace").splitlines() if line.strip()]


def test_sync_mirrors_the_rich_fixture_and_a_rerun_touches_nothing(cow: Path) -> None:
    src, dst = cow / "src", cow / "dst"
    rich_tree(src)
    seen: list[cowlink.Progress] = []
    report = cowlink.sync(src, dst, contents=True, on_progress=seen.append)
    assert report.errors == 0 and not report.cancelled and not report.dry_run
    assert report.created > 0 and report.cloned > 0 and report.copied == 0
    assert rsync_differences(src, dst) == []
    before = {p: os.lstat(p).st_ctime_ns for p in dst.rglob("*")}
    again = cowlink.sync(f"{src}/", dst)
    assert (again.created, again.replaced, again.metadata) == (0, 0, 0)
    assert again.unchanged > 0
    assert {p: os.lstat(p).st_ctime_ns for p in dst.rglob("*")} == before
    os.chmod(src / "ro", 0o755)
    os.chmod(dst / "ro", 0o755)


def test_changes_deletes_and_exclusions(xfs: Path) -> None:
    src, dst = xfs / "src", xfs / "dst"
    write(src / "a", data(5000, 1))
    write(src / "skip.o", b"o")
    write(src / "sub" / "b", data(100, 2))
    cowlink.sync(src, dst, contents=True, exclude=["*.o"])
    assert sorted(p.name for p in dst.iterdir()) == ["a", "sub"]
    write(src / "a", data(6000, 3))
    (src / "sub" / "b").unlink()
    report = cowlink.sync(src, dst, contents=True, delete=True, exclude=["*.o"])
    assert (report.replaced, report.deleted) == (1, 1)
    assert (dst / "a").read_bytes() == data(6000, 3)
    dry = cowlink.sync(src, dst, contents=True, dry_run=True, delete=True)
    assert dry.dry_run and dry.created == 1 and not (dst / "skip.o").exists()


def test_contents_false_syncs_the_directory_itself(xfs: Path) -> None:
    src, dst = xfs / "src", xfs / "dst"
    write(src / "f", b"x")
    cowlink.sync(f"{src}/", dst, contents=False)
    assert (dst / "src" / "f").read_bytes() == b"x"


def test_failures_are_raised_together_after_the_sync(xfs: Path) -> None:
    src, dst = xfs / "src", xfs / "dst"
    write(src / "ok", b"fine")
    (src / "sub").mkdir()
    write(src / "sub" / "f", b"x")
    dst.mkdir()
    # An immutable file cannot be replaced: its entry fails, the rest is
    # synced, and the old file stays whole.
    (dst / "sub").mkdir()
    write(dst / "sub" / "f", b"old")
    subprocess.run(["chattr", "+i", str(dst / "sub" / "f")], check=True)
    try:
        with pytest.raises(cowlink.TreeError) as info:
            cowlink.sync(src, dst, contents=True, checksum=True)
    finally:
        subprocess.run(["chattr", "-i", str(dst / "sub" / "f")], check=True)
    err = info.value
    assert err.kind == "sync"
    assert len(err.errors) == 1 and err.report.errors == 1
    assert (dst / "ok").read_bytes() == b"fine"
    assert (dst / "sub" / "f").read_bytes() == b"old"


def test_missing_source_raises_file_not_found(xfs: Path) -> None:
    with pytest.raises(FileNotFoundError):
        cowlink.sync(xfs / "nope", xfs / "dst", contents=True)


def test_sync_snapshot_keeps_versions_that_share_unchanged_blocks(cow: Path) -> None:
    src, root = cow / "src", cow / "snaps"
    src.mkdir()
    write(src / "big", data(1 << 20, 1))
    write(src / "gone", b"old")
    first = cowlink.sync_snapshot(src, root, contents=True)
    assert first.completed and first.base is None and not first.resumed
    assert first.sync.created == 2 and first.sync.errors == 0
    (src / "gone").unlink()
    write(src / "new", b"new")
    dry = cowlink.sync_snapshot(src, root, contents=True, dry_run=True)
    assert dry.snapshot == first.snapshot and not dry.completed
    assert (dry.sync.created, dry.sync.deleted) == (1, 1)
    second = cowlink.sync_snapshot(src, root, contents=True)
    assert second.completed and second.base == first.snapshot
    assert second.snapshot != first.snapshot
    # A run that made a snapshot names its directory (only a dry run
    # against no snapshot has none).
    assert first.path is not None and second.path is not None
    assert rsync_differences(src, second.path) == []
    assert (first.path / "gone").read_bytes() == b"old"
    assert not (second.path / "gone").exists()
    # The unchanged file is a clone of the first snapshot's.
    for f in (first.path / "big", second.path / "big"):
        layout = cowlink.extents(f)
        assert layout.mapped_bytes > 0 and layout.shared_bytes == layout.mapped_bytes
    names = [s.name for s in cowlink.SnapshotSet(root).list()]
    assert names == [first.snapshot, second.snapshot]
