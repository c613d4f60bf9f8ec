/*
 * The bare-syscall floor of a tree copy: what the kernel needs at least to
 * recreate a tree, with no library, no metadata beyond the permission bits
 * creation gives, and no directory reading (the list is made beforehand).
 * Every tree benchmark reads its figures against this.
 *
 *   cc -O2 -pthread -o floor bench/floor.c
 *   find SRC -printf '%y %P\0%l\0' > list     # type, path, symlink target
 *   floor [-j N] [--tmpfile] [--copy] LIST SRC DST
 *
 * Directories are made first (one thread, parents before children), then
 * the files are shared out over N threads (default 2), each file:
 *   open(src) ; open(dst, O_CREAT|O_EXCL) ; ioctl(FICLONE) ; close ; close
 * --tmpfile makes each file an O_TMPFILE linked into place with linkat
 * (the crash-atomic variant); --copy moves the data with copy_file_range
 * instead of FICLONE (the floor for filesystems that cannot clone).
 * Symbolic links are made by the file threads too.
 */
#define _GNU_SOURCE
#include <errno.h>
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

struct item { char type; char *path; char *target; };

static struct item *items;
static size_t nitems;
static atomic_size_t next_item;
static int src_root, dst_root, use_tmpfile, use_copy;
static atomic_int failures;

static void fail(const char *what, const char *path) {
    fprintf(stderr, "floor: %s %s: %s\n", what, path, strerror(errno));
    atomic_fetch_add(&failures, 1);
}

static void copy_data(int in, int out, const char *path) {
    struct stat st;
    if (fstat(in, &st) != 0) { fail("fstat", path); return; }
    off_t left = st.st_size;
    while (left > 0) {
        ssize_t n = copy_file_range(in, NULL, out, NULL, left, 0);
        if (n <= 0) { fail("copy_file_range", path); return; }
        left -= n;
    }
}

static void one_file(const struct item *it) {
    int in = openat(src_root, it->path, O_RDONLY | O_NOFOLLOW | O_CLOEXEC);
    if (in < 0) { fail("open", it->path); return; }
    struct stat st;
    if (fstat(in, &st) != 0) { fail("fstat", it->path); close(in); return; }
    mode_t mode = st.st_mode & 0777;
    int out;
    if (use_tmpfile) {
        char dir[4096];
        const char *slash = strrchr(it->path, '/');
        if (slash) { snprintf(dir, sizeof dir, "%.*s", (int)(slash - it->path), it->path); }
        else strcpy(dir, ".");
        out = openat(dst_root, dir, O_TMPFILE | O_WRONLY | O_CLOEXEC, mode);
    } else {
        out = openat(dst_root, it->path, O_CREAT | O_EXCL | O_WRONLY | O_CLOEXEC, mode);
    }
    if (out < 0) { fail("create", it->path); close(in); return; }
    if (use_copy) copy_data(in, out, it->path);
    else if (ioctl(out, FICLONE, in) != 0) fail("FICLONE", it->path);
    if (use_tmpfile && linkat(out, "", dst_root, it->path, AT_EMPTY_PATH) != 0)
        fail("linkat", it->path);
    close(out);
    close(in);
}

static void *worker(void *arg) {
    (void)arg;
    for (;;) {
        size_t i = atomic_fetch_add(&next_item, 1);
        if (i >= nitems) return NULL;
        const struct item *it = &items[i];
        if (it->type == 'f') one_file(it);
        else if (it->type == 'l' && symlinkat(it->target, dst_root, it->path) != 0)
            fail("symlink", it->path);
    }
}

int main(int argc, char **argv) {
    int threads = 2, a = 1;
    for (; a < argc && argv[a][0] == '-'; a++) {
        if (!strcmp(argv[a], "-j") && a + 1 < argc) threads = atoi(argv[++a]);
        else if (!strcmp(argv[a], "--tmpfile")) use_tmpfile = 1;
        else if (!strcmp(argv[a], "--copy")) use_copy = 1;
        else break;
    }
    if (argc - a != 3 || threads < 1) {
        fprintf(stderr, "usage: floor [-j N] [--tmpfile] [--copy] LIST SRC DST\n");
        return 2;
    }
    FILE *f = fopen(argv[a], "r");
    if (!f) { perror(argv[a]); return 2; }
    size_t cap = 1 << 16;
    items = malloc(cap * sizeof *items);
    char *line = NULL, *target = NULL;
    size_t ll = 0, tl = 0;
    while (getdelim(&line, &ll, 0, f) > 0 && getdelim(&target, &tl, 0, f) > 0) {
        if (strlen(line) < 3) continue; /* the root itself: "d " */
        if (nitems == cap) items = realloc(items, (cap *= 2) * sizeof *items);
        items[nitems++] = (struct item){line[0], strdup(line + 2), strdup(target)};
    }
    fclose(f);
    src_root = open(argv[a + 1], O_RDONLY | O_DIRECTORY);
    mkdir(argv[a + 2], 0755);
    dst_root = open(argv[a + 2], O_RDONLY | O_DIRECTORY);
    if (src_root < 0 || dst_root < 0) { perror("open roots"); return 2; }
    /* find lists parents before children */
    for (size_t i = 0; i < nitems; i++)
        if (items[i].type == 'd' && mkdirat(dst_root, items[i].path, 0755) != 0)
            fail("mkdir", items[i].path);
    pthread_t t[threads];
    for (int i = 0; i < threads; i++) pthread_create(&t[i], NULL, worker, NULL);
    for (int i = 0; i < threads; i++) pthread_join(t[i], NULL);
    return failures ? 1 : 0;
}
