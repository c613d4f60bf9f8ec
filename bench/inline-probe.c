/*
 * How a small file's Btrfs layout is learnt, two ways, over the same files:
 * what `cowlink dedupe` does per small file in its walk.
 *
 *   cc -O2 -o inline-probe bench/inline-probe.c
 *   inline-probe s|f|t DIR < LIST
 *
 * LIST holds absolute paths, one per line (`find DIR -type f -size -8193c`).
 * Every mode first lstat()s each path; then
 *   s: nothing more (the cost of the stat alone);
 *   f: open, FS_IOC_FIEMAP (8 extents), close; inline if the first extent
 *      is flagged DATA_INLINE;
 *   t: one BTRFS_IOC_TREE_SEARCH (root only) on DIR's descriptor for the
 *      inode's first EXTENT_DATA item; inline if its type is 0.
 * Prints the files seen, how many were inline, and the seconds taken.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/btrfs.h>
#include <linux/btrfs_tree.h>
#include <linux/fiemap.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

static double now(void) {
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return t.tv_sec + t.tv_nsec / 1e9;
}

int main(int argc, char **argv) {
    if (argc != 3 || !strchr("sft", argv[1][0])) {
        fprintf(stderr, "usage: inline-probe s|f|t DIR < LIST\n");
        return 2;
    }
    char mode = argv[1][0];
    size_t cap = 1024, n = 0;
    char **paths = malloc(cap * sizeof *paths);
    char *line = NULL;
    size_t len = 0;
    ssize_t got;
    while ((got = getline(&line, &len, stdin)) > 0) {
        if (line[got - 1] == '\n') line[got - 1] = 0;
        if (n == cap) paths = realloc(paths, (cap *= 2) * sizeof *paths);
        paths[n++] = strdup(line);
    }
    int dir = open(argv[2], O_RDONLY | O_DIRECTORY);
    if (dir < 0) { perror(argv[2]); return 1; }
    long seen = 0, inl = 0;
    double t0 = now();
    for (size_t i = 0; i < n; i++) {
        struct stat st;
        if (lstat(paths[i], &st)) continue;
        seen++;
        if (mode == 'f') {
            int fd = open(paths[i], O_RDONLY | O_NOFOLLOW | O_NOATIME);
            if (fd < 0) continue;
            struct { struct fiemap f; struct fiemap_extent e[8]; } fm;
            memset(&fm, 0, sizeof fm);
            fm.f.fm_length = ~0ULL;
            fm.f.fm_extent_count = 8;
            if (ioctl(fd, FS_IOC_FIEMAP, &fm) == 0 && fm.f.fm_mapped_extents &&
                (fm.e[0].fe_flags & FIEMAP_EXTENT_DATA_INLINE))
                inl++;
            close(fd);
        } else if (mode == 't') {
            struct btrfs_ioctl_search_args a;
            memset(&a.key, 0, sizeof a.key);
            a.key.min_objectid = a.key.max_objectid = st.st_ino;
            a.key.min_type = a.key.max_type = BTRFS_EXTENT_DATA_KEY;
            a.key.max_offset = ~0ULL;
            a.key.max_transid = ~0ULL;
            a.key.nr_items = 1;
            if (ioctl(dir, BTRFS_IOC_TREE_SEARCH, &a) == 0 && a.key.nr_items) {
                struct btrfs_ioctl_search_header *h = (void *)a.buf;
                unsigned char *item = (unsigned char *)(h + 1);
                if (item[20] == 0) inl++; /* btrfs_file_extent_item.type */
            }
        }
    }
    printf("%c: %ld files, %ld inline, %.3f s\n", mode, seen, inl, now() - t0);
    return 0;
}
