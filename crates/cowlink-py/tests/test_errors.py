"""Every exception class, raised by a real case, with errno and filename."""

from __future__ import annotations

import errno
import os
import subprocess
from pathlib import Path

import pytest
from conftest import write

import cowlink


def test_builtin_oserror_subclasses(xfs: Path) -> None:
    src = write(xfs / "src", b"x")
    cases: list[tuple[type[OSError], int, object, object]] = []
    with pytest.raises(FileNotFoundError) as nf:
        cowlink.clone_file(xfs / "missing", xfs / "d1")
    cases.append((FileNotFoundError, errno.ENOENT, nf.value, xfs / "missing"))
    write(xfs / "exists", b"y")
    with pytest.raises(FileExistsError) as fe:
        cowlink.clone_file(src, xfs / "exists")
    cases.append((FileExistsError, errno.EEXIST, fe.value, src))
    os.mkdir(xfs / "adir")
    with pytest.raises(IsADirectoryError) as isd:
        cowlink.clone_file(xfs / "adir", xfs / "d2")
    cases.append((IsADirectoryError, errno.EISDIR, isd.value, xfs / "adir"))
    with pytest.raises(NotADirectoryError) as nd:
        cowlink.clone_file(src, xfs / "exists" / "d3")
    cases.append((NotADirectoryError, errno.ENOTDIR, nd.value, src))
    # Root passes permission checks, but not an immutable directory.
    os.mkdir(xfs / "locked")
    subprocess.run(["chattr", "+i", str(xfs / "locked")], check=True)
    try:
        with pytest.raises(PermissionError) as pe:
            cowlink.clone_file(src, xfs / "locked" / "d4")
    finally:
        subprocess.run(["chattr", "-i", str(xfs / "locked")], check=True)
    cases.append((PermissionError, errno.EPERM, pe.value, src))
    for cls, code, exc, name in cases:
        assert type(exc) is cls
        assert isinstance(exc, OSError)
        assert exc.errno == code, exc
        assert exc.filename == str(name), exc
        assert exc.strerror and str(name) in str(exc)
        assert exc.kind  # type: ignore[attr-defined]


def test_cowlink_error_classes(xfs: Path, btrfs: Path, ext4: Path) -> None:
    src = write(xfs / "src", b"x" * 10000)
    with pytest.raises(cowlink.NotSupportedError) as ns:
        cowlink.clone_file(write(ext4 / "s", b"x"), ext4 / "d", reflink="always")
    with pytest.raises(cowlink.CrossDeviceError) as xd:
        cowlink.clone_file(src, btrfs / "d", reflink="always")
    write(xfs / "dst", bytes(65536))
    with pytest.raises(cowlink.UnalignedError) as un:
        cowlink.clone_range(src, xfs / "dst", src_offset=1, length=4096)
    with pytest.raises(cowlink.SameFileError) as sf:
        cowlink.clone_file(src, src, overwrite="replace")
    os.mkfifo(xfs / "fifo")
    with pytest.raises(cowlink.NotRegularFileError) as nr:
        cowlink.clone_file(xfs / "fifo", xfs / "d5")
    token = cowlink.CancelToken()
    token.cancel()
    with pytest.raises(cowlink.CancelledError) as ca:
        cowlink.dedupe.plan([xfs], cancel=token)
    for exc, code in [
        (ns.value, errno.EOPNOTSUPP),
        (xd.value, errno.EXDEV),
        (un.value, errno.EINVAL),
        (sf.value, None),
        (nr.value, None),
        (ca.value, errno.ECANCELED),
    ]:
        assert isinstance(exc, OSError)
        assert exc.errno == code, exc
        assert exc.message  # type: ignore[attr-defined]
    for exc in (ns.value, xd.value, un.value):
        assert exc.filename and exc.filename2


def test_link_limit_inside_a_tree_copy(xfs: Path, ext4: Path) -> None:
    # ext4 allows 65,000 links to a file; XFS far more. A tree on XFS with
    # one file under 65,010 names fails to copy to ext4 at the 65,001st.
    src = xfs / "src"
    os.mkdir(src)
    first = write(src / "f0", b"linked")
    for i in range(1, 65010):
        os.link(first, src / f"f{i}")
    with pytest.raises(cowlink.TreeError) as te:
        cowlink.copytree(src, ext4 / "dst")
    err = te.value
    assert err.report.errors == len(err.errors) > 0
    assert "could not be copied" in str(err)
    limit = [e for e in err.errors if isinstance(e, cowlink.LinkLimitError)]
    assert limit, err.errors[:3]
    assert limit[0].errno == errno.EMLINK
    assert limit[0].filename and limit[0].filename2
    assert os.stat(ext4 / "dst" / "f0").st_nlink == 65000


def test_content_changed_and_corrupt_in_a_store(xfs: Path) -> None:
    write(xfs / "tree" / "f", b"stored bytes")
    store = cowlink.Store(xfs / "store")
    added = store.add_tree(xfs / "tree")
    manifest = xfs / "store" / "manifests" / added.digest
    os.chmod(manifest, 0o644)
    with open(manifest, "ab") as f:
        f.write(b"\n")
    with pytest.raises(cowlink.ContentChangedError) as cc:
        store.checkout(added.digest, xfs / "out")
    assert cc.value.message
    # A symbolic link where the store keeps a directory.
    os.mkdir(xfs / "store2")
    os.symlink("/", xfs / "store2" / "objects")
    with pytest.raises(cowlink.CorruptError) as co:
        cowlink.Store(xfs / "store2")
    assert "objects" in co.value.message
