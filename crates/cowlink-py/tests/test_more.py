"""dedupe, the store and PreallocWriter on real filesystems."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

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
    # From the extent maps, exactly; and measured here.
    assert report.bytes_reclaimed == 32 << 20 and not report.measured
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
