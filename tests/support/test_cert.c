#include "support/test_cert.h"
