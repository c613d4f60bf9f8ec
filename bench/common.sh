# Shared by the bench/ scripts (sourced, not run): test filesystems, the
# real trees every benchmark leads with, the bare-syscall floor, and the
# medians table.
set -euo pipefail
cd "$(dirname "${BASH_SOURCE[0]}")/.."
export PATH="$PATH:/usr/sbin:/sbin:$HOME/.cargo/bin"
cargo build --release --locked -q -p cowlink-cli
export BIN=$PWD/target/release/cowlink
export FLOOR=$PWD/target/floor
cc -O2 -pthread -o "$FLOOR" bench/floor.c
export DEDUPE_FLOOR=$PWD/target/dedupe-floor
cc -O2 -pthread -o "$DEDUPE_FLOOR" bench/dedupe-floor.c
if [ -z "$(scripts/testfs env)" ]; then
    trap 'scripts/testfs down' EXIT
    scripts/testfs up >/dev/null
fi
eval "$(scripts/testfs env)"

# Peers a user would pick instead, installed when missing.
need_peers() {
    command -v xcp >/dev/null || cargo install --locked -q xcp
    if [ "${1:-}" = dedupe ]; then
        command -v fclones >/dev/null || cargo install --locked -q fclones
        command -v jdupes >/dev/null && command -v duperemove >/dev/null ||
            apt-get install -y -qq jdupes duperemove >/dev/null
    fi
}

# Raw results: every published run keeps hyperfine's JSON under
# bench/runs/DATE-MACHINE/ (BENCH_MACHINE names the machine; default: its
# core count and kernel), so a table in docs/benchmarks.md can be checked
# against the measurements it came from. save_raw NAME FILE copies one.
RUNS_DIR=$PWD/bench/runs/$(date -u +%F)-${BENCH_MACHINE:-$(nproc)core-$(uname -r | cut -d- -f1)}
export RUNS_DIR
save_raw() {
    mkdir -p "$RUNS_DIR"
    # A second run of a day keeps the first's results: NAME-2.json, ...
    local to=$RUNS_DIR/$1.json n=2
    while [ -e "$to" ]; do
        to=$RUNS_DIR/$1-$n.json
        n=$((n + 1))
    done
    cp "$2" "$to"
}

header() {
    echo "kernel $(uname -r); $(nproc) cores; xfs: mkfs.xfs -m reflink=1 (16 GiB loop image);" \
         "btrfs: mkfs.btrfs defaults (16 GiB); ext4: mkfs.ext4 defaults (14 GiB); $(date -u +%F)"
}

# fill_once MOUNTPOINT: write the filesystem's free space with zeros once
# and free it again, so that the host has allocated every block of the
# sparse loop image under it. Until then, a run that writes into regions
# of the image never written before waits for the host's allocation: on a
# fresh 14 GiB ext4 image, `cowlink cp -a` of /usr took 12.0 and 12.8 s in
# its first two runs and 7.2-8.3 s in the next three, then 6.2-6.7 s over
# five more runs once the image was fully allocated (2026-11-24). That
# penalty fell on whichever command ran first. A mark file keeps it to
# once per image.
fill_once() {
    local m=$1
    [ -e "$m/.bench-filled" ] && return 0
    echo "bench: writing $m's free space once (see fill_once in bench/common.sh)" >&2
    dd if=/dev/zero of="$m/.bench-fill" bs=4M status=none 2>/dev/null || true
    sync
    rm -f "$m/.bench-fill"
    sync
    touch "$m/.bench-filled"
}

# real_project: a real project with its build output, made once in
# target/bench-project: this repository at HEAD (git archive) after a
# debug `cargo build -p cowlink-cli` into its own target directory
# (sources, Cargo's deps/, build/, incremental/ and the binary: about
# 3,000 files, 1.3 GB, three quarters of the files under 64 KiB). Prints
# its path; copy it into a test filesystem with real_tree.
real_project() {
    local dir=$PWD/target/bench-project
    if [ ! -e "$dir.done" ]; then
        rm -rf "$dir"
        mkdir -p "$dir"
        git archive HEAD | tar -x -C "$dir"
        (cd "$dir" && CARGO_TARGET_DIR="$dir/target" cargo build --locked --offline -q -p cowlink-cli)
        touch "$dir.done"
    fi
    echo "$dir"
}

# real_tree SRC DIR: a real tree (e.g. /usr) copied into DIR on a test
# filesystem with cp -a (physical copies, no sharing), once per mount; and
# DIR.list, the floor loop's list of it.
real_tree() {
    local src=$1 dir=$2
    if [ ! -e "$dir.done" ]; then
        rm -rf "$dir" "$dir.list"
        mkdir -p "$(dirname "$dir")"
        cp -a --reflink=never "$src" "$dir"
        (cd "$dir" && find . -printf '%y %P\0%l\0') >"$dir.list"
        sync
        touch "$dir.done"
    fi
    echo "$(find "$dir" -type f | wc -l) files, $(find "$dir" -type d | wc -l) dirs," \
         "$(find "$dir" -type l | wc -l) symlinks, $(du -sh --apparent-size "$dir" | cut -f1)"
}

# medians RESULT.json ROOT [REF]: a markdown table of medians, each with its
# ratio to command number REF (0-based, default 1); for bench/interleave's
# runs, also the median of the ratios within each round.
medians() {
    python3 - "$@" <<'PY'
import json, statistics, sys
results = json.load(open(sys.argv[1]))["results"]
root, ref = sys.argv[2], int(sys.argv[3]) if len(sys.argv) > 3 else 1
med = [statistics.median(r["times"]) * 1000 for r in results]
import os
def name(r):
    c = r["command"].replace(os.environ["BIN"], "cowlink").replace(os.environ["FLOOR"], "floor")
    return c.replace(root, "T").replace("'", "")
# Runs from bench/interleave: the median of the ratios within each round
# too (runs seconds apart, whatever the machine did between rounds).
paired = json.load(open(sys.argv[1])).get("interleaved", False)
extra = " paired median ratio |" if paired else ""
print("| command | median ms | min ms | max ms | vs `%s` |%s" % (name(results[ref]), extra))
print("|---|---:|---:|---:|---:|" + ("---:|" if paired else ""))
for r, m in zip(results, med):
    row = f"| `{name(r)}` | {m:.0f} | {r['min']*1000:.0f} | {r['max']*1000:.0f} | {m / med[ref]:.2f}× |"
    if paired:
        ratios = [a / b for a, b in zip(r["times"], results[ref]["times"])]
        row += f" {statistics.median(ratios):.2f}× |"
    print(row)
PY
}
