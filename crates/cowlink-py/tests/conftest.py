"""Fixtures: fresh directories on the real filesystems `scripts/testfs up`
mounts (COWLINK_TEST_XFS, _BTRFS, _EXT4, _TMPFS). Each fixture asserts the
filesystem kind (with coreutils' `stat -f`, not the package under test), so
a broken setup fails instead of testing the root filesystem. There is no
skip path: without the filesystems a test fails with the reason, never
passes unrun (scripts/test-python runs these tests after `scripts/testfs
up`)."""

from __future__ import annotations

import os
import shutil
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

# The source tree (for the rich-tree fixture's builder); scripts/test-python
# runs a copy of these tests outside it and names it in COWLINK_REPO.
REPO = Path(os.environ.get("COWLINK_REPO") or Path(__file__).resolve().parents[3])


# What `stat -f -c %T` calls each filesystem (ext4 is "ext2/ext3").
KINDS = {
    "COWLINK_TEST_XFS": "xfs",
    "COWLINK_TEST_BTRFS": "btrfs",
    "COWLINK_TEST_EXT4": "ext2/ext3",
    "COWLINK_TEST_TMPFS": "tmpfs",
}


def fs_kind(path: Path) -> str:
    """The filesystem type of `path`, as coreutils names it."""
    out = subprocess.run(["stat", "-f", "-c", "%T", str(path)], capture_output=True, text=True, check=True)
    return out.stdout.strip()


def _dir_on(var: str) -> Iterator[Path]:
    root = os.environ.get(var)
    if not root:
        pytest.fail(f"{var} is not set: run the Python tests through scripts/test (or scripts/testfs up)")
    kind = fs_kind(Path(root))
    if kind != KINDS[var]:
        pytest.fail(f"{var}={root} is {kind}, not {KINDS[var]}")
    d = Path(tempfile.mkdtemp(prefix="py-", dir=root))
    try:
        yield d
    finally:
        subprocess.run(["chattr", "-R", "-i", str(d)], capture_output=True)
        shutil.rmtree(d, ignore_errors=True)


@pytest.fixture(autouse=True)
def _dedupe_index_dir(tmp_path_factory: pytest.TempPathFactory, monkeypatch: pytest.MonkeyPatch) -> None:
    """dedupe keeps its index where the command does unless told otherwise
    (index=True is the default): for each test, a fresh directory of its
    own (COWLINK_INDEX_DIR), never the machine's /var/lib/cowlink."""
    monkeypatch.setenv("COWLINK_INDEX_DIR", str(tmp_path_factory.mktemp("index")))


@pytest.fixture
def xfs() -> Iterator[Path]:
    yield from _dir_on("COWLINK_TEST_XFS")


@pytest.fixture
def btrfs() -> Iterator[Path]:
    yield from _dir_on("COWLINK_TEST_BTRFS")


@pytest.fixture
def ext4() -> Iterator[Path]:
    yield from _dir_on("COWLINK_TEST_EXT4")


@pytest.fixture
def tmpfs() -> Iterator[Path]:
    yield from _dir_on("COWLINK_TEST_TMPFS")


@pytest.fixture(params=["COWLINK_TEST_XFS", "COWLINK_TEST_BTRFS"], ids=["xfs", "btrfs"])
def cow(request: pytest.FixtureRequest) -> Iterator[Path]:
    """A directory on each filesystem that clones."""
    yield from _dir_on(request.param)


def rich_tree(root: Path) -> None:
    """The project's rich fixture (every kind of entry, odd names, xattrs,
    ACLs, hardlinks, sparse files, nanosecond times), built by the
    cowlink-testfs crate's example so Rust and Python tests share it."""
    exe = REPO / "target" / "release" / "examples" / "rich-tree"
    if not exe.exists():
        subprocess.run(
            ["cargo", "build", "--quiet", "--release", "-p", "cowlink-testfs", "--example", "rich-tree"],
            cwd=REPO,
            check=True,
        )
    subprocess.run([str(exe), str(root), "40"], check=True, capture_output=True)


def data(n: int, seed: int) -> bytes:
    """`n` bytes that differ per seed and do not compress."""
    import random

    return random.Random(seed).randbytes(n)


def write(path: Path, content: bytes) -> Path:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_bytes(content)
    return path
