"""What a filesystem can do: clone, dedupe, and with which limits.

Each answer is a real trial (a clone of a scratch file), never a guess from
the filesystem's name, and says why when it is no::

    s = cowlink.probe.between("src/file", "/mnt/dst")
    if not s.reflink:
        print(s.reflink.reason)
"""

from ._cowlink import Answer, FsFacts, MountSupport, Support
from ._cowlink import probe_between as between
from ._cowlink import probe_filesystem as filesystem
from ._cowlink import probe_tree as tree

__all__ = ["Answer", "FsFacts", "MountSupport", "Support", "between", "filesystem", "tree"]
