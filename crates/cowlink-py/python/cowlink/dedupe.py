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
since the plan is left alone and listed in ``report.changed``.
"""

from ._cowlink import DedupeReport, Group, Plan, SkippedTarget
from ._cowlink import execute as execute
from ._cowlink import plan as plan
from ._cowlink import run as run

__all__ = ["DedupeReport", "Group", "Plan", "SkippedTarget", "execute", "plan", "run"]
