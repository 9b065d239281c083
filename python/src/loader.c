#include "sfpy.h"
int sfpy_loader_init(PyObject *module) { (void)module; return 0; }
