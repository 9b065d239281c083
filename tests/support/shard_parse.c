#include "support/shard_parse.h"

#include <criterion/criterion.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static void check_sample(const struct sf_sample *s, const unsigned char *base, size_t fed,
                         size_t index)
{
    cr_assert_eq(s->index, index, "sample index %llu, want %zu", s->index, index);
    cr_assert(s->offset < s->end && s->end <= fed, "sample [%llu, %llu) outside %zu", s->offset,
              s->end, fed);
    cr_assert_eq(strlen(s->key), s->key_len);
    for (size_t i = 0; i < s->field_count; i++) {
        const struct sf_sample_field *f = &s->fields[i];
        cr_assert_not_null(f->data);
        cr_assert_eq(strlen(f->name), f->name_len);
        if (!s->reader_owned) {
            cr_assert(f->offset + f->size <= fed);
            cr_assert_eq((const unsigned char *)f->data, base + f->offset,
                         "field data is not a pointer into the shard");
        } else {
            cr_assert_eq(f->offset, s->offset);
        }
    }
}

void parse_shard(const struct feed_style *style, const unsigned char *buf, size_t len,
                 const struct sf_shard_reader_options *o, enum feed_mode mode, uint64_t seed,
                 size_t max_step, struct parse_result *res)
{
    memset(res, 0, sizeof *res);
    struct sf_shard_reader_options d;
    sf_shard_reader_options_init_default(&d);
    if (!o) {
        d.name = style->name;
        o = &d;
    }
    struct sf_shard_reader *r = NULL;
    char err[256];
    cr_assert_eq(sf_shard_reader_new(o, &r, err, sizeof err), SF_OK, "%s", err);
    size_t fed = 0;
    int fed_once = 0;
    unsigned char *copy = NULL;
    const unsigned char *base = buf;
    for (unsigned long iter = 0;; iter++) {
        cr_assert(iter < 100000000ul, "reader does not terminate");
        struct sf_sample s;
        enum sf_shard_event ev;
        sf_status st = sf_shard_reader_next(r, &s, &ev);
        if (st != SF_OK) {
            res->st = st;
            res->err_offset = sf_shard_reader_error_offset(r);
            snprintf(res->err, sizeof res->err, "%s", sf_shard_reader_errmsg(r));
            cr_assert(res->err[0] != '\0', "failure without a message");
            cr_assert_eq(sf_shard_reader_next(r, &s, &ev), st, "errors are sticky");
            break;
        }
        if (ev == SF_SHARD_SAMPLE) {
            check_sample(&s, base, fed, res->samples);
            res->owned += s.reader_owned != 0;
            serialize_sample(&res->ser, &s);
            res->samples++;
            res->last_end = s.end;
            continue;
        }
        if (ev == SF_SHARD_END) {
            /* Stays ended. */
            cr_assert_eq(sf_shard_reader_next(r, &s, &ev), SF_OK);
            cr_assert_eq(ev, SF_SHARD_END);
            break;
        }
        cr_assert_eq(ev, SF_SHARD_NEED_MORE);
        cr_assert(!fed_once || fed < len, "NEED_MORE after the whole shard (%zu bytes) was fed",
                  len);
        if (fed_once)
            cr_assert(sf_shard_reader_wanted(r) > fed, "wanted %llu <= fed %zu",
                      sf_shard_reader_wanted(r), fed);
        size_t step = len - fed;
        if (mode != FEED_ALL) {
            size_t m = max_step ? max_step : style->max_step;
            step = 1 + (size_t)(rng_next(&seed) % m);
            /* sometimes jump straight to what the reader wants */
            if (rng_next(&seed) % style->jump_one_in == 0 && sf_shard_reader_wanted(r) > fed)
                step = (size_t)(sf_shard_reader_wanted(r) - fed);
            if (step > len - fed)
                step = len - fed;
        }
        fed += step;
        fed_once = 1;
        unsigned long long total =
            (mode == FEED_RANDOM_LATE || mode == FEED_RANDOM_MOVING) && fed < len
                ? SF_SIZE_UNKNOWN
                : (unsigned long long)len;
        if (mode == FEED_RANDOM_MOVING) {
            /* Earlier samples were serialized already: the old copy can go. */
            unsigned char *c = malloc(fed ? fed : 1);
            cr_assert_not_null(c);
            memcpy(c, buf, fed);
            cr_assert_eq(sf_shard_reader_feed(r, c, fed, total), SF_OK);
            free(copy);
            copy = c;
            base = c;
        } else {
            cr_assert_eq(sf_shard_reader_feed(r, buf, fed, total), SF_OK);
        }
    }
    sf_shard_reader_stats(r, &res->stats);
    res->format = sf_shard_reader_format(r);
    sf_shard_reader_destroy(r);
    free(copy);
}

void parse_result_free(struct parse_result *r)
{
    bytes_free(&r->ser);
}

void expect_parse_failed(const struct parse_result *r, sf_status want,
                         unsigned long long want_offset, const char *frag)
{
    cr_expect_eq(r->st, want, "status %d (%s), want %d", (int)r->st, r->err, (int)want);
    cr_expect_eq(r->err_offset, want_offset, "error offset %llu, want %llu (%s)", r->err_offset,
                 want_offset, r->err);
    if (frag)
        cr_expect(strstr(r->err, frag) != NULL, "message lacks '%s': %s", frag, r->err);
}

void expect_shard_error(const struct feed_style *style, const unsigned char *buf, size_t len,
                        sf_status want, unsigned long long want_offset, const char *frag,
                        int prefixed)
{
    struct parse_result r;
    parse_shard(style, buf, len, NULL, FEED_ALL, 0, 0, &r);
    expect_parse_failed(&r, want, want_offset, frag);
    char off[600];
    if (prefixed) {
        snprintf(off, sizeof off, "%s: offset %llu: ", style->name, want_offset);
        cr_expect(strstr(r.err, off) == r.err, "message lacks '%s': %s", off, r.err);
    } else {
        snprintf(off, sizeof off, "offset %llu", want_offset);
        cr_expect(strstr(r.err, style->name) != NULL, "message lacks the shard name: %s", r.err);
        cr_expect(strstr(r.err, off) != NULL, "message lacks '%s': %s", off, r.err);
    }
    parse_result_free(&r);
}
