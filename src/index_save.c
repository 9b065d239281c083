/* Where an index.json built by sf_index_shards() goes: S3 or a local file
 * (include/shardfeed_pack.h, sf_index_result_save). */
#include "shardfeed.h"
#include "shardfeed_pack.h"
#include "common/strbuf.h"
#include "common/file.h"
#include "common/io.h"

#include <errno.h>
#include <fcntl.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* A temporary file beside path, renamed over it once the whole text is written. */
static sf_status save_local(const char *path, const char *text, size_t len, char *err,
                            size_t err_len)
{
    const char *slash = strrchr(path, '/');
    size_t dl = slash ? (size_t)(slash - path + 1) : 0;
    size_t tl = strlen(path) + 64;
    char *tmp = malloc(tl);
    if (!tmp)
        return sf__fail(err, err_len, SF_ERR_NO_MEMORY, "%s: out of memory", path);
    snprintf(tmp, tl, "%.*s.%s.sfindex-%ld", (int)dl, path, path + dl, (long)getpid());
    int fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
    if (fd < 0) {
        int e = errno;
        sf_status st =
            sf__fail(err, err_len, sf__errno_status(e), "%s: cannot create: %s", tmp, strerror(e));
        free(tmp);
        return st;
    }
    sf_status st = SF_OK;
    size_t done;
    int rc = sf__write_full(fd, text, len, &done);
    if (rc)
        st = sf__fail(err, err_len, SF_ERR_IO, "%s: write at byte %zu: %s", tmp, done,
                      rc < 0 ? strerror(errno) : "no progress");
    if (close(fd) != 0 && st == SF_OK)
        st = sf__fail(err, err_len, SF_ERR_IO, "%s: close: %s", tmp, strerror(errno));
    if (st == SF_OK && rename(tmp, path) != 0)
        st = sf__fail(err, err_len, SF_ERR_IO, "%s: cannot rename into place: %s", path,
                      strerror(errno));
    if (st != SF_OK)
        unlink(tmp);
    free(tmp);
    return st;
}

SF_API sf_status sf_index_result_save(struct sf_s3 *s3, const struct sf_index_result *r,
                                      char *err, size_t err_len)
{
    if (!r || !r->json || !r->index_url)
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT, "no index to save");
    const char *url = r->index_url;
    if (!strncmp(url, "s3://", 5)) {
        if (!s3)
            return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                            "%s: an s3:// index needs a client", url);
        sf_status st = sf_s3_put(s3, url, NULL, r->json, r->json_len, NULL, 0);
        if (st != SF_OK && err && err_len)
            sf_s3_errmsg(s3, err, err_len);
        return st;
    }
    if (!strncmp(url, "http://", 7) || !strncmp(url, "https://", 8))
        return sf__fail(err, err_len, SF_ERR_INVALID_ARGUMENT,
                        "%s: cannot write over http(s); name a local path or an s3:// URL", url);
    return save_local(!strncmp(url, "file://", 7) ? url + 7 : url, r->json, r->json_len, err,
                      err_len);
}
