#include "sfpy.h"
