/* shardfeed command-line tool. Uses the public API only. */
#include "shardfeed.h"

#include <stdio.h>
#include <string.h>

static void usage(FILE *f)
{
    fputs("usage: shardfeed COMMAND [options]\n"
          "\n"
          "Commands:\n"
          "  version     print the library version and what this build supports\n"
          "  help        this text\n"
          "\n"
          "The local S3-compatible test server is a separate program,\n"
          "shardfeed-mock-s3 (see docs/mock-server.md).\n",
          f);
}

static int cmd_version(void)
{
    printf("shardfeed %s\n", sf_version());
    printf("cuda: %s", sf_cuda_compiled() ? "compiled in" : "not compiled in");
    if (sf_cuda_compiled())
        printf(", %d device(s) visible", sf_cuda_device_count());
    printf("\n");
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 2) {
        usage(stderr);
        return 2;
    }
    const char *cmd = argv[1];
    if (strcmp(cmd, "version") == 0 || strcmp(cmd, "--version") == 0)
        return cmd_version();
    if (strcmp(cmd, "help") == 0 || strcmp(cmd, "--help") == 0 || strcmp(cmd, "-h") == 0) {
        usage(stdout);
        return 0;
    }
    fprintf(stderr, "shardfeed: unknown command '%s'\n", cmd);
    usage(stderr);
    return 2;
}
