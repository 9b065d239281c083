/* Small pieces of text parsing that protocol and file readers share. */
#ifndef SF_COMMON_TEXT_H
#define SF_COMMON_TEXT_H

#include <stddef.h>
#include <string.h>

/* Splits s[0..n) at the first sep: "name<sep>value", neither part trimmed.
 * 0 (and the outputs untouched) when s has no sep. */
static inline int sf__split_at(const char *s, size_t n, char sep, size_t *name_len,
                               const char **value, size_t *value_len)
{
    const char *at = memchr(s, sep, n);
    if (!at)
        return 0;
    *name_len = (size_t)(at - s);
    *value = at + 1;
    *value_len = n - *name_len - 1;
    return 1;
}

/* name for a message, into buf: whole when under SF__MSG_NAME_BYTES, else
 * its first 200 and last 100 bytes (each cut back to a whole UTF-8
 * character) around "...", so that a name near S3's 1024-byte key limit
 * cannot push what went wrong out of a fixed-size message. Returns buf. */
#define SF__MSG_NAME_BYTES 320
static inline const char *sf__msg_name(const char *name, char buf[SF__MSG_NAME_BYTES])
{
    size_t n = strlen(name);
    if (n < SF__MSG_NAME_BYTES) {
        memcpy(buf, name, n + 1);
        return buf;
    }
    size_t head = 200, tail = 100;
    while (head > 0 && ((unsigned char)name[head] & 0xC0) == 0x80)
        head--;
    while (tail > 0 && ((unsigned char)name[n - tail] & 0xC0) == 0x80)
        tail--;
    memcpy(buf, name, head);
    memcpy(buf + head, "...", 3);
    memcpy(buf + head + 3, name + n - tail, tail + 1);
    return buf;
}

#endif
