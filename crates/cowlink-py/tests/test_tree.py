"""copytree: equal to GNU cp -a, clean on KeyboardInterrupt, GIL released."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest
from conftest import data, rich_tree, write

import cowlink


def rsync_differences(a: Path, b: Path) -> list[str]:
    """What rsync would change to make b equal to a (names, data by
    checksum, modes, owners, times, hardlinks, ACLs, xattrs)."""
    out = subprocess.run(
        ["rsync", "-aniHAX", "--checksum", f"{a}/", f"{b}/"],
        capture_output=True,
        check=True,
    ).stdout
    return [line for line in out.decode(errors="replace").splitlines() if line.strip()]


def test_copytree_equals_cp_a_on_the_rich_fixture(cow: Path) -> None:
    src = cow / "src"
    rich_tree(src)
    subprocess.run(["cp", "-a", "--reflink=always", str(src), str(cow / "by-cp")], check=True)
    seen: list[cowlink.Progress] = []
    report = cowlink.copytree(src, cow / "by-cowlink", on_progress=seen.append)
    assert report.errors == 0 and not report.cancelled
    assert report.files > 0 and report.cloned == report.files
    assert rsync_differences(cow / "by-cp", cow / "by-cowlink") == []
    assert rsync_differences(src, cow / "by-cowlink") == []
    assert seen and seen[-1].phase in ("copy", "done")
    # Every file linked into place complete: the same result.
    atomic = cowlink.copytree(src, cow / "atomic", atomic=True)
    assert atomic.errors == 0 and atomic.cloned == report.cloned
    assert rsync_differences(cow / "by-cp", cow / "atomic") == []
    # dirs_exist_ok=False refuses an existing destination, naming it.
    with pytest.raises(FileExistsError) as e:
        cowlink.copytree(src, cow / "by-cowlink")
    assert e.value.filename2 == str(cow / "by-cowlink")
    again = cowlink.copytree(src, cow / "by-cowlink", dirs_exist_ok=True)
    assert again.errors == 0


def test_copytree_not_archive_is_cp_r(xfs: Path) -> None:
    write(xfs / "src" / "f", b"abc")
    os.utime(xfs / "src" / "f", ns=(1_000_000_000, 1_000_000_000))
    r = cowlink.copytree(xfs / "src", xfs / "dst", archive=False, link="copy")
    assert r.copied == 1 and r.cloned == 0
    assert os.stat(xfs / "dst" / "f").st_mtime_ns != 1_000_000_000


def big_tree(root: Path, files: int, size: int) -> None:
    for i in range(files):
        write(root / f"d{i % 16}" / f"f{i}", data(size, i % 97))


# Copies here run from the page cache, so bytes go by fast; what makes a
# copy last long enough to interrupt is the count of files.
MANY = 20000


def assert_nothing_partial(src: Path, dst: Path) -> int:
    """Every file under dst is whole (its source's bytes, no unfinished
    mark); returns how many there are."""
    n = 0
    for dirpath, _, names in os.walk(dst):
        for name in names:
            p = Path(dirpath) / name
            rel = p.relative_to(dst)
            assert p.read_bytes() == (src / rel).read_bytes(), f"{rel} is partial"
            assert not os.stat(p).st_mode & 0o1000, f"{rel} carries the unfinished mark"
            n += 1
    return n


def test_keyboard_interrupt_from_on_progress_leaves_nothing_partial(ext4: Path) -> None:
    src = ext4 / "src"
    big_tree(src, MANY, 512)
    calls = 0

    def interrupt(p: cowlink.Progress) -> None:
        nonlocal calls
        calls += 1
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cowlink.copytree(src, ext4 / "dst", link="copy", threads=1, on_progress=interrupt)
    assert calls == 1
    done = assert_nothing_partial(src, ext4 / "dst")
    assert done < MANY, "the copy was not interrupted"


def test_sigint_stops_a_copy_in_another_process(ext4: Path) -> None:
    src = ext4 / "src"
    big_tree(src, MANY, 512)
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, cowlink\n"
            # A shell that started this run in the background may have set
            # SIGINT to "ignore", which Python then keeps: restore its handler.
            "import signal\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "def started(p):\n"
            "    print('started', flush=True)\n"
            "cowlink.copytree(sys.argv[1], sys.argv[2], link='copy', threads=1, on_progress=started)\n",
            str(src),
            str(ext4 / "dst"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    assert child.stdout.readline() == "started\n"
    child.send_signal(signal.SIGINT)
    _, err = child.communicate(timeout=60)
    assert child.returncode == -signal.SIGINT, err
    assert "KeyboardInterrupt" in err
    assert assert_nothing_partial(src, ext4 / "dst") < MANY


def test_cancel_token(xfs: Path) -> None:
    src = xfs / "src"
    big_tree(src, 8, 4096)
    token = cowlink.CancelToken()
    token.cancel()
    r = cowlink.copytree(src, xfs / "dst", cancel=token)
    assert r.cancelled and token.cancelled
    assert r.files < 8


def test_the_gil_is_released_during_copytree(ext4: Path) -> None:
    src = ext4 / "src"
    big_tree(src, MANY, 512)
    ticks = 0
    stop = threading.Event()

    def spin() -> None:
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    t = threading.Thread(target=spin)
    t.start()
    try:
        time.sleep(0.05)
        before = ticks
        started = time.monotonic()
        cowlink.copytree(src, ext4 / "dst", link="copy", threads=1)
        elapsed = time.monotonic() - started
        during = ticks - before
    finally:
        stop.set()
        t.join()
    # A thread that sleeps 1 ms per tick manages hundreds of ticks a second
    # while the GIL is free; with the GIL held it would manage none.
    assert elapsed > 0.1, "the copy was too quick to tell"
    assert during > 20 * elapsed, (during, elapsed)


def test_copy_is_gnu_cp_for_files(cow: Path) -> None:
    """`cowlink.copy` is `cowlink cp`'s code: a clone, then cp's rules for
    existing destinations (backups, -n, none-fail, the same file)."""
    body = data(256 << 10, 1)
    src = write(cow / "src", body)
    report = cowlink.copy(src, cow / "dst")
    assert (cow / "dst").read_bytes() == body
    assert (report.files, report.cloned, report.copied) == (1, 1, 0)
    layout = cowlink.extents(cow / "dst")
    assert layout.shared_bytes == len(body)
    # A numbered backup of the replaced file, as cp --backup=numbered.
    write(cow / "dst", b"old")
    cowlink.copy(src, cow / "dst", backup="numbered")
    assert (cow / "dst.~1~").read_bytes() == b"old"
    assert (cow / "dst").read_bytes() == body
    # update="none" keeps silently; "none-fail" raises FileExistsError.
    write(cow / "keep", b"mine")
    cowlink.copy(src, cow / "keep", update="none")
    assert (cow / "keep").read_bytes() == b"mine"
    with pytest.raises(FileExistsError):
        cowlink.copy(src, cow / "keep", update="none-fail")
    assert (cow / "keep").read_bytes() == b"mine"
    # cp F F is refused with the typed error, and F is intact.
    with pytest.raises(cowlink.SameFileError) as same:
        cowlink.copy(src, src)
    assert "are the same file" in str(same.value)
    assert src.read_bytes() == body


def test_copy_interactive_calls_the_python_callable(xfs: Path) -> None:
    src = write(xfs / "src", b"new")
    dst = write(xfs / "dst", b"old")
    asked: list[str] = []

    def no(question: str) -> bool:
        asked.append(question)
        return False

    cowlink.copy(src, dst, interactive=no)
    assert asked == [f"overwrite '{dst}'? "]
    assert dst.read_bytes() == b"old"
    cowlink.copy(src, dst, interactive=lambda q: True)
    assert dst.read_bytes() == b"new"
    write(dst, b"old")

    def boom(question: str) -> bool:
        raise KeyError("stop")

    with pytest.raises(KeyError):
        cowlink.copy(src, dst, interactive=boom)
    assert dst.read_bytes() == b"old"
    with pytest.raises(TypeError):
        cowlink.copy(src, dst, interactive=3)  # type: ignore[arg-type]


def test_copy_several_sources_into_a_directory(xfs: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    write(xfs / "a" / "b" / "f", b"f")
    write(xfs / "g", b"g")
    os.mkdir(xfs / "out")
    report = cowlink.copy([xfs / "a", xfs / "g"], xfs / "out", recursive=True)
    assert (xfs / "out" / "a" / "b" / "f").read_bytes() == b"f"
    assert (xfs / "out" / "g").read_bytes() == b"g"
    assert report.files == 2
    # A directory without recursive: the typed error, nothing copied.
    with pytest.raises(IsADirectoryError):
        cowlink.copy(xfs / "a", xfs / "out2")
    assert not (xfs / "out2").exists()
    # Several sources need a directory.
    with pytest.raises(NotADirectoryError):
        cowlink.copy([xfs / "g", xfs / "g"], xfs / "g")
    # --parents keeps the source's path under the target.
    monkeypatch.chdir(xfs)
    os.mkdir(xfs / "par")
    cowlink.copy("a/b/f", "par", parents=True)
    assert (xfs / "par" / "a" / "b" / "f").read_bytes() == b"f"
