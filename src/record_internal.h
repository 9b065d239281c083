/* Internal to the record shard files (src/record.c, src/record_writer.c):
 * the layout's tags and the growth helpers both sides use (docs/FORMAT.md). */
#ifndef SF_SRC_RECORD_INTERNAL_H
#define SF_SRC_RECORD_INTERNAL_H

#include <stddef.h>
#include <stdint.h>

#define DEFAULT_MAX_RECORD (1ull << 30)

static const unsigned char TAG_RECORD[4] = {'S', 'F', 'R', 'D'};
static const unsigned char TAG_INDEX[4] = {'S', 'F', 'R', 'X'};

struct sf__record_entry {
    uint64_t off, bytes;
};

/* Grows *buf to at least need bytes (doubling). 0 on success. */
int sf__record_reserve(unsigned char **buf, size_t *cap, size_t need);
/* Appends {off, bytes} to the growing array *v. 0 on success. */
int sf__record_push_entry(struct sf__record_entry **v, size_t *n, size_t *cap, uint64_t off,
                          uint64_t bytes);

#endif
