/*
 * Brace expansion for shard patterns (WebDataset / braceexpand semantics,
 * minus nesting, character ranges, steps and backslash escapes).
 *
 * The pattern is parsed twice without building any result: once to count
 * groups and list items, once to fill exactly-sized arrays. The number of
 * results and their total size are known from the parse, so a pattern like
 * "{0..999999999}" fails with SF_ERR_LIMIT before anything large is
 * allocated.
 */
#include "s3/braces.h"

#include "common/strbuf.h"

#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define BRACE_DEFAULT_MAX_RESULTS ((size_t)10 * 1000 * 1000)
/* Bound on the bytes of all results together (string bytes and NULs, not
 * counting malloc overhead): 10 million results of ~100 bytes. */
#define BRACE_MAX_BYTES ((unsigned long long)1 << 30)
/* 18 digits always fit in 64 bits, so range arithmetic cannot overflow. */
#define BRACE_MAX_DIGITS 18

struct span {
    size_t off, len;
};

/* One list or range, with the literal text that precedes it. Literal braces
 * ("{x}") are part of that literal text. */
struct group {
    struct span lit;
    size_t col; /* 1-based column of the '{' */
    int is_range;
    size_t first_item; /* list: index into parse.items */
    unsigned long long lo, hi;
    int width;            /* range: zero-pad width, 0 = none */
    unsigned long long n; /* alternatives, >= 1 */
    size_t max_len;       /* longest alternative */
};

struct parse {
    struct group *groups; /* NULL while counting */
    struct span *items;   /* NULL while counting */
    size_t n_groups;
    size_t n_items;
    struct span tail; /* literal text after the last group */
};

static int all_digits(const char *s, size_t n)
{
    for (size_t i = 0; i < n; i++)
        if (s[i] < '0' || s[i] > '9')
            return 0;
    return 1;
}

static size_t decimal_len(unsigned long long v)
{
    size_t n = 1;
    while (v >= 10) {
        v /= 10;
        n++;
    }
    return n;
}

/* One bound of a range: body[off, off+len) of the group whose '{' is at
 * column col. */
static sf_status parse_bound(const char *pat, size_t off, size_t len, unsigned long long *out,
                             char *err, size_t err_len)
{
    if (len == 0) {
        sf__fail(err, err_len, SF_OK, "empty range bound at column %zu", off + 1);
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (!all_digits(pat + off, len)) {
        sf__fail(err, err_len, SF_OK,
                 "range bound \"%.*s\" at column %zu is not a non-negative integer "
                 "(only numeric ranges such as {000..099} are supported)",
                 (int)(len > 64 ? 64 : len), pat + off, off + 1);
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (len > BRACE_MAX_DIGITS) {
        sf__fail(err, err_len, SF_OK, "range bound at column %zu has more than %d digits", off + 1,
                 BRACE_MAX_DIGITS);
        return SF_ERR_INVALID_ARGUMENT;
    }
    unsigned long long v = 0;
    for (size_t i = 0; i < len; i++)
        v = v * 10 + (unsigned long long)(pat[off + i] - '0');
    *out = v;
    return SF_OK;
}

static int has_leading_zero(const char *s, size_t n)
{
    return n > 1 && s[0] == '0';
}

/* Fills g for the range in pat[off, off+len) (the text between the braces);
 * dots is the offset of the first "..". */
static sf_status parse_range(const char *pat, size_t off, size_t len, size_t dots, struct group *g,
                             char *err, size_t err_len)
{
    size_t lo_off = off, lo_len = dots - off;
    size_t hi_off = dots + 2, hi_len = off + len - hi_off;
    for (size_t i = hi_off; i + 1 < off + len; i++) {
        if (pat[i] == '.' && pat[i + 1] == '.') {
            sf__fail(err, err_len, SF_OK,
                     "range steps ({a..b..step}) are not supported (column %zu)", i + 1);
            return SF_ERR_INVALID_ARGUMENT;
        }
    }
    sf_status st = parse_bound(pat, lo_off, lo_len, &g->lo, err, err_len);
    if (st == SF_OK)
        st = parse_bound(pat, hi_off, hi_len, &g->hi, err, err_len);
    if (st != SF_OK)
        return st;
    g->is_range = 1;
    g->width = 0;
    if (has_leading_zero(pat + lo_off, lo_len) || has_leading_zero(pat + hi_off, hi_len))
        g->width = (int)(lo_len > hi_len ? lo_len : hi_len);
    unsigned long long big = g->lo > g->hi ? g->lo : g->hi;
    g->n = (g->lo > g->hi ? g->lo - g->hi : g->hi - g->lo) + 1;
    size_t digits = decimal_len(big);
    g->max_len = (size_t)g->width > digits ? (size_t)g->width : digits;
    return SF_OK;
}

/* Parses pat into ps. With ps->groups and ps->items NULL it only validates
 * and counts; otherwise the arrays must hold the counts of a previous pass. */
static sf_status parse_pattern(const char *pat, struct parse *ps, char *err, size_t err_len)
{
    size_t lit_start = 0, n_groups = 0, n_items = 0;
    size_t i = 0;
    for (; pat[i]; i++) {
        if (pat[i] == '}') {
            sf__fail(err, err_len, SF_OK, "unbalanced '}' at column %zu", i + 1);
            return SF_ERR_INVALID_ARGUMENT;
        }
        if (pat[i] != '{')
            continue;
        size_t open = i, j = i + 1, commas = 0, dots = 0;
        int have_dots = 0;
        for (; pat[j] && pat[j] != '}'; j++) {
            if (pat[j] == '{') {
                sf__fail(err, err_len, SF_OK,
                         "nested '{' at column %zu inside the brace opened at column %zu "
                         "(nested braces are not supported)",
                         j + 1, open + 1);
                return SF_ERR_INVALID_ARGUMENT;
            }
            if (pat[j] == ',')
                commas++;
            else if (!have_dots && pat[j] == '.' && pat[j + 1] == '.') {
                have_dots = 1;
                dots = j;
            }
        }
        if (!pat[j]) {
            sf__fail(err, err_len, SF_OK, "unbalanced '{' at column %zu: no closing '}'", open + 1);
            return SF_ERR_INVALID_ARGUMENT;
        }
        size_t body = open + 1, body_len = j - body;
        i = j;
        if (!commas && !have_dots)
            continue; /* "{x}" stays literal, braces included */

        struct group tmp;
        struct group *g = ps->groups ? &ps->groups[n_groups] : &tmp;
        memset(g, 0, sizeof *g);
        g->lit.off = lit_start;
        g->lit.len = open - lit_start;
        g->col = open + 1;
        if (commas) {
            /* A comma wins over "..": "{1..2,3}" is the list "1..2", "3". */
            g->first_item = n_items;
            g->n = commas + 1;
            size_t item_start = body;
            for (size_t k = body; k <= j; k++) {
                if (k < j && pat[k] != ',')
                    continue;
                size_t len = k - item_start;
                if (ps->items)
                    ps->items[n_items] = (struct span){item_start, len};
                n_items++;
                if (len > g->max_len)
                    g->max_len = len;
                item_start = k + 1;
            }
        } else {
            sf_status st = parse_range(pat, body, body_len, dots, g, err, err_len);
            if (st != SF_OK)
                return st;
        }
        n_groups++;
        lit_start = j + 1;
    }
    ps->n_groups = n_groups;
    ps->n_items = n_items;
    ps->tail.off = lit_start;
    ps->tail.len = i - lit_start;
    return SF_OK;
}

int sf__has_braces(const char *s)
{
    if (!s)
        return 0;
    struct parse ps = {0};
    if (parse_pattern(s, &ps, NULL, 0) != SF_OK)
        return 1;
    return ps.n_groups > 0;
}

/* Writes alternative k of group g at dst (room for g->max_len + 1 bytes);
 * returns its length. */
static size_t put_alternative(const char *pat, const struct parse *ps, const struct group *g,
                              unsigned long long k, char *dst)
{
    if (!g->is_range) {
        const struct span *it = &ps->items[g->first_item + k];
        memcpy(dst, pat + it->off, it->len);
        return it->len;
    }
    unsigned long long v = g->lo > g->hi ? g->lo - k : g->lo + k;
    int w = snprintf(dst, g->max_len + 1, "%0*llu", g->width, v);
    return w > 0 ? (size_t)w : 0;
}

sf_status sf__brace_expand(const char *pattern, size_t max_results, char ***out, size_t *n,
                           char *err, size_t err_len)
{
    sf__clear_err(err, err_len);
    if (out)
        *out = NULL;
    if (n)
        *n = 0;
    if (!pattern || !out || !n) {
        sf__fail(err, err_len, SF_OK, "NULL argument");
        return SF_ERR_INVALID_ARGUMENT;
    }
    if (max_results == 0)
        max_results = BRACE_DEFAULT_MAX_RESULTS;

    struct parse ps = {0};
    sf_status st = parse_pattern(pattern, &ps, err, err_len);
    if (st != SF_OK)
        return st;

    /* The first pass only counted; the second fills exactly-sized arrays. */
    ps.groups = ps.n_groups ? calloc(ps.n_groups, sizeof *ps.groups) : NULL;
    ps.items = ps.n_items ? calloc(ps.n_items, sizeof *ps.items) : NULL;
    if ((ps.n_groups && !ps.groups) || (ps.n_items && !ps.items)) {
        free(ps.groups);
        free(ps.items);
        sf__fail(err, err_len, SF_OK, "out of memory");
        return SF_ERR_NO_MEMORY;
    }
    st = parse_pattern(pattern, &ps, err, err_len);

    /* Count and size every result before allocating any of them. */
    unsigned long long total = 1;
    size_t result_max = ps.tail.len;
    for (size_t g = 0; st == SF_OK && g < ps.n_groups; g++) {
        const struct group *gr = &ps.groups[g];
        if (total > (unsigned long long)max_results / gr->n) {
            sf__fail(err, err_len, SF_OK,
                     "the brace at column %zu takes the expansion past max_results (%zu)", gr->col,
                     max_results);
            st = SF_ERR_LIMIT;
            break;
        }
        total *= gr->n;
        result_max += gr->lit.len + gr->max_len;
    }
    /* result_max <= strlen(pattern) + 18 per group, so it cannot overflow;
     * total * (result_max + 1) is checked by division. */
    if (st == SF_OK && (unsigned long long)result_max + 1 > BRACE_MAX_BYTES / total) {
        sf__fail(err, err_len, SF_OK, "the expansion would take more than %llu bytes",
                 (unsigned long long)BRACE_MAX_BYTES);
        st = SF_ERR_LIMIT;
    }

    char **v = NULL;
    unsigned long long *idx = NULL;
    char *buf = NULL;
    size_t done = 0;
    if (st == SF_OK) {
        v = calloc((size_t)total, sizeof *v);
        idx = ps.n_groups ? calloc(ps.n_groups, sizeof *idx) : NULL;
        buf = malloc(result_max + 1);
        if (!v || !buf || (ps.n_groups && !idx)) {
            sf__fail(err, err_len, SF_OK, "out of memory");
            st = SF_ERR_NO_MEMORY;
        }
    }
    for (; st == SF_OK && done < (size_t)total; done++) {
        size_t len = 0;
        for (size_t g = 0; g < ps.n_groups; g++) {
            const struct group *gr = &ps.groups[g];
            memcpy(buf + len, pattern + gr->lit.off, gr->lit.len);
            len += gr->lit.len;
            len += put_alternative(pattern, &ps, gr, idx[g], buf + len);
        }
        memcpy(buf + len, pattern + ps.tail.off, ps.tail.len);
        len += ps.tail.len;
        v[done] = malloc(len + 1);
        if (!v[done]) {
            sf__fail(err, err_len, SF_OK, "out of memory");
            st = SF_ERR_NO_MEMORY;
            break;
        }
        memcpy(v[done], buf, len);
        v[done][len] = '\0';
        /* Odometer: the right-most group varies fastest. */
        for (size_t g = ps.n_groups; g-- > 0;) {
            if (++idx[g] < ps.groups[g].n)
                break;
            idx[g] = 0;
        }
    }
    free(buf);
    free(idx);
    free(ps.groups);
    free(ps.items);
    if (st != SF_OK) {
        sf__strv_free(v, done);
        return st;
    }
    *out = v;
    *n = (size_t)total;
    return SF_OK;
}
