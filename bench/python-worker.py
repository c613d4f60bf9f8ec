"""One measured run of bench/python: python python-worker.py MODE SRC DST.

Per-call modes clone each file named in the list SRC (one path per line)
to DST/<n>; tree modes copy the directory SRC to DST."""

import fcntl
import os
import shutil
import sys

FICLONE = 0x40049409


def ficlone(src: str, dst: str) -> None:
    """The bare syscall sequence: open, create, FICLONE, close."""
    s = os.open(src, os.O_RDONLY | os.O_CLOEXEC)
    try:
        d = os.open(dst, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, 0o644)
        try:
            fcntl.ioctl(d, FICLONE, s)
        finally:
            os.close(d)
    finally:
        os.close(s)


def ficlone_copy2(src: str, dst: str) -> str:
    """shutil's copy_function with FICLONE for the data, as copy2 keeps
    metadata."""
    ficlone(src, dst)
    shutil.copystat(src, dst, follow_symlinks=False)
    return dst


def main() -> None:
    mode, src, dst = sys.argv[1:4]
    if mode.startswith("call-"):
        files = open(src).read().split("\n")[:-1]
        os.mkdir(dst)
        if mode == "call-cowlink":
            import cowlink

            clone = lambda s, d: cowlink.clone_file(s, d, reflink="always")  # noqa: E731
        elif mode == "call-cowlink-direct":
            import cowlink

            clone = lambda s, d: cowlink.clone_file(s, d, reflink="always", atomic=False)  # noqa: E731
        elif mode == "call-ioctl":
            clone = ficlone
        elif mode == "call-reflink-copy":
            import reflink_copy

            clone = reflink_copy.reflink
        elif mode == "call-reflink":
            import reflink

            clone = reflink.reflink
        else:
            sys.exit(f"unknown mode {mode}")
        for i, f in enumerate(files):
            clone(f, f"{dst}/{i}")
    elif mode == "tree-cowlink":
        import cowlink

        cowlink.copytree(src, dst)
    elif mode == "tree-shutil":
        shutil.copytree(src, dst, symlinks=True)
    elif mode == "tree-shutil-ficlone":
        shutil.copytree(src, dst, symlinks=True, copy_function=ficlone_copy2)
    else:
        sys.exit(f"unknown mode {mode}")


main()
