"""Every exception class, raised by a real case, with errno and filename."""

from __future__ import annotations

import errno
import os
import pickle
import subprocess
from collections.abc import Callable
from pathlib import Path
from typing import Any

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


# Every exception class cowlink exports, raised by a real case: (the
# exception, the errno it must carry, filename, filename2). Each case gets a
# fresh directory on XFS and one on ext4 and Btrfs for the cases that need
# another filesystem.
Case = tuple[OSError, int, "Path | None", "Path | None"]


def _not_supported(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    src = write(ext4 / "s", b"x")
    with pytest.raises(cowlink.NotSupportedError) as e:
        cowlink.clone_file(src, ext4 / "d", link="clone")
    return e.value, errno.EOPNOTSUPP, src, ext4 / "d"


def _cross_device(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    src = write(xfs / "s", b"x" * 10000)
    with pytest.raises(cowlink.CrossDeviceError) as e:
        cowlink.clone_file(src, btrfs / "d", link="clone")
    return e.value, errno.EXDEV, src, btrfs / "d"


def _unaligned(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    src = write(xfs / "s", b"x" * 10000)
    write(xfs / "d", bytes(65536))
    with pytest.raises(cowlink.UnalignedError) as e:
        cowlink.clone_range(src, xfs / "d", src_offset=1, length=4096)
    return e.value, errno.EINVAL, src, xfs / "d"


def _same_file(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    src = write(xfs / "s", b"x")
    with pytest.raises(cowlink.SameFileError) as e:
        cowlink.clone_file(src, src, overwrite="replace")
    return e.value, errno.EINVAL, src, src


def _same_file_through_a_link(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    src = write(xfs / "s", b"x")
    os.link(src, xfs / "hard")
    with pytest.raises(cowlink.SameFileError) as e:
        cowlink.clone_file(src, xfs / "hard", overwrite="replace")
    return e.value, errno.EINVAL, src, xfs / "hard"


def _not_regular(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    os.mkfifo(xfs / "fifo")
    with pytest.raises(cowlink.NotRegularFileError) as e:
        cowlink.clone_file(xfs / "fifo", xfs / "d")
    return e.value, errno.EINVAL, xfs / "fifo", xfs / "d"


def _content_changed(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    write(xfs / "tree" / "f", b"stored bytes")
    store = cowlink.Store(xfs / "store")
    added = store.add_tree(xfs / "tree")
    manifest = xfs / "store" / "manifests" / added.digest
    os.chmod(manifest, 0o644)
    with open(manifest, "ab") as f:
        f.write(b"\n")
    with pytest.raises(cowlink.ContentChangedError) as e:
        store.checkout(added.digest, xfs / "out")
    return e.value, errno.EAGAIN, manifest, None


def _corrupt(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    # A symbolic link where the store keeps a directory.
    os.mkdir(xfs / "store")
    os.symlink("/", xfs / "store" / "objects")
    with pytest.raises(cowlink.CorruptError) as e:
        cowlink.Store(xfs / "store")
    return e.value, errno.EUCLEAN, xfs / "store" / "objects", None


def _corrupt_object(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    # An object whose bytes were changed in the store: the checkout places
    # everything else and lists this entry's error.
    write(xfs / "tree" / "f", b"stored bytes")
    write(xfs / "tree" / "g", b"other bytes")
    store = cowlink.Store(xfs / "store")
    added = store.add_tree(xfs / "tree")
    f_digest = store.add(xfs / "tree" / "f").digest
    obj = xfs / "store" / "objects" / f_digest[:2] / f_digest
    os.chmod(obj, 0o644)
    with open(obj, "r+b") as f:
        f.write(b"S")
    report = store.checkout(added.digest, xfs / "out")
    assert (xfs / "out" / "g").read_bytes() == b"other bytes"
    assert not (xfs / "out" / "f").exists()
    assert len(report.errors) == 1
    exc = report.errors[0]
    assert isinstance(exc, OSError)
    return exc, errno.EUCLEAN, obj, xfs / "out" / "f"


def _cancelled(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    write(xfs / "tree" / "f", b"x")
    store = cowlink.Store(xfs / "store")
    store.add_tree(xfs / "tree")
    token = cowlink.CancelToken()
    token.cancel()
    with pytest.raises(cowlink.CancelledError) as e:
        store.verify(cancel=token)
    return e.value, errno.ECANCELED, xfs / "store", None


def _cancelled_without_a_path(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    # The library names no path for a cancelled plan: errno still set.
    write(xfs / "tree" / "f", b"x")
    token = cowlink.CancelToken()
    token.cancel()
    with pytest.raises(cowlink.CancelledError) as e:
        cowlink.dedupe.plan([xfs / "tree"], cancel=token)
    return e.value, errno.ECANCELED, None, None


def _tree_error(xfs: Path, ext4: Path, btrfs: Path) -> Case:
    write(xfs / "src" / "ok", b"fine")
    os.mkfifo(xfs / "src" / "fifo")
    write(ext4 / "dst" / "fifo" / "in-the-way", b"")
    with pytest.raises(cowlink.TreeError) as e:
        cowlink.copytree(xfs / "src", ext4 / "dst", dirs_exist_ok=True)
    assert (ext4 / "dst" / "ok").read_bytes() == b"fine"
    first = e.value.errors[0]
    assert isinstance(first, OSError) and first.errno
    return e.value, first.errno, xfs / "src", ext4 / "dst"


CASES = {
    "not_supported": (cowlink.NotSupportedError, _not_supported),
    "cross_device": (cowlink.CrossDeviceError, _cross_device),
    "unaligned": (cowlink.UnalignedError, _unaligned),
    "same_file": (cowlink.SameFileError, _same_file),
    "same_file_hardlink": (cowlink.SameFileError, _same_file_through_a_link),
    "not_regular": (cowlink.NotRegularFileError, _not_regular),
    "content_changed": (cowlink.ContentChangedError, _content_changed),
    "corrupt": (cowlink.CorruptError, _corrupt),
    "corrupt_object": (cowlink.CorruptError, _corrupt_object),
    "cancelled": (cowlink.CancelledError, _cancelled),
    "cancelled_plan": (cowlink.CancelledError, _cancelled_without_a_path),
    "tree": (cowlink.TreeError, _tree_error),
}

# Classes raised only where a case is too costly for this table, with the
# test that covers them; InUseError comes only from disk images and drives,
# which the Python package does not expose.
ELSEWHERE = {
    cowlink.LinkLimitError: "test_link_limit_inside_a_tree_copy",
    cowlink.InUseError: "not raised by the Python API",
}


def test_every_exception_class_has_a_case() -> None:
    exported = {
        v
        for v in vars(cowlink).values()
        if isinstance(v, type) and issubclass(v, OSError) and v.__module__ == "cowlink"
    }
    covered = {cls for cls, _ in CASES.values()} | set(ELSEWHERE)
    assert exported == covered, exported ^ covered


@pytest.mark.parametrize("name", sorted(CASES))
def test_every_exception_carries_errno_and_filename(
    name: str, xfs: Path, ext4: Path, btrfs: Path
) -> None:
    cls, make = CASES[name]
    exc, code, filename, filename2 = make(xfs, ext4, btrfs)
    assert type(exc) is cls, exc
    assert isinstance(exc, OSError)
    assert exc.errno == code, (exc, errno.errorcode.get(exc.errno or 0))
    assert exc.filename == (None if filename is None else str(filename)), exc
    if filename2 is not None:
        assert exc.filename2 == str(filename2), exc
    # As Python's own: "[Errno N] reason: 'name'".
    assert str(exc).startswith(f"[Errno {code}] "), str(exc)
    if filename is not None:
        assert repr(str(filename)) in str(exc), str(exc)
    assert exc.strerror and exc.message and exc.kind  # type: ignore[attr-defined]
    assert isinstance(exc.args[0], int) and exc.args[0] == code
    if cls is cowlink.TreeError:
        return  # its report is a record, and records do not pickle
    # It crosses a process boundary (multiprocessing pickles it) whole.
    back = pickle.loads(pickle.dumps(exc))
    assert type(back) is cls
    for attr in ("errno", "strerror", "filename", "filename2", "message", "kind"):
        assert getattr(back, attr) == getattr(exc, attr), attr
    assert str(back) == str(exc)


# Hostile path arguments: what os refuses (a NUL byte: ValueError; not a
# path: TypeError) every cowlink call refuses the same way, before it
# touches the filesystem, and never with a PanicException.
HOSTILE_PATHS: list[tuple[object, type[Exception]]] = [
    ("a\0b", ValueError),
    (b"a\0b", ValueError),
    ("\0", ValueError),
    (b"dir/\0/x", ValueError),
    (5, TypeError),
    (None, TypeError),
    (1.5, TypeError),
    (["a"], TypeError),
]


def _calls(d: Path, store: cowlink.Store, h: object) -> dict[str, Callable[[], object]]:
    f = d / "f"
    bad: Any = h
    return {
        "clone_file src": lambda: cowlink.clone_file(bad, d / "n1"),
        "clone_file dst": lambda: cowlink.clone_file(f, bad),
        "clone_range src": lambda: cowlink.clone_range(bad, f, length=0),
        "clone_range dst": lambda: cowlink.clone_range(f, bad, length=0),
        "copytree src": lambda: cowlink.copytree(bad, d / "n2"),
        "copytree dst": lambda: cowlink.copytree(d / "tree", bad),
        "extents": lambda: cowlink.extents(bad),
        "usage": lambda: cowlink.usage([f, bad]),
        "probe.filesystem": lambda: cowlink.probe.filesystem(bad),
        "probe.between src": lambda: cowlink.probe.between(bad, d),
        "probe.between dst": lambda: cowlink.probe.between(f, bad),
        "probe.tree": lambda: cowlink.probe.tree(bad),
        "dedupe.plan": lambda: cowlink.dedupe.plan([d / "tree", bad]),
        "dedupe.run": lambda: cowlink.dedupe.run([bad]),
        "Store": lambda: cowlink.Store(bad),
        "Store.add": lambda: store.add(bad),
        "Store.add_tree": lambda: store.add_tree(bad),
        "Store.checkout": lambda: store.checkout("0" * 64, bad),
        "PreallocWriter": lambda: cowlink.PreallocWriter(bad, 1),
    }


@pytest.mark.parametrize("hostile,expected", HOSTILE_PATHS, ids=lambda v: repr(v)[:12])
def test_hostile_paths_are_refused_as_os_refuses_them(
    hostile: object, expected: type[Exception], xfs: Path
) -> None:
    with pytest.raises(expected):
        os.lstat(hostile)  # type: ignore[arg-type]
    write(xfs / "f", b"file")
    write(xfs / "tree" / "g", b"in a tree")
    store = cowlink.Store(xfs / "store")
    before = sorted(str(p) for p in xfs.rglob("*"))
    for name, call in _calls(xfs, store, hostile).items():
        with pytest.raises(expected) as e:
            call()
        assert not isinstance(e.value, OSError), (name, e.value)
    assert sorted(str(p) for p in xfs.rglob("*")) == before


@pytest.mark.parametrize("hostile", [5, "not callable", b"", object()], ids=repr)
def test_on_progress_must_be_callable_before_any_work(hostile: object, xfs: Path) -> None:
    write(xfs / "tree" / "g", b"in a tree")
    store = cowlink.Store(xfs / "store")
    digest = store.add_tree(xfs / "tree").digest
    cb: Any = hostile
    calls: dict[str, Callable[[], object]] = {
        "copytree": lambda: cowlink.copytree(xfs / "tree", xfs / "copy", on_progress=cb),
        "usage": lambda: cowlink.usage([xfs / "tree"], on_progress=cb),
        "dedupe.plan": lambda: cowlink.dedupe.plan([xfs / "tree"], on_progress=cb),
        "dedupe.run": lambda: cowlink.dedupe.run([xfs / "tree"], on_progress=cb),
        "Store.add_tree": lambda: store.add_tree(xfs / "tree", on_progress=cb),
        "Store.checkout": lambda: store.checkout(digest, xfs / "out", on_progress=cb),
        "Store.verify": lambda: store.verify(on_progress=cb),
    }
    before = sorted(str(p) for p in xfs.rglob("*"))
    for name, call in calls.items():
        with pytest.raises(TypeError, match="on_progress must be callable"):
            call()
    assert sorted(str(p) for p in xfs.rglob("*")) == before
