/* Reading or writing all of a byte range of a descriptor: the loop every
 * folder's local I/O shares (again after EINTR and after a short count).
 * What a stop means (an error, a file that shrank, a disk that takes no
 * more) and how it is reported stay with the caller. */
#ifndef SF_COMMON_IO_H
#define SF_COMMON_IO_H

#include <errno.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/types.h>
#include <unistd.h>

enum sf__io_op {
    SF__IO_READ,   /* read(): from the descriptor's position */
    SF__IO_PREAD,  /* pread(): from off */
    SF__IO_WRITE,  /* write(): at the descriptor's position */
    SF__IO_PWRITE, /* pwrite(): at off */
};

/* One call moves at most this much: some systems refuse a count over
 * INT_MAX, and a short count is taken up by the loop anyway. */
#define SF__IO_STEP_MAX ((size_t)1 << 30)

/*
 * Moves n bytes between buf and fd with op (off is ignored by SF__IO_READ
 * and SF__IO_WRITE). Returns 0 when all n moved; else -1 with errno set (a
 * call failed) or 1 (a call moved nothing: the file ended, or the write
 * made no progress). *done (may be NULL) receives how many bytes moved
 * before the stop (n on success). buf is only read by the writes.
 */
static inline int sf__io_full(enum sf__io_op op, int fd, void *buf, size_t n, uint64_t off,
                              size_t *done)
{
    unsigned char *p = buf;
    size_t moved = 0;
    int rc = 0;
    while (moved < n) {
        size_t want = n - moved < SF__IO_STEP_MAX ? n - moved : SF__IO_STEP_MAX;
        off_t at = (off_t)(off + moved);
        ssize_t r = op == SF__IO_READ    ? read(fd, p + moved, want)
                    : op == SF__IO_PREAD ? pread(fd, p + moved, want, at)
                    : op == SF__IO_WRITE ? write(fd, p + moved, want)
                                         : pwrite(fd, p + moved, want, at);
        if (r < 0 && errno == EINTR)
            continue;
        if (r <= 0) {
            rc = r < 0 ? -1 : 1;
            break;
        }
        moved += (size_t)r;
    }
    if (done)
        *done = moved;
    return rc;
}

/* sf__io_full with read(): n bytes of fd from its position into buf. */
static inline int sf__read_full(int fd, void *buf, size_t n, size_t *done)
{
    return sf__io_full(SF__IO_READ, fd, buf, n, 0, done);
}

/* sf__io_full with pread(): n bytes of fd at off into buf. */
static inline int sf__pread_full(int fd, void *buf, size_t n, uint64_t off, size_t *done)
{
    return sf__io_full(SF__IO_PREAD, fd, buf, n, off, done);
}

/* sf__io_full with pwrite(): n bytes of buf into fd at off. */
static inline int sf__pwrite_full(int fd, const void *buf, size_t n, uint64_t off, size_t *done)
{
    return sf__io_full(SF__IO_PWRITE, fd, (void *)buf, n, off, done);
}

/* sf__io_full with write(): n bytes of buf at fd's position. */
static inline int sf__write_full(int fd, const void *buf, size_t n, size_t *done)
{
    return sf__io_full(SF__IO_WRITE, fd, (void *)buf, n, 0, done);
}

#endif
