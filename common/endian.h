/* Little-endian integers in byte buffers (on-disk formats, checkpoints):
 * byte by byte, so any alignment and any host order. */
#ifndef SF_COMMON_ENDIAN_H
#define SF_COMMON_ENDIAN_H

#include <stdint.h>

static inline uint32_t sf__get_le32(const unsigned char *p)
{
    return (uint32_t)p[0] | (uint32_t)p[1] << 8 | (uint32_t)p[2] << 16 | (uint32_t)p[3] << 24;
}

static inline uint64_t sf__get_le64(const unsigned char *p)
{
    return (uint64_t)sf__get_le32(p) | (uint64_t)sf__get_le32(p + 4) << 32;
}

static inline void sf__put_le32(unsigned char *p, uint32_t v)
{
    for (int i = 0; i < 4; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

static inline void sf__put_le64(unsigned char *p, uint64_t v)
{
    for (int i = 0; i < 8; i++)
        p[i] = (unsigned char)(v >> (8 * i));
}

#endif
