/* index.json as the loader reads it (src/index_json.c): sample counts for three
 * shards. The whole input is the JSON text. */
#include "fuzz.h"
#include "shardfeed.h"
#include "src/index_json.h"

#include <math.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = (char *)fz_copy(data, size, 1);
    struct sf_object_info a = {.url = "s3://b/ds/train-000000.tar"};
    struct sf_object_info b = {.url = "s3://b/ds/train-000001.sfr"};
    struct sf_object_info c = {.url = "/data/x.tar"};
    const struct sf_object_info *objs[] = {&a, &b, &c};
    uint64_t counts[3] = {0, 0, 0};
    int all = -1;
    char err[256];
    err[0] = '\0';
    sf_status st =
        sf__index_json_counts(json, "index.json", objs, 3, counts, &all, err, sizeof err);
    /* The field: a count's ("samples"), or where a string holds a NUL (a
     * refusal this invariant predates; that the place is named even when
     * the name is cut to nothing is test_index.c's to check, as the names
     * are the input's own text). */
    if (st != SF_OK)
        fz_check(all == 0 && strstr(err, "index.json") &&
                     (strstr(err, "samples") || strstr(err, "NUL character")),
                 "a refusal that does not name the index and the field: %s", err);
    else
        fz_check(all == 0 || all == 1, "all %d", all);
    free(json);
    return 0;
}
