/* Loader options from JSON (src/loader_config.c), then the option check.
 * The whole input is the JSON text. */
#include "fuzz.h"
#include "shardfeed_loader.h"
#include "src/loader.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    char *json = (char *)fz_copy(data, size, 1);
    struct sf_loader_options o;
    sf_loader_options_init_default(&o);
    void *keep = NULL;
    char err[512];
    err[0] = '\0';
    sf_status st = sf_loader_options_from_json(&o, json, &keep, err, sizeof err);
    if (st == SF_OK) {
        err[0] = '\0';
        if (sf__loader_options_check(&o, err, sizeof err) != SF_OK)
            fz_check(err[0] != '\0', "a refused option without a message");
    } else {
        fz_check(err[0] != '\0' || st == SF_ERR_NO_MEMORY, "a failure without a message");
    }
    sf_loader_options_free_json(keep);
    free(json);
    return 0;
}
