"""cowlink: copy-on-write file cloning for Linux.

On XFS, Btrfs, bcachefs and OpenZFS >= 2.2 a file can be cloned in constant
time: both names share the same blocks until one is written. This package
clones files, ranges and whole trees, falls back to the fastest correct copy
where cloning cannot work, and always says which happened::

    import cowlink

    out = cowlink.clone_file("big.img", "copy.img")
    print(out.method, out.bytes)          # "reflink" 10737418240

    report = cowlink.copytree("src", "dst")   # cp -a, in parallel
    print(report.cloned, report.copied)

    if not cowlink.probe.between("big.img", "/mnt/other").reflink:
        ...

Errors are OSError subclasses with errno, filename and filename2 set:
the built-in ones (FileNotFoundError, FileExistsError, PermissionError, ...)
and cowlink's own (NotSupportedError, CrossDeviceError, UnalignedError,
LinkLimitError, ContentChangedError, ...). Long operations release the GIL,
and Ctrl-C during them cancels cleanly and raises KeyboardInterrupt.

Paths may be str, bytes or os.PathLike; paths in results are pathlib.Path
(names that are not UTF-8 come back with surrogate escapes, as os gives
them: os.fsencode() returns the original bytes).
"""

from . import dedupe, probe
from ._cowlink import (
    Added,
    AddedTree,
    Answer,
    Begun,
    CancelledError,
    CancelToken,
    CheckoutReport,
    ContentChangedError,
    Corrupt,
    CorruptError,
    CrossDeviceError,
    Extent,
    FileLayout,
    FsFacts,
    GcReport,
    Hole,
    InUseError,
    LinkLimitError,
    MountSupport,
    NotRegularFileError,
    NotSupportedError,
    Outcome,
    PreallocWriter,
    Progress,
    PruneReport,
    SameFileError,
    Snapshot,
    SnapshotSet,
    SnapshotSyncReport,
    Store,
    StoreStats,
    Support,
    SyncReport,
    TreeError,
    TreeReport,
    UnalignedError,
    Usage,
    Verdict,
    VerifyReport,
    __version__,
    clone_file,
    clone_range,
    copy,
    copytree,
    extents,
    sync,
    sync_snapshot,
    usage,
)

__all__ = [
    "Added",
    "AddedTree",
    "Answer",
    "Begun",
    "CancelToken",
    "CancelledError",
    "CheckoutReport",
    "ContentChangedError",
    "Corrupt",
    "CorruptError",
    "CrossDeviceError",
    "Extent",
    "FileLayout",
    "FsFacts",
    "GcReport",
    "Hole",
    "InUseError",
    "LinkLimitError",
    "MountSupport",
    "NotRegularFileError",
    "NotSupportedError",
    "Outcome",
    "PreallocWriter",
    "Progress",
    "PruneReport",
    "SameFileError",
    "Snapshot",
    "SnapshotSet",
    "SnapshotSyncReport",
    "Store",
    "StoreStats",
    "Support",
    "SyncReport",
    "TreeError",
    "TreeReport",
    "UnalignedError",
    "Usage",
    "Verdict",
    "VerifyReport",
    "__version__",
    "clone_file",
    "clone_range",
    "copy",
    "copytree",
    "dedupe",
    "extents",
    "probe",
    "sync",
    "sync_snapshot",
    "usage",
]
