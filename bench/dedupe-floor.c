/*
 * The bare-syscall floor of executing a dedupe plan: what the kernel needs
 * at least to share the blocks of groups already known to be identical,
 * with no scan, no hashing and no checks.
 *
 *   cc -O2 -pthread -o dedupe-floor bench/dedupe-floor.c
 *   cowlink dedupe --dry-run --json PATH | python3 -c '...' > list
 *   dedupe-floor [-j N] LIST
 *
 * LIST holds one group per line: the source, then its targets, separated
 * by NUL bytes, the line ended by an empty field (two NULs). Per group:
 *   open(source) ; per target: open(target) ; ioctl(FIDEDUPERANGE, whole
 *   file) ; close
 * in the order of the list; with -j N (default 1), N threads take the
 * next group in turn.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/fs.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/stat.h>
#include <unistd.h>

static char **groups;
static long ngroups;
static atomic_long next_group, failures, deduped;

/* One group: the source at p, then its targets, up to the empty field. */
static void run_group(char *p) {
    struct {
        struct file_dedupe_range r;
        struct file_dedupe_range_info info;
    } req;
    int src = open(p, O_RDONLY | O_NOFOLLOW);
    struct stat st;
    if (src < 0 || fstat(src, &st) < 0) {
        perror(p);
        failures++;
    }
    p += strlen(p) + 1;
    while (*p) {
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
    if (src >= 0)
        close(src);
}

static void *worker(void *unused) {
    (void)unused;
    for (;;) {
        long i = next_group++;
        if (i >= ngroups)
            return NULL;
        run_group(groups[i]);
    }
}

int main(int argc, char **argv) {
    int threads = 1;
    if (argc == 4 && strcmp(argv[1], "-j") == 0) {
        threads = atoi(argv[2]);
        argv += 2;
        argc -= 2;
    }
    if (argc != 2 || threads < 1 || threads > 64) {
        fprintf(stderr, "usage: dedupe-floor [-j N] LIST\n");
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
    char *buf = malloc(n + 2);
    if (fread(buf, 1, n, f) != (size_t)n) {
        perror(argv[1]);
        return 1;
    }
    buf[n] = buf[n + 1] = 0;
    /* Index the groups: each starts after the empty field of the last. */
    groups = malloc(sizeof(char *) * (n / 2 + 1));
    for (char *p = buf, *end = buf + n; p < end; p++) {
        groups[ngroups++] = p;
        while (*p)
            p += strlen(p) + 1;
    }
    pthread_t t[64];
    for (int i = 0; i < threads; i++)
        pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++)
        pthread_join(t[i], NULL);
    fprintf(stderr, "%ld groups, %ld targets deduplicated, %ld failures\n", ngroups,
            (long)deduped, (long)failures);
    return failures != 0;
}
