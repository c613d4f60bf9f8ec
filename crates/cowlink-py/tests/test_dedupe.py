"""cowlink.dedupe's options as the command has them (exclude, index,
watch), and a plan that meets other files than it planned, on real
filesystems."""

from __future__ import annotations

import os
import signal
import subprocess
import threading
from pathlib import Path

import pytest
from conftest import data, write

import cowlink


def runs(path: Path) -> list[tuple[int, int]]:
    """The disk runs of `path` (FIEMAP): where its bytes are."""
    return [(e.physical, e.length) for e in cowlink.extents(path).extents]


def test_dedupe_exclude_leaves_matching_paths_alone(cow: Path) -> None:
    content = data(256 << 10, 1)
    tree = cow / "tree"
    for rel in ("keep/a", "keep/b", "keep/skip.tmp", ".git/x", "build/out/y", "deep/build/out/z"):
        write(tree / rel, content)
    excluded = [tree / "keep/skip.tmp", tree / ".git/x", tree / "build/out/y"]
    plan = cowlink.dedupe.plan([tree], exclude=["*.tmp", ".git", "build/out"], index=False)
    # `build/out` is anchored at the path given: deep/build/out/z is in.
    assert [(g.source, g.targets) for g in plan.groups] == [
        (tree / "deep/build/out/z", [tree / "keep/a", tree / "keep/b"])
    ]
    plan, report = cowlink.dedupe.run([tree], exclude=["*.tmp", ".git", "build/out"], index=False)
    assert report.targets_deduped == 2 and not report.errors and not report.changed
    assert cowlink.extents(tree / "keep/a").shared_bytes == len(content)
    for f in excluded:
        assert cowlink.extents(f).shared_bytes == 0, f
        assert f.read_bytes() == content
    # Without the patterns they are found too.
    plan = cowlink.dedupe.plan([tree], index=False)
    assert sorted(t for g in plan.groups for t in g.targets) == sorted(excluded)

    with pytest.raises(ValueError, match=r"exclude pattern \"\[\""):
        cowlink.dedupe.plan([tree], exclude=["["])
    with pytest.raises(ValueError, match="empty"):
        cowlink.dedupe.run([tree], exclude=[""])
    with pytest.raises(TypeError):
        cowlink.dedupe.plan([tree], exclude="*.tmp")  # a str is not a list of patterns


def test_dedupe_index_makes_a_rerun_read_only_what_changed(
    xfs: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    # Same size, different bytes: without an index every one is read.
    size = 64 << 10
    files = [write(xfs / "t" / f"f{i:02}", data(size, 100 + i)) for i in range(12)]
    ix = tmp_path / "ix"
    first = cowlink.dedupe.plan([xfs / "t"], index=ix)
    # Each file's two 4 KiB ends: they differ, so nothing more is read.
    assert first.bytes_hashed == 12 * 8192 and not first.groups
    assert first.index is not None and first.index.written >= 12 and not first.index.notes
    assert len(first.index.files) == 1 and first.index.files[0].parent == ix
    assert first.index.files[0].is_file()

    again = cowlink.dedupe.plan([xfs / "t"], index=str(ix))
    assert again.bytes_hashed == 0
    assert again.index is not None and again.index.unchanged == 12
    assert again.index.corrected == 0
    # A new duplicate of one file: only it is read, and the pair is found
    # against the indexed file.
    write(xfs / "t" / "dup", files[3].read_bytes())
    plan, report = cowlink.dedupe.run([xfs / "t"], index=ix)
    assert plan.index is not None and plan.index.unchanged == 12
    assert 0 < plan.bytes_hashed <= 2 * size
    assert [(g.source, g.targets) for g in plan.groups] == [(xfs / "t" / "dup", [files[3]])]
    assert report.targets_deduped == 1
    assert cowlink.extents(files[3]).shared_bytes == size
    # A file gone is pruned from the index.
    files[0].unlink()
    plan = cowlink.dedupe.plan([xfs / "t"], index=ix)
    assert plan.index is not None and plan.index.pruned == 1 and plan.bytes_hashed == 0

    # No index: False and None both read everything again and keep nothing.
    for off in (False, None):
        plain = cowlink.dedupe.plan([xfs / "t"], index=off)
        assert plain.index is None and plain.bytes_hashed >= 10 * 8192
    # The default is the command's place: COWLINK_INDEX_DIR here.
    home = tmp_path / "default"
    monkeypatch.setenv("COWLINK_INDEX_DIR", str(home))
    plan = cowlink.dedupe.plan([xfs / "t"])
    assert plan.index is not None and [f.parent for f in plan.index.files] == [home]
    plan = cowlink.dedupe.plan([xfs / "t"], index=True)
    assert plan.index is not None and plan.index.unchanged >= 11 and plan.bytes_hashed == 0
    with pytest.raises(TypeError):
        cowlink.dedupe.plan([xfs / "t"], index=3)  # type: ignore[arg-type]


def test_dedupe_recheck_layouts_finds_a_layout_moved_behind_the_index(xfs: Path, tmp_path: Path) -> None:
    # a and c share their blocks, and the index says so; then another
    # tool's dedupe (xfs_io, which keeps the times) moves c onto d's
    # blocks, outside the tree: a and c hold the same bytes on two sets
    # of blocks, and only mapping c again tells.
    ix = tmp_path / "ix"
    content = data(300_000, 21)
    a, c = write(xfs / "t" / "a", content), write(xfs / "t" / "c", content)
    d = write(xfs / "other" / "d", content)
    os.sync()
    for _ in range(2):
        plan, report = cowlink.dedupe.run([xfs / "t"], index=ix, recheck_layouts="every")
        assert not plan.errors and not report.errors
    assert runs(a) == runs(c)
    before = c.stat()
    subprocess.run(["xfs_io", "-c", f"dedupe {d} 0 0 {len(content)}", str(c)], check=True)
    os.sync()
    after = c.stat()
    assert (before.st_mtime_ns, before.st_ctime_ns) == (after.st_mtime_ns, after.st_ctime_ns)
    assert runs(a) != runs(c) and runs(c) == runs(d)

    # Trusted, the index claims them shared: nothing to do, every time.
    for _ in range(3):
        plan = cowlink.dedupe.plan([xfs / "t"], index=ix, recheck_layouts="never")
        assert plan.groups == []
        assert plan.index is not None and plan.index.unchanged == 2
    # Mapped again: one group, and the run shares a and c again.
    plan = cowlink.dedupe.plan([xfs / "t"], index=ix, recheck_layouts="every")
    assert [(g.source, g.targets) for g in plan.groups] in ([(a, [c])], [(c, [a])])
    plan, report = cowlink.dedupe.run([xfs / "t"], index=ix, recheck_layouts="every")
    assert report.targets_deduped == 1 and not report.errors and not report.changed
    assert runs(a) == runs(c)
    assert a.read_bytes() == content and c.read_bytes() == content
    with pytest.raises(ValueError, match="recheck_layouts must be one of"):
        cowlink.dedupe.plan([xfs / "t"], index=ix, recheck_layouts="Every")  # type: ignore[arg-type]


@pytest.mark.parametrize("index", [False, True])
def test_dedupe_counts_a_reflinked_copy_as_already_shared(cow: Path, tmp_path: Path, index: bool) -> None:
    # Sizes collide (several files per size, none equal to another): each
    # file of b shares all its blocks with its twin in a, small and larger.
    a = cow / "a"
    for i in range(6):
        write(a / f"s{i}", data(6000, i))
        write(a / f"l{i}", data(200_000, 100 + i))
    subprocess.run(["cp", "-a", "--reflink=always", str(a), str(cow / "b")], check=True)
    ix: Path | bool = tmp_path / "ix" if index else False
    for _ in range(2):
        plan, report = cowlink.dedupe.run([a, cow / "b"], index=ix)
        assert plan.files_already_shared == 12 and plan.groups == []
        assert report.targets_deduped == 0 and not report.errors
        assert (plan.hardlinks_skipped, plan.inline_skipped, plan.not_permitted) == (0, 0, 0)


def test_a_target_swapped_after_the_plan_is_left_alone(cow: Path) -> None:
    content = data(1 << 20, 7)
    for n in ("a", "b", "c"):
        write(cow / "t" / n, content)
    outside = write(cow / "outside", content)
    plan = cowlink.dedupe.plan([cow / "t"], index=False)
    assert [(g.source, g.targets) for g in plan.groups] == [(cow / "t" / "a", [cow / "t" / "b", cow / "t" / "c"])]
    # b becomes a hard link to a file outside the plan, with the same bytes.
    os.link(outside, cow / "t" / "tmp")
    os.replace(cow / "t" / "tmp", cow / "t" / "b")
    before = runs(outside)
    report = cowlink.dedupe.execute(cowlink.dedupe.Plan.from_json(plan.to_json()))
    assert report.changed == [cow / "t" / "b"] and not report.errors
    assert report.targets_deduped == 1
    assert runs(outside) == before and outside.read_bytes() == content
    assert cowlink.extents(outside).shared_bytes == 0
    assert cowlink.extents(cow / "t" / "c").shared_bytes == len(content)


def test_dedupe_watch_shares_a_new_duplicate_and_stops_when_cancelled(xfs: Path, tmp_path: Path) -> None:
    content = data(1 << 20, 20)
    for n in ("a", "b"):
        write(xfs / "w" / n, content)
    token = cowlink.CancelToken()
    scopes: list[cowlink.dedupe.WatchScope] = []
    batches: list[cowlink.dedupe.WatchBatch] = []

    def on_batch(b: cowlink.dedupe.WatchBatch) -> None:
        batches.append(b)
        if len(batches) == 1:
            # Written by another process (the watch drops its own events),
            # after the first run: a new duplicate, not a clone.
            subprocess.run(["cp", "--reflink=never", str(xfs / "w" / "a"), str(xfs / "w" / "c")], check=True)
        elif b.report is not None and b.report.targets_deduped:
            token.cancel()

    # Bounds the test if the change is never seen; then the asserts fail.
    guard = threading.Timer(60, token.cancel)
    guard.start()
    try:
        summary = cowlink.dedupe.watch(
            [xfs / "w"],
            index=tmp_path / "ix",
            quiet_period=0.2,
            cancel=token,
            on_start=scopes.extend,
            on_batch=on_batch,
        )
    finally:
        guard.cancel()
    assert [(s.root, s.mark, s.note) for s in scopes] == [(xfs / "w", "filesystem", None)]
    first, last = batches[0], batches[-1]
    assert first.rescan == "start" and first.roots == [xfs / "w"] and first.error is None
    assert first.report is not None and first.report.targets_deduped == 1
    assert last.rescan is None and last.changed >= 1, batches
    assert last.report is not None and last.report.targets_deduped == 1, batches
    assert last.plan is not None and last.plan.index is not None
    assert last.plan.index.unchanged == 2, "a and b were not read again"
    assert summary.batches == len(batches) and summary.rescans == 1
    assert summary.targets_deduped == 2 and summary.errors == 0
    assert summary.bytes_reclaimed >= (2 << 20) * 9 // 10
    for n in ("a", "b", "c"):
        assert (xfs / "w" / n).read_bytes() == content
        assert cowlink.extents(xfs / "w" / n).shared_bytes == len(content)
    assert runs(xfs / "w" / "c") == runs(xfs / "w" / "a")


def test_dedupe_watch_stops_on_ctrl_c_and_on_a_callback_error(xfs: Path, tmp_path: Path) -> None:
    content = data(1 << 20, 21)
    for n in ("a", "b"):
        write(xfs / "w" / n, content)
    seen: list[cowlink.dedupe.WatchBatch] = []

    def interrupt(b: cowlink.dedupe.WatchBatch) -> None:
        seen.append(b)
        os.kill(os.getpid(), signal.SIGINT)

    # Ctrl-C: the watch stops, then KeyboardInterrupt is raised, as from
    # every long call. The batch that ran is whole.
    with pytest.raises(KeyboardInterrupt):
        cowlink.dedupe.watch([xfs / "w"], index=tmp_path / "ix", on_batch=interrupt)
    assert len(seen) == 1 and seen[0].report is not None and seen[0].report.targets_deduped == 1
    assert cowlink.extents(xfs / "w" / "b").shared_bytes == len(content)

    def fail(b: cowlink.dedupe.WatchBatch) -> None:
        raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        cowlink.dedupe.watch([xfs / "w"], index=tmp_path / "ix", on_batch=fail)
    for n in ("a", "b"):
        assert (xfs / "w" / n).read_bytes() == content

    # A token cancelled before the start: the watch sets up and returns.
    token = cowlink.CancelToken()
    token.cancel()
    summary = cowlink.dedupe.watch([xfs / "w"], index=False, cancel=token)
    assert summary.batches == 0 and summary.errors == 0


def test_dedupe_watch_refuses_bad_arguments(xfs: Path) -> None:
    # Cancelled already: a call that wrongly started would return at once
    # (and fail the test) rather than watch for ever.
    stop = cowlink.CancelToken()
    stop.cancel()
    for bad in (-1.0, float("nan"), float("inf"), 86401.0):
        with pytest.raises(ValueError, match="quiet_period"):
            cowlink.dedupe.watch([xfs], quiet_period=bad, cancel=stop)
    with pytest.raises(ValueError, match="max_delay"):
        cowlink.dedupe.watch([xfs], max_delay=-5, cancel=stop)
    with pytest.raises(TypeError, match="on_batch must be callable"):
        cowlink.dedupe.watch([xfs], on_batch=5, cancel=stop)  # type: ignore[arg-type]
    with pytest.raises(ValueError, match="exclude pattern"):
        cowlink.dedupe.watch([xfs], exclude=["a{b"], cancel=stop)
    with pytest.raises(ValueError, match="recheck_layouts must be one of"):
        cowlink.dedupe.watch([xfs], recheck_layouts="always", cancel=stop)  # type: ignore[arg-type]
    with pytest.raises(FileNotFoundError):
        cowlink.dedupe.watch([xfs / "missing"], cancel=stop)
