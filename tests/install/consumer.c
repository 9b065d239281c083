/* Uses the installed public API only. */
#include <shardfeed.h>

#include <stdio.h>
#include <string.h>

int main(void)
{
    if (strcmp(sf_version(), SF_VERSION_STRING) != 0) {
        fprintf(stderr, "header %s, library %s\n", SF_VERSION_STRING, sf_version());
        return 1;
    }
    if (strcmp(sf_status_name(SF_ERR_NOT_FOUND), "SF_ERR_NOT_FOUND") != 0)
        return 1;
    printf("consumer ok: shardfeed %s, %s\n", sf_version(), sf_status_str(SF_OK));
    return 0;
}
