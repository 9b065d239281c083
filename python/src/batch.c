#include "sfpy.h"
int sfpy_batch_init(PyObject *module) { (void)module; return 0; }
