"""clone_file, clone_range, extents and usage on real filesystems."""

from __future__ import annotations

import os
import subprocess
from pathlib import Path

import pytest
from conftest import data, write

import cowlink


def filefrag_shared(path: Path) -> bool:
    out = subprocess.run(["filefrag", "-v", str(path)], capture_output=True, text=True, check=True).stdout
    rows = [line for line in out.splitlines() if line.strip()[:1].isdigit()]
    return bool(rows) and all("shared" in line for line in rows)


def test_clone_file_shares_blocks_and_writes_stay_apart(cow: Path) -> None:
    src = write(cow / "src", data(1 << 20, 1))
    os.sync()
    out = cowlink.clone_file(src, cow / "dst")
    assert out.method == "reflink"
    assert out.bytes == 1 << 20
    assert (cow / "dst").read_bytes() == src.read_bytes()
    for p in (src, cow / "dst"):
        layout = cowlink.extents(p)
        assert layout.size == 1 << 20
        assert layout.shared_bytes == 1 << 20, layout
        assert all(e.shared for e in layout.extents)
        assert filefrag_shared(p), "filefrag -v shows no shared flag"
    # A write to the clone leaves the source alone.
    with open(cow / "dst", "r+b") as f:
        f.write(b"x" * 4096)
    assert src.read_bytes() == data(1 << 20, 1)
    assert (cow / "dst").read_bytes()[:4096] == b"x" * 4096


def test_clone_file_not_atomic_creates_under_the_name_and_never_over_a_file(cow: Path) -> None:
    src = write(cow / "src", data(300_000, 5))
    src.chmod(0o750)
    umask = os.umask(0)
    os.umask(umask)
    out = cowlink.clone_file(src, cow / "dst", link="clone", atomic=False)
    assert out.method == "reflink"
    assert (cow / "dst").read_bytes() == src.read_bytes()
    assert cowlink.extents(cow / "dst").shared_fraction == 1.0
    # The source's mode less the umask; the unfinished mark is cleared.
    assert (cow / "dst").stat().st_mode & 0o7777 == 0o750 & ~umask
    with pytest.raises(FileExistsError) as e:
        cowlink.clone_file(write(cow / "other", b"x"), cow / "dst", atomic=False)
    assert e.value.filename2 == str(cow / "dst")
    assert (cow / "dst").read_bytes() == src.read_bytes()
    # A file a killed run left carries the sticky bit, and the error says so.
    (cow / "dst").chmod(0o1640)
    with pytest.raises(FileExistsError) as e:
        cowlink.clone_file(cow / "other", cow / "dst", atomic=False)
    assert "left unfinished" in str(e.value)
    assert sorted(os.listdir(cow)) == ["dst", "other", "src"]


def test_ext4_auto_copies_and_says_so(ext4: Path) -> None:
    src = write(ext4 / "src", data(100_000, 2))
    out = cowlink.clone_file(str(src), str(ext4 / "dst"))
    assert out.method in ("copy_offload", "read_write")
    assert (ext4 / "dst").read_bytes() == src.read_bytes()
    assert cowlink.extents(ext4 / "dst").shared_bytes == 0


def test_always_on_ext4_raises_not_supported_and_creates_nothing(ext4: Path) -> None:
    src = write(ext4 / "src", b"abc")
    with pytest.raises(cowlink.NotSupportedError) as e:
        cowlink.clone_file(src, ext4 / "dst", link="clone")
    assert e.value.errno == 95
    assert e.value.filename == str(src)
    assert e.value.filename2 == str(ext4 / "dst")
    assert "ext4" in e.value.message
    assert sorted(os.listdir(ext4)) == ["src"]


def test_across_filesystems_is_a_cross_device_error(xfs: Path, btrfs: Path) -> None:
    src = write(xfs / "src", b"abc")
    with pytest.raises(cowlink.CrossDeviceError) as e:
        cowlink.clone_file(src, btrfs / "dst", link="clone")
    assert e.value.errno == 18
    assert e.value.filename == str(src)
    assert not (btrfs / "dst").exists()
    # auto copies instead, and says so.
    assert cowlink.clone_file(src, btrfs / "dst").method != "reflink"
    assert (btrfs / "dst").read_bytes() == b"abc"


def test_preserve_and_overwrite(xfs: Path) -> None:
    src = write(xfs / "src", b"one")
    os.chmod(src, 0o640)
    os.utime(src, ns=(1_000_000_123, 2_000_000_456))
    cowlink.clone_file(src, xfs / "dst", preserve={"mode", "timestamps"})
    st = os.stat(xfs / "dst")
    assert st.st_mode & 0o7777 == 0o640
    assert st.st_mtime_ns == 2_000_000_456
    write(xfs / "src", b"two")
    with pytest.raises(FileExistsError):
        cowlink.clone_file(src, xfs / "dst")
    assert cowlink.clone_file(src, xfs / "dst", overwrite="skip").method == "skipped"
    assert (xfs / "dst").read_bytes() == b"one"
    cowlink.clone_file(src, xfs / "dst", overwrite="replace", preserve="all")
    assert (xfs / "dst").read_bytes() == b"two"
    with pytest.raises(ValueError, match="link must be one of"):
        cowlink.clone_file(src, xfs / "x", link="sometimes")  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="unknown attribute"):
        cowlink.clone_file(src, xfs / "x", preserve=["colour"])  # type: ignore[list-item]


def test_link_hardlink_is_the_same_inode(xfs: Path, btrfs: Path) -> None:
    src = write(xfs / "src", b"abc")
    out = cowlink.clone_file(src, xfs / "h", link="hardlink")
    assert (out.method, out.bytes) == ("hardlink", 3)
    assert os.stat(xfs / "h").st_ino == os.stat(src).st_ino
    assert os.stat(src).st_nlink == 2
    with pytest.raises(FileExistsError):
        cowlink.clone_file(src, xfs / "h", link="hardlink")
    # Across filesystems there is no hardlink, and no copy either.
    with pytest.raises(cowlink.CrossDeviceError):
        cowlink.clone_file(src, btrfs / "h", link="hardlink")
    assert not (btrfs / "h").exists()
    # A tree copy with link="hardlink" links every file (as cp -rl).
    write(xfs / "t" / "sub" / "f", b"xyz")
    r = cowlink.copytree(xfs / "t", xfs / "t2", link="hardlink")
    assert r.hardlinks == 1 and r.files == 0
    assert os.stat(xfs / "t2" / "sub" / "f").st_ino == os.stat(xfs / "t" / "sub" / "f").st_ino


def test_the_old_reflink_spelling_still_works_and_warns(xfs: Path, ext4: Path) -> None:
    src = write(xfs / "src", data(200_000, 3))
    with pytest.warns(DeprecationWarning, match='reflink="always" is deprecated; use link="clone"'):
        out = cowlink.clone_file(src, xfs / "always", reflink="always")
    assert out.method == "reflink"
    assert cowlink.extents(xfs / "always").shared_fraction == 1.0
    with pytest.warns(DeprecationWarning, match='use link="copy"'):
        out = cowlink.clone_file(src, xfs / "never", reflink="never")
    assert out.method == "read_write"
    assert (xfs / "never").read_bytes() == src.read_bytes()
    assert cowlink.extents(xfs / "never").shared_bytes == 0
    # Its old meaning is kept: always on ext4 fails and creates nothing.
    e4 = write(ext4 / "src", b"abc")
    with pytest.warns(DeprecationWarning), pytest.raises(cowlink.NotSupportedError):
        cowlink.clone_file(e4, ext4 / "dst", reflink="always")
    assert sorted(os.listdir(ext4)) == ["src"]
    with pytest.raises(ValueError, match="reflink must be one of"):
        cowlink.clone_file(src, xfs / "x", reflink="clone")  # type: ignore[arg-type]
    with pytest.raises(TypeError, match="link= only"):
        cowlink.clone_file(src, xfs / "x", link="auto", reflink="auto")
    # The tree copy takes it too.
    write(xfs / "t" / "f", data(10_000, 4))
    with pytest.warns(DeprecationWarning, match='use link="copy"'):
        r = cowlink.copytree(xfs / "t", xfs / "t2", reflink="never")
    assert (r.files, r.copied, r.cloned) == (1, 1, 0)
    assert (xfs / "t2" / "f").read_bytes() == data(10_000, 4)
    assert not (xfs / "x").exists()


def test_clone_range(xfs: Path) -> None:
    src = write(xfs / "src", data(1 << 20, 3))
    dst = write(xfs / "dst", bytes(1 << 20))
    out = cowlink.clone_range(src, dst, src_offset=65536, dst_offset=0, length=65536)
    assert out.method == "reflink"
    assert dst.read_bytes()[:65536] == src.read_bytes()[65536:131072]
    assert cowlink.extents(dst).shared_bytes == 65536


def test_non_utf8_names_round_trip(xfs: Path) -> None:
    d = os.fsencode(xfs)
    src = d + b"/caf\xe9-\xff"
    with open(src, "wb") as f:
        f.write(b"latin-1 name")
    out = cowlink.clone_file(src, d + b"/copy-\xfe")
    assert out.method == "reflink"
    with open(d + b"/copy-\xfe", "rb") as f:
        assert f.read() == b"latin-1 name"
    tree = d + b"/tree-\xff"
    os.mkdir(tree)
    os.rename(src, tree + b"/\xe9")
    cowlink.copytree(tree, d + b"/tree-copy")
    assert os.listdir(d + b"/tree-copy") == [b"\xe9"]
    # Paths in results are pathlib.Path; os.fsencode gives the bytes back.
    layout = cowlink.probe.filesystem(tree)
    assert os.fsencode(layout.path) == tree
    with pytest.raises(FileNotFoundError) as e:
        cowlink.clone_file(d + b"/gone-\xff", d + b"/x")
    assert os.fsencode(e.value.filename) == d + b"/gone-\xff"


def test_usage_counts_shared_once(xfs: Path) -> None:
    src = write(xfs / "a", data(1 << 20, 4))
    cowlink.clone_file(src, xfs / "b")
    os.sync()
    u = cowlink.usage([xfs / "a", xfs / "b"])
    assert u.files == 2
    assert u.apparent == 2 << 20
    assert u.shared_inside == 1 << 20
    assert u.on_disk == 1 << 20
    assert u.saved == 1 << 20


def test_probe(xfs: Path, ext4: Path) -> None:
    f = cowlink.probe.filesystem(xfs)
    assert f.kind == "xfs" and f.reflink and f.block_size
    assert f.reflink.answer == "yes" and f.reflink.reason is None
    e = cowlink.probe.filesystem(ext4)
    assert not e.reflink and e.reflink.answer == "no"
    assert e.reflink.reason and "ext4" in e.reflink.reason
    s = cowlink.probe.between(xfs, ext4)
    assert not s.same_filesystem and not s.reflink
    mounts = cowlink.probe.tree(xfs)
    assert [m.fstype for m in mounts][:1] == ["xfs"]
    assert "Answer(answer=" in repr(f)
