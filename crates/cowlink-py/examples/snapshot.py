"""Snapshot a build directory into a store, check it out as clones, and
show what sharing saved. Run: python snapshot.py BUILD_DIR WORK_DIR
(WORK_DIR on XFS or Btrfs for clones; elsewhere copies, and it says so).

Also the package's typing check: `mypy --strict` passes on this file."""

from __future__ import annotations

import sys
from pathlib import Path

import cowlink


def human(n: int) -> str:
    size = float(n)
    for unit in ("B", "KiB", "MiB", "GiB"):
        if size < 1024 or unit == "GiB":
            return f"{size:.1f} {unit}"
        size /= 1024
    return f"{size:.1f} GiB"


def main(build: Path, work: Path) -> int:
    support = cowlink.probe.between(build, work)
    if not support.reflink:
        print(f"note: no clones here ({support.reflink.reason}); files will be copied")

    def progress(p: cowlink.Progress) -> None:
        print(f"\r{p.phase}: {p.files_done} files", end="", file=sys.stderr)

    store = cowlink.Store(work / "store")
    added = store.add_tree(build, on_progress=progress)
    print(f"\nstored {added.files} files ({human(added.bytes)}) as {added.digest[:12]}")
    try:
        report = store.checkout(added.digest, work / "checkout", link="auto", on_progress=progress)
    except FileExistsError as e:
        print(f"\n{e.filename} exists: remove it first", file=sys.stderr)
        return 1
    print(f"\nchecked out {report.files} files: {report.cloned} cloned, {report.copied} copied")
    for err in report.errors:
        print(f"error: {err}", file=sys.stderr)
    u = cowlink.usage([work / "store", work / "checkout"])
    if u.saved is not None:
        print(f"{human(u.apparent)} of files take {human(u.on_disk or 0)}: sharing saves {human(u.saved)}")
    return 0 if not report.errors else 1


if __name__ == "__main__":
    if len(sys.argv) != 3:
        print(__doc__, file=sys.stderr)
        sys.exit(2)
    sys.exit(main(Path(sys.argv[1]), Path(sys.argv[2])))
