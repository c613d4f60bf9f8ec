"""Find identical files and make them share their blocks.

In two steps, to look at the plan (as ``cowlink dedupe --dry-run``) or
keep it before anything changes::

    plan = cowlink.dedupe.plan(["/data"], min_size=64 * 1024)
    print(plan.reclaimable)
    open("plan.json", "w").write(plan.to_json())     # inspect, keep, edit
    report = cowlink.dedupe.execute(cowlink.dedupe.Plan.from_json(text))

Or in one, as ``cowlink dedupe`` does, with the small files' groups
deduplicated while the larger files are still being hashed::

    plan, report = cowlink.dedupe.run(["/data"])

The kernel compares the bytes itself (FIDEDUPERANGE), so a file changed
since the plan is left alone and listed in ``report.changed``; so is a
path that names another file by then (a hard link or a copy put in its
place: the plan records each file's device, inode, size and times).

The options are those of ``cowlink dedupe``: ``exclude`` (``--exclude``
patterns), ``index`` (the persistent index, on by default where the
command keeps it; a directory, or False for none), ``stores``
(``--store``). A rerun with the index reads only new and changed files::

    plan, report = cowlink.dedupe.run(["/srv"], exclude=["*.tmp", ".git"])
    print(plan.index.unchanged, "files not read again")

A file the index says shares every block is mapped again (one FIEMAP,
nothing read) one time in sixteen by default (``recheck_layouts="sample"``),
since another tool can move extents and keep the times;
``recheck_layouts="every"`` maps all of them, as ``cowlink dedupe
--recheck-layouts``, and ``"never"`` trusts the index::

    plan, report = cowlink.dedupe.run(["/srv"], recheck_layouts="every")

And ``watch`` keeps going as files change (root), as ``cowlink dedupe
--watch``, until its CancelToken is cancelled or Ctrl-C::

    token = cowlink.CancelToken()
    summary = cowlink.dedupe.watch(
        ["/srv/builds"], cancel=token, on_batch=lambda b: print(b.report)
    )
"""

from ._cowlink import (
    DedupeReport,
    Group,
    IndexReport,
    Plan,
    SkippedTarget,
    WatchBatch,
    WatchScope,
    WatchSummary,
)
from ._cowlink import execute as execute
from ._cowlink import plan as plan
from ._cowlink import run as run
from ._cowlink import watch as watch

__all__ = [
    "DedupeReport",
    "Group",
    "IndexReport",
    "Plan",
    "SkippedTarget",
    "WatchBatch",
    "WatchScope",
    "WatchSummary",
    "execute",
    "plan",
    "run",
    "watch",
]
