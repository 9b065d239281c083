#include "support/bytes.h"

#include <criterion/criterion.h>
#include <stdlib.h>
#include <string.h>

uint64_t rng_next(uint64_t *s)
{
    uint64_t x = *s ? *s : 0x9e3779b97f4a7c15ull;
    x ^= x >> 12;
    x ^= x << 25;
    x ^= x >> 27;
    *s = x;
    return x * 0x2545f4914f6cdd1dull;
}

void bytes_put(struct bytes *b, const void *d, size_t n)
{
    if (b->len + n > b->cap) {
        size_t c = b->cap ? b->cap : 1024;
        while (c < b->len + n)
            c *= 2;
        b->p = realloc(b->p, c);
        cr_assert_not_null(b->p);
        b->cap = c;
    }
    if (n)
        memcpy(b->p + b->len, d, n);
    b->len += n;
}

void bytes_put_u64(struct bytes *b, uint64_t v)
{
    bytes_put(b, &v, sizeof v);
}

void bytes_free(struct bytes *b)
{
    free(b->p);
    memset(b, 0, sizeof *b);
}

int bytes_eq(const struct bytes *a, const struct bytes *b)
{
    return a->len == b->len && (a->len == 0 || memcmp(a->p, b->p, a->len) == 0);
}

void serialize_sample(struct bytes *out, const struct sf_sample *s)
{
    bytes_put_u64(out, s->key_len);
    bytes_put(out, s->key, s->key_len);
    bytes_put_u64(out, s->field_count);
    for (size_t i = 0; i < s->field_count; i++) {
        bytes_put_u64(out, s->fields[i].name_len);
        bytes_put(out, s->fields[i].name, s->fields[i].name_len);
        bytes_put_u64(out, s->fields[i].size);
        bytes_put(out, s->fields[i].data, s->fields[i].size);
    }
}
