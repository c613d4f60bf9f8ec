"""dedupe, the store and PreallocWriter on real filesystems."""

from __future__ import annotations

import array
import gc
import io
import json
import mmap
import os
import random
import re
import signal
import stat
import subprocess
import sys
import threading
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from conftest import data, write

import cowlink


def free_bytes(path: Path) -> int:
    os.sync()
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def test_dedupe_plan_json_execute_reclaims_space(xfs: Path) -> None:
    content = data(16 << 20, 9)
    for name in ("a", "b", "c"):
        write(xfs / "d" / name, content)
    write(xfs / "d" / "other", data(1 << 20, 10))
    plan = cowlink.dedupe.plan([xfs / "d"], min_size=4096)
    assert len(plan.groups) == 1
    g = plan.groups[0]
    assert g.size == 16 << 20 and len(g.targets) == 2
    assert plan.reclaimable == 32 << 20
    text = plan.to_json()
    assert json.loads(text)["groups"][0]["size"] == 16 << 20
    again = cowlink.dedupe.Plan.from_json(text)
    before = free_bytes(xfs)
    report = cowlink.dedupe.execute(again)
    after = free_bytes(xfs)
    assert report.targets_deduped == 2 and not report.errors and not report.changed
    # Expected from the extent maps; measured by the report and here.
    assert report.measured and not report.skipped
    assert (30 << 20) <= report.bytes_reclaimed <= (34 << 20), report.bytes_reclaimed
    assert after - before >= 30 << 20, (before, after)
    for name in ("a", "b", "c"):
        assert (xfs / "d" / name).read_bytes() == content
        assert cowlink.extents(xfs / "d" / name).shared_bytes == 16 << 20
    with pytest.raises(ValueError, match="not a cowlink dedupe plan"):
        cowlink.dedupe.Plan.from_json("{}")


def test_dedupe_run_plans_and_executes_small_and_large_groups(xfs: Path) -> None:
    small, large = data(3000, 11), data(1 << 20, 12)
    for name in ("a", "b", "c"):
        write(xfs / "r" / "small" / name, small)
        write(xfs / "r" / "large" / name, large)
    expected = cowlink.dedupe.plan([xfs / "r"])
    before = free_bytes(xfs)
    plan, report = cowlink.dedupe.run([xfs / "r"], measure=True)
    after = free_bytes(xfs)
    assert report.measured and report.bytes_reclaimed >= (2 << 20) * 9 // 10
    # The same groups, but files over 8 KiB are grouped on their edges and
    # the kernel compares every byte: no whole-file hash for them.
    def shape(p: cowlink.dedupe.Plan) -> list[tuple[int, Path, list[Path]]]:
        return [(g.size, g.source, g.targets) for g in p.groups]

    assert shape(plan) == shape(expected)
    hashes = {g.size: g.blake3 for g in plan.groups}
    assert hashes[1 << 20] is None and hashes[3000] == {g.size: g.blake3 for g in expected.groups}[3000]
    assert all(g.blake3 is not None for g in expected.groups)
    assert report.groups == 2 and report.targets_deduped == 4 and report.regrouped == 0
    assert not report.errors and not report.changed and not report.cancelled
    assert after - before >= (2 << 20) * 9 // 10, (before, after)
    for kind, content in (("small", small), ("large", large)):
        for name in ("a", "b", "c"):
            f = xfs / "r" / kind / name
            assert f.read_bytes() == content
            assert cowlink.extents(f).shared_bytes > 0


def test_dedupe_with_a_store_shares_its_objects_and_reports_what_it_skips(xfs: Path) -> None:
    content = data(1 << 20, 70)
    store = cowlink.Store(xfs / "store")
    added = store.add(write(xfs / "in", content))
    (xfs / "in").unlink()
    obj = xfs / "store" / "objects" / added.digest[:2] / added.digest
    # f equals the object; g too, but a reflinked copy outside the paths
    # holds its blocks, so sharing it would give nothing back.
    write(xfs / "tree" / "f", content)
    write(xfs / "tree" / "g", content)
    cowlink.clone_file(xfs / "tree" / "g", xfs / "outside-g", link="clone")
    before = free_bytes(xfs)
    plan, report = cowlink.dedupe.run([xfs / "tree"], stores=[xfs / "store"])
    after = free_bytes(xfs)
    assert [g.source for g in plan.groups] == [obj]
    assert report.targets_deduped == 1 and report.measured and report.bytes_grown == 0
    assert [(s.path, s.reason) for s in report.skipped] == [(xfs / "tree" / "g", "held_elsewhere")]
    assert "held" in report.skipped[0].detail
    assert cowlink.extents(xfs / "tree" / "f").shared_bytes == 1 << 20
    assert store.verify().clean
    assert after - before >= (1 << 20) * 9 // 10
    with pytest.raises(OSError, match="not a cowlink store"):
        cowlink.dedupe.run([xfs / "tree"], stores=[xfs / "tree"])


def test_store_round_trip(xfs: Path) -> None:
    # Manifests hold UTF-8 names only, so not the rich fixture.
    for i in range(50):
        write(xfs / "tree" / f"d{i % 5}" / f"f{i}", data(10_000 + i, i))
    write(xfs / "tree" / "same-as-f0", data(10_000, 0))
    os.symlink("d0/f0", xfs / "tree" / "link")
    os.chmod(xfs / "tree" / "d1" / "f1", 0o755)
    store = cowlink.Store(xfs / "store")
    added = store.add_tree(xfs / "tree")
    assert len(added.digest) == 64 and added.files > 0
    one = store.add(write(xfs / "single", b"one file"))
    assert one.new and one.bytes == 8
    report = store.checkout(added.digest, xfs / "out", link="clone")
    assert not report.errors and report.cloned == report.files == added.files
    out = subprocess.run(
        ["diff", "-r", "--no-dereference", str(xfs / "tree"), str(xfs / "out")],
        capture_output=True,
    )
    assert out.returncode == 0, out.stdout[:2000]
    stats = store.stats()
    assert stats.manifests == 1 and stats.objects > 0
    assert store.verify().clean
    gc = store.gc()
    assert gc.manifests_kept == 1 and gc.objects_removed == 1  # the lone add
    with pytest.raises(ValueError, match="not a digest"):
        store.checkout("xyz", xfs / "out2")
    with pytest.raises(FileNotFoundError):
        store.checkout("0" * 64, xfs / "out3")


def test_prealloc_writer(xfs: Path) -> None:
    with cowlink.PreallocWriter(xfs / "new", 3 << 20) as w:
        assert w.preallocated
        for i in range(3):
            assert w.write(data(1 << 20, i)) == 1 << 20
        w.write(bytearray(b"tail"))
        w.write(memoryview(b"!"))
        assert not (xfs / "new").exists(), "visible before it is complete"
    assert w.closed
    assert (xfs / "new").read_bytes() == b"".join(data(1 << 20, i) for i in range(3)) + b"tail!"
    with pytest.raises(ValueError, match="closed file"):
        w.write(b"more")


def test_prealloc_writer_leaves_nothing_on_an_exception(xfs: Path) -> None:
    with pytest.raises(RuntimeError, match="boom"):
        with cowlink.PreallocWriter(xfs / "doomed", 1 << 20) as w:
            w.write(b"x" * 1000)
            raise RuntimeError("boom")
    assert os.listdir(xfs) == []
    # An existing name is refused when the file would take it, and the
    # file already there is left as it was.
    write(xfs / "taken", b"old")
    w = cowlink.PreallocWriter(xfs / "taken", 10)
    w.write(b"new")
    with pytest.raises(FileExistsError) as e:
        w.close()
    assert e.value.filename == str(xfs / "taken")
    assert (xfs / "taken").read_bytes() == b"old"
    assert os.listdir(xfs) == ["taken"]


def test_keyboard_interrupt_stops_a_checkout_and_a_dedupe_cleanly(xfs: Path) -> None:
    n = 20000
    for i in range(n):
        write(xfs / "tree" / f"d{i % 16}" / f"f{i}", data(600, i % 5000))
    store = cowlink.Store(xfs / "store")
    added = store.add_tree(xfs / "tree")

    def interrupt(p: cowlink.Progress) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        store.checkout(added.digest, xfs / "out", on_progress=interrupt)
    placed = 0
    for dirpath, _, names in os.walk(xfs / "out"):
        for name in names:
            p = Path(dirpath) / name
            assert p.read_bytes() == (xfs / "tree" / p.relative_to(xfs / "out")).read_bytes()
            placed += 1
    assert placed < n, "the checkout was not interrupted"
    assert store.verify().clean
    # The store is usable again after the interrupt.
    assert store.stats().manifests == 1

    # Dedupe: the exception propagates and no file's data changes (a short
    # run may finish before the first tick; the last report still raises).
    plan = cowlink.dedupe.plan([xfs / "tree"])
    assert plan.targets > 10000
    with pytest.raises(KeyboardInterrupt):
        cowlink.dedupe.execute(plan, on_progress=interrupt)
    for i in range(0, n, 997):
        assert (xfs / "tree" / f"d{i % 16}" / f"f{i}").read_bytes() == data(600, i % 5000)


# Hostile writes: everything io refuses, the writer refuses, and writes
# nothing. (io.BytesIO().write(x) raises TypeError for each of these.)
NOT_BYTES: list[object] = [
    5,
    0,
    -1,
    True,
    1.5,
    None,
    "text",
    [1, 2, 3],
    (1, 2),
    range(3),
    iter(b"ab"),
    {1: 2},
    {1},
    object(),
    2**70,
]


@pytest.mark.parametrize("value", NOT_BYTES, ids=lambda v: type(v).__name__ + "-" + repr(v)[:12])
def test_prealloc_writer_refuses_what_is_not_bytes_like(value: object, xfs: Path) -> None:
    with pytest.raises(TypeError):
        io.BytesIO().write(value)  # type: ignore[arg-type]
    with cowlink.PreallocWriter(xfs / "f", 16) as w:
        w.write(b"ok")
        with pytest.raises(TypeError, match="bytes-like object is required"):
            w.write(value)  # type: ignore[arg-type]
        assert w.tell() == 2
    assert (xfs / "f").read_bytes() == b"ok"


def test_prealloc_writer_takes_every_bytes_like(xfs: Path) -> None:
    values: list[object] = [
        b"bytes",
        bytearray(b"bytearray"),
        memoryview(b"view"),
        memoryview(b"a-b-c-d-")[::2],  # not contiguous
        array.array("i", [1, -2, 3]),
        array.array("d", [0.5]),
        mmap.mmap(-1, 7),
        b"",
    ]
    expected = b"".join(bytes(memoryview(v)) for v in values)  # type: ignore[arg-type]
    with cowlink.PreallocWriter(xfs / "f", len(expected)) as w:
        for v in values:
            assert w.write(v) == memoryview(v).nbytes  # type: ignore[arg-type]
    assert (xfs / "f").read_bytes() == expected


@pytest.mark.parametrize("mode", [0, 0o600, 0o644, 0o755, 0o1777, 0o4755, 0o7777])
def test_prealloc_writer_gives_the_mode(mode: int, xfs: Path) -> None:
    old = os.umask(0)
    try:
        with cowlink.PreallocWriter(xfs / "f", 1, mode=mode) as w:
            w.write(b"x")
    finally:
        os.umask(old)
    assert stat.S_IMODE(os.stat(xfs / "f").st_mode) == mode


@pytest.mark.parametrize("mode", [-1, 0o10000, 0o7777777, 2**32 + 0o644, 2**64, -(2**70)])
def test_prealloc_writer_refuses_a_mode_out_of_range(mode: int, xfs: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(oct(mode))):
        cowlink.PreallocWriter(xfs / "f", 1, mode=mode)
    assert os.listdir(xfs) == []


@pytest.mark.parametrize("bad", ["0o644", 1.0, b"\x01"])
def test_prealloc_writer_refuses_a_mode_not_an_int(bad: object, xfs: Path) -> None:
    with pytest.raises(TypeError, match="mode must be an int"):
        cowlink.PreallocWriter(xfs / "f", 1, mode=bad)  # type: ignore[arg-type]
    assert os.listdir(xfs) == []


@pytest.mark.parametrize("size", [-1, 2**63, 2**64 - 1, 2**64, -(2**70)])
def test_prealloc_writer_refuses_a_size_out_of_range(size: int, xfs: Path) -> None:
    with pytest.raises(ValueError, match=re.escape(str(size))):
        cowlink.PreallocWriter(xfs / "f", size)
    assert os.listdir(xfs) == []


def test_prealloc_writer_from_many_threads(xfs: Path) -> None:
    # Each write is applied whole: 4 threads write 64 distinct 4 KiB
    # blocks each, and the file holds every block once, none torn.
    threads, per, block = 4, 64, 4096
    blocks = {(t, i): data(block, t * 1000 + i) for t in range(threads) for i in range(per)}
    w = cowlink.PreallocWriter(xfs / "f", threads * per * block)
    start = threading.Barrier(threads)
    failures: list[BaseException] = []

    def work(t: int) -> None:
        try:
            start.wait()
            for i in range(per):
                assert w.write(blocks[(t, i)]) == block
                w.tell()
                assert not w.closed
                assert repr(w) == f"PreallocWriter({str(xfs / 'f')!r}, open)"
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(threads)]
    for p in pool:
        p.start()
    for p in pool:
        p.join()
    assert failures == []
    assert w.tell() == threads * per * block
    # Closed from a thread other than the one that opened it.
    closer = threading.Thread(target=w.close)
    closer.start()
    closer.join()
    assert w.closed
    content = (xfs / "f").read_bytes()
    got = sorted(content[i : i + block] for i in range(0, len(content), block))
    assert got == sorted(blocks.values())


def test_prealloc_writer_closed_by_another_thread_while_writing(xfs: Path) -> None:
    w = cowlink.PreallocWriter(xfs / "f", 1 << 20)
    errors: list[BaseException] = []
    written = 0
    started = threading.Event()

    def writer() -> None:
        nonlocal written
        try:
            while True:
                written += w.write(b"z" * 4096)
                started.set()
        except BaseException as e:  # noqa: BLE001 - checked below
            errors.append(e)
            started.set()

    t = threading.Thread(target=writer)
    t.start()
    started.wait(30)
    w.discard()
    t.join(30)
    assert not t.is_alive()
    assert len(errors) == 1 and type(errors[0]) is ValueError, errors
    assert "closed file" in str(errors[0])
    assert written > 0
    assert os.listdir(xfs) == []


def test_store_is_shared_with_threads_while_a_checkout_runs(xfs: Path) -> None:
    # While one thread is inside checkout (held there by its on_progress),
    # another uses the same Store for everything: the checkout is
    # certainly running when each of these calls is made.
    for i in range(300):
        write(xfs / "tree" / f"d{i % 7}" / f"f{i}", data(3000, i))
    write(xfs / "other" / "g", b"other tree")
    store = cowlink.Store(xfs / "store")
    added = store.add_tree(xfs / "tree")
    inside = threading.Event()
    finished = threading.Event()
    seen: dict[str, object] = {}
    failures: list[BaseException] = []

    def hold(p: cowlink.Progress) -> None:
        inside.set()
        assert finished.wait(60), "the other thread did not finish"

    def other() -> None:
        try:
            assert inside.wait(60)
            seen["path"] = store.path
            seen["repr"] = repr(store)
            seen["stats"] = store.stats().manifests
            seen["add"] = store.add(write(xfs / "lone", b"lone")).bytes
            seen["tree"] = store.add_tree(xfs / "other").files
            seen["out2"] = store.checkout(added.digest, xfs / "out2").files
            seen["verify"] = store.verify().clean
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)
        finally:
            finished.set()

    t = threading.Thread(target=other)
    t.start()
    r = store.checkout(added.digest, xfs / "out", on_progress=hold)
    t.join()
    assert failures == []
    assert seen == {
        "path": xfs / "store",
        "repr": f"Store({str(xfs / 'store')!r})",
        "stats": 1,
        "add": 4,
        "tree": 1,
        "out2": 300,
        "verify": True,
    }
    assert r.files == 300 and not r.errors
    for out in ("out", "out2"):
        for i in range(300):
            assert (xfs / out / f"d{i % 7}" / f"f{i}").read_bytes() == data(3000, i)


def test_store_threaded_stress(xfs: Path) -> None:
    # Six threads, each a random sequence of every Store call (gc too) on
    # one shared Store; every checkout must equal its tree.
    store = cowlink.Store(xfs / "store")
    trees = 6
    for t in range(trees):
        for i in range(40):
            write(xfs / f"src{t}" / f"f{i}", data(2000 + i, t * 100 + i % 13))
    failures: list[BaseException] = []
    start = threading.Barrier(trees)

    def work(t: int) -> None:
        rng = random.Random(t)
        try:
            start.wait()
            digest = store.add_tree(xfs / f"src{t}").digest
            for step in range(12):
                op = rng.choice(["checkout", "add", "stats", "verify", "path", "tree", "gc"])
                if op == "checkout":
                    out = xfs / f"out{t}-{step}"
                    store.checkout(digest, out, threads=rng.choice([None, 1, 2]))
                    for i in range(40):
                        got = (out / f"f{i}").read_bytes()
                        assert got == data(2000 + i, t * 100 + i % 13), out
                elif op == "add":
                    assert store.add(xfs / f"src{t}" / "f0").bytes == 2000
                elif op == "stats":
                    assert store.stats().manifests >= 1
                elif op == "verify":
                    assert store.verify(threads=1).clean
                elif op == "gc":
                    # Every manifest is kept, so nothing a checkout needs goes.
                    assert store.gc().manifests_removed == 0
                elif op == "path":
                    assert store.path == xfs / "store"
                    assert repr(store).startswith("Store(")
                else:
                    assert store.add_tree(xfs / f"src{t}").digest == digest
        except BaseException as e:  # noqa: BLE001 - reported below
            failures.append(e)

    pool = [threading.Thread(target=work, args=(t,)) for t in range(trees)]
    for p in pool:
        p.start()
    for p in pool:
        p.join()
    assert failures == []
    assert store.stats().manifests == trees
    assert store.verify().clean


def test_sigint_stops_a_verify_in_another_process(xfs: Path) -> None:
    # A store of 4096 sparse 256 MiB objects: 1 TiB to hash, minutes of
    # work on any machine, made in a moment. (Their names are not their digests, so each
    # object verify reads is quarantined: a count of how far it got.)
    objects = 4096
    store = cowlink.Store(xfs / "store")
    for i in range(objects):
        name = f"{i:064x}"
        d = xfs / "store" / "objects" / name[:2]
        d.mkdir(exist_ok=True)
        with open(d / name, "wb") as f:
            f.truncate(256 << 20)
    del store
    child = subprocess.Popen(
        [
            sys.executable,
            "-c",
            "import sys, cowlink\n"
            # A shell that started this run in the background may have set
            # SIGINT to "ignore", which Python then keeps: restore its handler.
            "import signal\n"
            "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
            "store = cowlink.Store(sys.argv[1])\n"
            "def started(p):\n"
            "    if p.phase == 'verify' and p.files_done:\n"
            "        print('started', flush=True)\n"
            "try:\n"
            "    store.verify(on_progress=started)\n"
            "    print('finished', flush=True)\n"
            "except KeyboardInterrupt:\n"
            "    print('interrupted', flush=True)\n",
            str(xfs / "store"),
        ],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert child.stdout is not None
    try:
        assert child.stdout.readline() == "started\n"
        child.send_signal(signal.SIGINT)
        out, err = child.communicate(timeout=30)
    finally:
        child.kill()
        child.wait()
    assert child.returncode == 0, err
    assert out.split() == ["interrupted"] or set(out.split()) == {"started", "interrupted"}, out
    done = len(os.listdir(xfs / "store" / "quarantine"))
    assert 0 < done < objects, done


def test_store_opened_again_must_be_the_same_directory(xfs: Path) -> None:
    # A call made while another runs opens the store again by its path; if
    # the directory there is no longer the one this Store opened, that call
    # fails with the path named, and the running one finishes in the old.
    write(xfs / "tree" / "f", b"content")
    store = cowlink.Store(xfs / "store")
    digest = store.add_tree(xfs / "tree").digest
    seen: list[BaseException] = []

    def swap(p: cowlink.Progress) -> None:
        if not seen:
            os.rename(xfs / "store", xfs / "moved")
            try:  # gone: refused, and no new store is made there
                store.stats()
            except OSError as e:
                seen.append(e)
            assert not (xfs / "store").exists()
            cowlink.Store(xfs / "store")
            try:  # another store in its place: refused
                store.stats()
            except OSError as e:
                seen.append(e)

    store.checkout(digest, xfs / "out", on_progress=swap)
    assert (xfs / "out" / "f").read_bytes() == b"content"
    assert len(seen) == 2, seen
    for e in seen:
        assert isinstance(e, cowlink.ContentChangedError), e
        assert e.filename == str(xfs / "store")
        assert "replaced" in str(e)


def test_usage_is_cancellable(xfs: Path) -> None:
    for i in range(50):
        write(xfs / "tree" / f"f{i}", data(5000, i))
    u = cowlink.usage([xfs / "tree"])
    assert u.files == 50 and u.apparent == 50 * 5000
    token = cowlink.CancelToken()
    token.cancel()
    with pytest.raises(cowlink.CancelledError):
        cowlink.usage([xfs / "tree"], cancel=token)

    def interrupt(p: cowlink.Progress) -> None:
        raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        cowlink.usage([xfs / "tree"], on_progress=interrupt)


def _plan_mutations(d: Path) -> list[tuple[str, Callable[[dict[str, Any]], None]]]:
    def group(p: dict[str, Any]) -> dict[str, Any]:
        g: dict[str, Any] = p["groups"][0]
        return g

    def set_(key: str, value: object) -> Callable[[dict[str, Any]], None]:
        return lambda p: group(p).__setitem__(key, value)

    def target(path: Path) -> Callable[[dict[str, Any]], None]:
        return lambda p: group(p).__setitem__("targets", [str(path)])

    return [
        ("size max", set_("size", 2**64 - 1)),
        ("size zero", set_("size", 0)),
        ("size small", set_("size", 5)),
        ("size negative", set_("size", -1)),
        ("size too big", set_("size", 2**64)),
        ("reclaimable max", set_("reclaimable", 2**64 - 1)),
        ("reclaimable over", set_("reclaimable", 3 << 20)),
        ("source missing", set_("source", str(d / "missing"))),
        ("source is a target", set_("source", str(d / "b"))),
        ("target is the source", target(d / "a")),
        ("target differs", target(d / "different")),
        ("target fifo", target(d / "fifo")),
        ("target dir", target(d)),
        ("target link", target(d / "link")),
        ("target missing", target(d / "missing")),
        ("target nul", lambda p: group(p).__setitem__("targets", ["a\u0000b"])),
        ("two groups", lambda p: p["groups"].append(dict(group(p)))),
        ("stamp not hex", set_("source_stamp", "zz")),
        ("stamp a number", set_("target_stamps", [5])),
        ("stamps removed", lambda p: [group(p).pop(k) for k in ("source_stamp", "target_stamps")]),
        ("target stamp of the source", lambda p: group(p).__setitem__("target_stamps", [group(p)["source_stamp"]])),
        ("groups not a list", lambda p: p.__setitem__("groups", {"a": 1})),
    ]


def test_dedupe_plan_from_hostile_json(xfs: Path) -> None:
    # Each mutation of a real plan is refused by from_json, or executed
    # without harm: no PanicException, and no file's bytes change.
    content = data(1 << 20, 3)
    for name in ("a", "b"):
        write(xfs / name, content)
    different = write(xfs / "different", data(1 << 20, 4))
    os.mkfifo(xfs / "fifo")
    os.symlink(xfs / "different", xfs / "link")
    good = json.loads(cowlink.dedupe.plan([xfs / "a", xfs / "b"]).to_json())
    assert len(good["groups"]) == 1
    outcomes: dict[str, str] = {}
    for name, mutate in _plan_mutations(xfs):
        p = json.loads(json.dumps(good))
        mutate(p)
        try:
            plan = cowlink.dedupe.Plan.from_json(json.dumps(p))
        except ValueError as e:
            assert "not a cowlink dedupe plan" in str(e)
            outcomes[name] = "refused"
            continue
        repr(plan)
        assert plan.reclaimable < 2**64
        report = cowlink.dedupe.execute(plan)
        outcomes[name] = f"deduped={report.targets_deduped}"
        for f in ("a", "b"):
            assert (xfs / f).read_bytes() == content, name
        assert different.read_bytes() == data(1 << 20, 4), name
    assert outcomes["size negative"] == outcomes["size too big"] == "refused"
    assert outcomes["reclaimable max"] == outcomes["reclaimable over"] == "refused"
    assert outcomes["groups not a list"] == "refused"
    assert outcomes["stamp not hex"] == outcomes["stamp a number"] == "refused"
    # A plan that does not say which files it named, or names another
    # file than the one at the path, shares nothing.
    for name in ("stamps removed", "target stamp of the source", "source is a target", "target is the source"):
        assert outcomes[name] == "deduped=0", (name, outcomes[name])
    for name in ("target differs", "target fifo", "target dir", "target link", "target missing"):
        assert outcomes[name] == "deduped=0", (name, outcomes[name])


def test_store_of_a_relative_path_survives_chdir(xfs: Path) -> None:
    write(xfs / "tree" / "f", b"content")
    old = os.getcwd()
    os.chdir(xfs)
    try:
        store = cowlink.Store("store")
        digest = store.add_tree("tree").digest
        os.chdir("/")
        assert store.path == xfs / "store"
        assert repr(store) == f"Store({str(xfs / 'store')!r})"
        seen: list[object] = []

        def other(p: cowlink.Progress) -> None:
            if not seen:  # a second store value, opened now
                seen.append(store.stats().manifests)

        store.checkout(digest, xfs / "out", on_progress=other)
    finally:
        os.chdir(old)
    assert seen == [1]
    assert (xfs / "out" / "f").read_bytes() == b"content"


def test_prealloc_writer_dropped_unclosed_leaves_nothing(xfs: Path) -> None:
    w = cowlink.PreallocWriter(xfs / "f", 1 << 20)
    w.write(b"x" * 4096)
    del w
    gc.collect()
    assert os.listdir(xfs) == []

    def in_a_thread() -> None:
        t = cowlink.PreallocWriter(xfs / "g", 10)
        t.write(b"y")

    th = threading.Thread(target=in_a_thread)
    th.start()
    th.join()
    gc.collect()
    assert os.listdir(xfs) == []
