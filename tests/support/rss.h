/* Test support: what this process holds resident, read from
 * /proc/self/smaps. */
#ifndef SF_TEST_RSS_H
#define SF_TEST_RSS_H

/* The resident KiB of this process's mappings that start at start (when not
 * NULL) or map a file whose path begins with path_prefix (when not NULL),
 * summed. Fails the test (cr_assert) when smaps cannot be read. */
long test_mapped_rss_kib(const void *start, const char *path_prefix);

#endif
