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
