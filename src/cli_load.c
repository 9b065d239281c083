/* shardfeed load: placeholder until the loader lands. */
#include "cli.h"

int cli_cmd_load(int argc, char **argv)
{
    (void)argc;
    (void)argv;
    return 2;
}
