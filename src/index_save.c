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

/* A temporary file beside path, renamed over it once the whole text is
 * written (sf__write_file_whole, as tune -o). */
static sf_status save_local(const char *path, const char *text, size_t len, char *err,
                            size_t err_len)
{
    if (sf__write_file_whole(path, text, len) == 0)
        return SF_OK;
    int e = errno;
    return sf__fail(err, err_len, sf__errno_status(e), "%s: cannot create or write: %s", path,
                    strerror(e));
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
