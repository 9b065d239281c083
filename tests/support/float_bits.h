/* Test support for the programs that compare floats bit for bit (gpu_diff,
 * test_gpu_ocl): a NaN pattern or -0.0f is told apart only by its bits. */
#ifndef SF_TEST_FLOAT_BITS_H
#define SF_TEST_FLOAT_BITS_H

#include <stdint.h>
#include <string.h>

/* The IEEE-754 bits of f. */
static inline uint32_t float_bits(float f)
{
    uint32_t u;
    memcpy(&u, &f, sizeof u);
    return u;
}

#endif
