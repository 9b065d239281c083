/* Module-level tools (ls, stat, warm_cache, pack, index): being written. */
#include "sfpy.h"
int sfpy_tools_init(PyObject *module)
{
    (void)module;
    return 0;
}
