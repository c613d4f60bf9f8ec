"""Find identical files and make them share their blocks.

Two steps, as ``cowlink dedupe --plan`` and ``--apply``::

    plan = cowlink.dedupe.plan(["/data"], min_size=64 * 1024)
    print(plan.reclaimable)
    open("plan.json", "w").write(plan.to_json())     # inspect, keep, edit
    report = cowlink.dedupe.execute(cowlink.dedupe.Plan.from_json(text))

The kernel compares the bytes itself (FIDEDUPERANGE), so a file changed
since the plan is left alone and listed in ``report.changed``.
"""

from ._cowlink import DedupeReport, Group, Plan
from ._cowlink import execute as execute
from ._cowlink import plan as plan

__all__ = ["DedupeReport", "Group", "Plan", "execute", "plan"]
