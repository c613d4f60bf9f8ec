/*
 * The bare-syscall floor of executing a dedupe plan: what the kernel needs
 * at least to share the blocks of groups already known to be identical,
 * with no scan, no hashing and no checks.
 *
 *   cc -O2 -o dedupe-floor bench/dedupe-floor.c
 *   cowlink dedupe --dry-run --json PATH | python3 -c '...' > list
 *   dedupe-floor LIST
 *
 * LIST holds one group per line: the source, then its targets, separated
 * by NUL bytes, the line ended by an empty field (two NULs). Per group:
 *   open(source) ; per target: open(target) ; ioctl(FIDEDUPERANGE, whole
 *   file) ; close
 * one thread, in the order of the list.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 2) {
        fprintf(stderr, "usage: dedupe-floor LIST\n");
        return 2;
    }
    FILE *f = fopen(argv[1], "r");
    if (!f) {
        perror(argv[1]);
        return 1;
    }
    fseek(f, 0, SEEK_END);
    long n = ftell(f);
    fseek(f, 0, SEEK_SET);
    char *buf = malloc(n + 1);
    if (fread(buf, 1, n, f) != (size_t)n) {
        perror(argv[1]);
        return 1;
    }
    buf[n] = 0;
    struct {
        struct file_dedupe_range r;
        struct file_dedupe_range_info info;
    } req;
    long failures = 0, groups = 0, deduped = 0;
    char *p = buf, *end = buf + n;
    while (p < end) {
        int src = open(p, O_RDONLY | O_NOFOLLOW);
        struct stat st;
        if (src < 0 || fstat(src, &st) < 0) {
            perror(p);
            failures++;
        }
        p += strlen(p) + 1;
        while (p < end && *p) {
            int dst = open(p, O_RDONLY | O_NOFOLLOW);
            if (dst < 0 || src < 0) {
                failures++;
            } else {
                memset(&req, 0, sizeof req);
                req.r.src_offset = 0;
                req.r.src_length = st.st_size;
                req.r.dest_count = 1;
                req.info.dest_fd = dst;
                req.info.dest_offset = 0;
                if (ioctl(src, FIDEDUPERANGE, &req) < 0 || req.info.status != 0)
                    failures++;
                else
                    deduped++;
            }
            if (dst >= 0)
                close(dst);
            p += strlen(p) + 1;
        }
        p++; /* the empty field */
        if (src >= 0)
            close(src);
        groups++;
    }
    fprintf(stderr, "%ld groups, %ld targets deduplicated, %ld failures\n", groups, deduped, failures);
    return failures != 0;
}
