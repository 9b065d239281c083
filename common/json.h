/*
 * Escaped NULs in JSON strings. cJSON keeps C strings, so "\u0000" in a
 * string ends it there: "bucket\u0000/x" would read as another path, a key
 * "AKIA\u0000junk" as a shorter one. Every reader of JSON strings that name
 * paths, URLs, keys or options asks sf__json_nul_where() and refuses the
 * document, naming the field (never its value: it may be a secret). Here,
 * below every folder that parses JSON (src/ index and options, s3/
 * credentials documents), as inline functions over cJSON.
 */
#ifndef SF_COMMON_JSON_H
#define SF_COMMON_JSON_H

#include <cjson/cJSON.h>
#include <stdio.h>
#include <string.h>

/* Moves *pp past the next string token of JSON text (up to end): 1 when it
 * holds an escaped NUL, 0 when not, -1 when there is none. Outside strings
 * JSON has no quotes, so the next '"' starts one. */
static inline int sf__json_next_string(const char **pp, const char *end)
{
    const char *p = memchr(*pp, '"', (size_t)(end - *pp));
    if (!p)
        return -1;
    int nul = 0;
    for (p++; p < end && *p != '"'; p++) {
        if (*p != '\\')
            continue;
        if (++p >= end)
            break;
        if (*p == 'u' && end - p >= 5 && !memcmp(p + 1, "0000", 4))
            nul = 1;
    }
    *pp = p < end ? p + 1 : end;
    return nul;
}

/* Appends text (a member's name, its first 64 bytes: a message must keep
 * room for what it says) or "[i]" to path[0, *len) within cap bytes (cut
 * when longer). */
static inline void sf__json_path_add(char *path, size_t *len, size_t cap, const char *name, int i)
{
    int w = name ? snprintf(path + *len, cap - *len, "%s%.64s", *len ? "." : "", name)
                 : snprintf(path + *len, cap - *len, "[%d]", i);
    if (w > 0)
        *len += (size_t)w < cap - *len ? (size_t)w : cap - *len - 1;
}

/* The children of item in document order, the order of their tokens. */
static inline int sf__json_nul_walk(const cJSON *item, const char **pp, const char *end, char *path,
                                    size_t len, size_t cap, char *where, size_t where_len)
{
    int i = 0;
    for (const cJSON *c = item->child; c; c = c->next, i++) {
        size_t l = len;
        if (cJSON_IsObject(item)) {
            /* A name cut to nothing by its NUL is named by its place. */
            char place[32];
            snprintf(place, sizeof(place), "(member %d)", i);
            sf__json_path_add(path, &l, cap, c->string && *c->string ? c->string : place, 0);
            if (sf__json_next_string(pp, end) == 1) {
                snprintf(where, where_len, "the name of %s", path);
                return 1;
            }
        } else {
            sf__json_path_add(path, &l, cap, NULL, i);
        }
        if (cJSON_IsString(c) && sf__json_next_string(pp, end) == 1) {
            snprintf(where, where_len, "%s", path);
            return 1;
        }
        if ((cJSON_IsObject(c) || cJSON_IsArray(c)) &&
            sf__json_nul_walk(c, pp, end, path, l, cap, where, where_len))
            return 1;
        path[len] = 0;
    }
    return 0;
}

/*
 * Whether a string of the JSON document text[0, len), a member's name or a
 * value, holds an escaped NUL (\u0000). root is the value cJSON parsed
 * from text (strings found after it are not looked at). 0 when none does;
 * else 1, with the first one's place in where: "cache_dir", "sources[1]",
 * "shards[2].name", "the name of x.y" for a name, "(member 0)" for a
 * member whose name is only a NUL, "the document" for a lone string. A raw
 * NUL byte in text is for the caller to refuse first. Any thread.
 */
static inline int sf__json_nul_where_n(const char *text, size_t len, const cJSON *root, char *where,
                                       size_t where_len)
{
    if (!text || !root)
        return 0;
    const char *p = text, *end = text + len;
    int any = 0; /* the common case: no such escape anywhere */
    for (const char *q = text; !any && (q = memchr(q, '\\', (size_t)(end - q))) && end - q >= 6;
         q++)
        any = !memcmp(q + 1, "u0000", 5);
    if (!any)
        return 0;
    char path[256] = "";
    if (cJSON_IsString(root)) {
        if (sf__json_next_string(&p, end) != 1)
            return 0;
        snprintf(where, where_len, "the document");
        return 1;
    }
    return sf__json_nul_walk(root, &p, end, path, 0, sizeof(path), where, where_len);
}

/* Rewrites each escaped NUL of text[0, len) ("\u0000", not "\\u0000") as
 * "\u003f" ('?') in place; returns how many. For a document that holds
 * secrets and is refused anyway: parsed after this, no string of the tree
 * stops short of its end, so a wipe by strlen() reaches every byte cJSON
 * copied (sf__json_nul_where_n() on the original text still names the
 * field). Outside strings valid JSON has no backslash. */
static inline size_t sf__json_mask_nuls(char *text, size_t len)
{
    size_t n = 0;
    for (size_t i = 0; i + 1 < len; i++) {
        if (text[i] != '\\')
            continue;
        i++; /* the escaped character, never itself an escape */
        if (text[i] == 'u' && len - i >= 5 && !memcmp(text + i + 1, "0000", 4)) {
            memcpy(text + i + 1, "003f", 4);
            n++;
        }
    }
    return n;
}

/* sf__json_nul_where_n() of a NUL-terminated text. */
static inline int sf__json_nul_where(const char *text, const cJSON *root, char *where,
                                     size_t where_len)
{
    return text ? sf__json_nul_where_n(text, strlen(text), root, where, where_len) : 0;
}

#endif
