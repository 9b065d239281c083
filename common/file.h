/* Local files: the open-then-fstat step (and the status of its failure)
 * every folder's local reads share, and the preallocation of a download's
 * destination. */
#ifndef SF_COMMON_FILE_H
#define SF_COMMON_FILE_H

#include "shardfeed/common.h"
#include "common/io.h"

#include <errno.h>
#include <fcntl.h>
#include <linux/magic.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/vfs.h>
#include <unistd.h>

/* Opens path read-only (close-on-exec) and fills *sb. Returns the
 * descriptor, or -1 with errno from the open or the fstat that failed (the
 * descriptor then closed). */
static inline int sf__open_stat(const char *path, struct stat *sb)
{
    int fd = open(path, O_RDONLY | O_CLOEXEC);
    if (fd >= 0 && fstat(fd, sb) != 0) {
        int e = errno;
        close(fd);
        errno = e;
        fd = -1;
    }
    return fd;
}

/* Drops a half-written temporary file: closes *fd (then -1) and removes
 * and frees *path (then NULL). Either may be gone already (-1, NULL). */
static inline void sf__temp_discard(int *fd, char **path)
{
    if (*fd >= 0)
        close(*fd);
    *fd = -1;
    if (*path) {
        unlink(*path);
        free(*path);
        *path = NULL;
    }
}

/* Reserves the blocks of the first size bytes of fd's file before a
 * download writes them: on a disk the writes then find their blocks
 * allocated (cheaper per page than delayed allocation), and a full disk
 * fails here, before any byte is fetched. Not on tmpfs, where it would zero
 * every page once before the download writes it. Returns 0, or -1 with
 * errno ENOSPC; a file system without fallocate keeps the file sparse (0).
 * The size stays as it was: only blocks are reserved. */
static inline int sf__preallocate(int fd, uint64_t size)
{
    struct statfs fs;
    if (!size || (fstatfs(fd, &fs) == 0 && fs.f_type == TMPFS_MAGIC))
        return 0;
    if (fallocate(fd, FALLOC_FL_KEEP_SIZE, 0, (off_t)size) == 0 || errno != ENOSPC)
        return 0;
    return -1;
}

/* The pages wholly inside [p, p + n) of a FILE mapping leave this process:
 * its resident size falls, the page cache keeps the bytes, and a later read
 * faults them back unchanged. Never on anonymous memory (a malloc'd
 * buffer), whose dropped pages would read back as zeros. */
static inline void sf__drop_mapped(const void *p, size_t n)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    uintptr_t a = ((uintptr_t)p + page - 1) & ~(page - 1);
    uintptr_t e = ((uintptr_t)p + n) & ~(page - 1);
    if (e > a)
        madvise((void *)a, e - a, MADV_DONTNEED);
}

/* What one fault of a file mapping may map: the kernel maps the page cache
 * around the faulting address (fault-around, 64 KiB by default), and since
 * Linux 6.18 whole large folios of it, up to the page table that holds the
 * address (2 MiB with 4 KiB pages), whatever the madvise advice. */
static inline uintptr_t sf__fault_map_bytes(void)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE);
    return page * (page / sizeof(void *)); /* one page table's reach */
}

/* The pages that reading bytes [from, to) of a file mapped at base (len
 * bytes, base page-aligned) may have mapped: the range widened to the page
 * tables it touches (sf__fault_map_bytes), kept inside the mapping. What
 * sf__drop_mapped() should give back once those bytes are read. */
static inline void sf__fault_span(const void *base, size_t len, uint64_t from, uint64_t to,
                                  const void **p, size_t *n)
{
    const uintptr_t page = (uintptr_t)sysconf(_SC_PAGESIZE), w = sf__fault_map_bytes();
    uintptr_t b = (uintptr_t)base, end = b + ((len + page - 1) & ~(page - 1));
    uintptr_t lo = (b + (uintptr_t)from) & ~(w - 1);
    uintptr_t hi = (b + (uintptr_t)to + w - 1) & ~(w - 1);
    lo = lo < b ? b : lo;
    hi = hi > end ? end : hi;
    *p = (const void *)lo;
    *n = hi > lo ? hi - lo : 0;
}

/* The status for a local file that cannot be opened or read: errno e is
 * ENOENT (SF_ERR_NOT_FOUND) or anything else (SF_ERR_IO). */
static inline sf_status sf__errno_status(int e)
{
    return e == ENOENT ? SF_ERR_NOT_FOUND : SF_ERR_IO;
}

/* Writes len bytes of text to path as a whole or not at all: a temporary file beside it
 * (the same folder, so the same file system), flushed to disk, then renamed
 * over it; a failure removes the temporary and leaves what was at path
 * untouched. A path that is a link writes its target; one that is not a
 * regular file (/dev/stdout, a FIFO) is written in place, as it cannot be
 * replaced. An existing file keeps its mode; a new one gets 0666 less the
 * umask, as fopen() would give. Returns 0, or -1 with errno. */
static inline int sf__write_file_whole(const char *path, const void *text, size_t len)
{
    struct stat sb;
    int exists = stat(path, &sb) == 0;
    if (!exists && errno != ENOENT)
        return -1;
    if (exists && !S_ISREG(sb.st_mode)) {
        int fd = open(path, O_WRONLY | O_TRUNC | O_CLOEXEC);
        if (fd < 0)
            return -1;
        errno = 0;
        int rc = sf__write_full(fd, text, len, NULL) == 0 ? 0 : -1;
        int e = rc ? (errno ? errno : EIO) : 0;
        if (close(fd) != 0 && !rc) {
            rc = -1;
            e = errno;
        }
        errno = e;
        return rc;
    }
    char *real = exists ? realpath(path, NULL) : NULL;
    if (exists && !real)
        return -1;
    const char *final = real ? real : path;
    const char *slash = strrchr(final, '/');
    const size_t cap = strlen(final) + 64;
    char *tmp = malloc(cap);
    if (!tmp) {
        free(real);
        errno = ENOMEM;
        return -1;
    }
    int fd = -1;
    for (unsigned k = 0; fd < 0 && k < 100; k++) {
        snprintf(tmp, cap, "%.*s.%s.tmp-%ld-%u", slash ? (int)(slash - final + 1) : 0, final,
                 slash ? slash + 1 : final, (long)getpid(), k);
        fd = open(tmp, O_WRONLY | O_CREAT | O_EXCL | O_CLOEXEC, 0666);
        if (fd < 0 && errno != EEXIST)
            break;
    }
    int e = fd < 0 ? errno : 0;
    if (fd >= 0) {
        errno = 0;
        if ((exists && fchmod(fd, sb.st_mode & 07777) != 0) ||
            sf__write_full(fd, text, len, NULL) != 0 || fsync(fd) != 0)
            e = errno ? errno : EIO; /* a write that made no progress: EIO */
        if (close(fd) != 0 && !e)
            e = errno;
        if (!e && rename(tmp, final) != 0)
            e = errno;
        if (e)
            unlink(tmp);
    }
    free(tmp);
    free(real);
    errno = e;
    return e ? -1 : 0;
}

#endif
