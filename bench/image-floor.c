/*
 * The bare-syscall floor of committing a qcow2 overlay into a raw image:
 * what the kernel needs at least to put the overlay's data clusters at
 * their guest offsets, with no qcow2 parsing, no checks and no atomic
 * placement (the destination is changed in place).
 *
 *   cc -O2 -o image-floor bench/image-floor.c
 *   cowlink image map --json OVERLAY | python3 -c '...' > LIST
 *   image-floor LIST OVERLAY DEST            # commit: DEST is the base
 *   image-floor LIST OVERLAY DEST BASE       # convert: DEST made new,
 *                                            # BASE cloned whole first
 *
 * LIST holds one range per line, "guest host length" for a data range
 * (FICLONERANGE from OVERLAY at host to DEST at guest) or "guest - length"
 * for a zero range (a punched hole), in the order given, one thread.
 */
#define _GNU_SOURCE
#include <fcntl.h>
#include <linux/falloc.h>
#include <linux/fs.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <unistd.h>

int main(int argc, char **argv) {
    if (argc != 4 && argc != 5) {
        fprintf(stderr, "usage: image-floor LIST OVERLAY DEST [BASE]\n");
        return 2;
    }
    FILE *list = fopen(argv[1], "r");
    if (!list) {
        perror(argv[1]);
        return 1;
    }
    int ov = open(argv[2], O_RDONLY);
    if (ov < 0) {
        perror(argv[2]);
        return 1;
    }
    int dst;
    if (argc == 5) {
        int base = open(argv[4], O_RDONLY);
        dst = open(argv[3], O_RDWR | O_CREAT | O_EXCL, 0644);
        if (base < 0 || dst < 0 || ioctl(dst, FICLONE, base) < 0) {
            perror("cloning the base");
            return 1;
        }
        close(base);
    } else {
        dst = open(argv[3], O_RDWR);
        if (dst < 0) {
            perror(argv[3]);
            return 1;
        }
    }
    char line[128], host[32];
    unsigned long long guest, len, done = 0;
    while (fgets(line, sizeof line, list)) {
        if (sscanf(line, "%llu %31s %llu", &guest, host, &len) != 3) {
            fprintf(stderr, "bad line: %s", line);
            return 1;
        }
        int rc;
        if (strcmp(host, "-") == 0) {
            rc = fallocate(dst, FALLOC_FL_PUNCH_HOLE | FALLOC_FL_KEEP_SIZE, guest, len);
        } else {
            struct file_clone_range r = {
                .src_fd = ov,
                .src_offset = strtoull(host, NULL, 10),
                .src_length = len,
                .dest_offset = guest,
            };
            rc = ioctl(dst, FICLONERANGE, &r);
        }
        if (rc < 0) {
            perror("range");
            return 1;
        }
        done++;
    }
    if (close(dst) < 0) {
        perror(argv[3]);
        return 1;
    }
    fprintf(stderr, "%llu ranges\n", done);
    return 0;
}
