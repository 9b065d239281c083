/* The emulated device's memory: page-aligned host buffers, device memory as
 * a memfd mapped twice (PROT_NONE for the host, a read-write shadow only the
 * emulator uses), and the bounds check that finds the shadow of a device
 * range. */

#include "src/gpu_emu_internal.h"

#include <errno.h>
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <unistd.h>

/* Under e->amu: the shadow address of [p, p + bytes) in one allocation. */
unsigned char *sf__emu_shadow_of(struct sf__emu *e, const void *p, size_t bytes)
{
    uintptr_t a = (uintptr_t)p;
    for (struct emu_alloc *m = e->allocs; m; m = m->next) {
        uintptr_t d = (uintptr_t)m->dev;
        if (a >= d && a < d + m->bytes)
            return bytes <= m->bytes - (a - d) ? m->shadow + (a - d) : NULL;
    }
    return NULL;
}

/* ------------------------------------------------------------------ alloc and free */

int sf__emu_host_alloc(void *ctx, void **p, size_t bytes)
{
    *p = NULL;
    int rc = sf__emu_count_op(ctx, 0, NULL, NULL);
    if (rc)
        return rc;
    if (posix_memalign(p, 4096, bytes ? bytes : 1) != 0) {
        *p = NULL;
        return EMU_NO_MEMORY;
    }
    return 0;
}

int sf__emu_host_free(void *ctx, void *p)
{
    (void)ctx;
    free(p);
    return 0;
}

int sf__emu_dev_alloc(void *ctx, void **p, size_t bytes)
{
    struct sf__emu *e = ctx;
    *p = NULL;
    int rc = sf__emu_count_op(e, 0, NULL, NULL);
    if (rc)
        return rc;
    long page = sysconf(_SC_PAGESIZE);
    size_t map = bytes == 0 ? 0 : (bytes + (size_t)page - 1) / (size_t)page * (size_t)page;
    pthread_mutex_lock(&e->amu);
    uint64_t used = e->mem_used;
    int fits = map >= bytes && bytes > 0 && map <= e->o.mem_bytes - used;
    if (fits)
        e->mem_used += map;
    pthread_mutex_unlock(&e->amu);
    if (!fits) {
        pthread_mutex_lock(&e->mu);
        if (bytes == 0 || map < bytes)
            rc = sf__emu_fail_locked(e, EMU_INVALID_VALUE, "device alloc of %zu bytes", bytes);
        else
            rc = sf__emu_fail_locked(e, EMU_NO_MEMORY,
                             "device alloc of %zu bytes: %" PRIu64 " of %" PRIu64
                             " bytes in use",
                             bytes, used, e->o.mem_bytes);
        pthread_mutex_unlock(&e->mu);
        return rc;
    }
    struct emu_alloc *m = calloc(1, sizeof *m);
    int fd = memfd_create("sf-emulated-device", MFD_CLOEXEC);
    void *dev = MAP_FAILED, *shadow = MAP_FAILED;
    if (m && fd >= 0 && ftruncate(fd, (off_t)map) == 0) {
        dev = mmap(NULL, map, PROT_NONE, MAP_SHARED, fd, 0);
        shadow = mmap(NULL, map, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
    }
    if (fd >= 0)
        close(fd);
    int err = errno ? errno : ENOMEM;
    pthread_mutex_lock(&e->amu);
    int ok = m && dev != MAP_FAILED && shadow != MAP_FAILED;
    if (!ok) {
        e->mem_used -= map;
    } else {
        m->dev = dev;
        m->shadow = shadow;
        m->bytes = bytes;
        m->map_bytes = map;
        m->next = e->allocs;
        e->allocs = m;
        *p = dev;
    }
    pthread_mutex_unlock(&e->amu);
    if (!ok) {
        pthread_mutex_lock(&e->mu);
        rc = sf__emu_fail_locked(e, EMU_NO_MEMORY, "device alloc of %zu bytes: %s", bytes,
                                 strerror(err));
        pthread_mutex_unlock(&e->mu);
    }
    if (rc) {
        if (dev != MAP_FAILED)
            munmap(dev, map);
        if (shadow != MAP_FAILED)
            munmap(shadow, map);
        free(m);
    }
    return rc;
}

int sf__emu_dev_free(void *ctx, void *p)
{
    struct sf__emu *e = ctx;
    if (p == NULL)
        return 0;
    pthread_mutex_lock(&e->amu);
    struct emu_alloc **pp = &e->allocs, *m = NULL;
    for (; *pp; pp = &(*pp)->next) {
        if ((*pp)->dev == p) {
            m = *pp;
            *pp = m->next;
            e->mem_used -= m->map_bytes;
            break;
        }
    }
    pthread_mutex_unlock(&e->amu);
    int rc = 0;
    if (!m) {
        pthread_mutex_lock(&e->mu);
        rc = sf__emu_fail_locked(e, EMU_INVALID_VALUE, "device free of %p: not allocated", p);
        pthread_mutex_unlock(&e->mu);
    }
    if (m) {
        munmap(m->dev, m->map_bytes);
        munmap(m->shadow, m->map_bytes);
        free(m);
    }
    return rc;
}

int sf__emu_peek(struct sf__emu *e, void *dst, const void *dev, size_t bytes)
{
    pthread_mutex_lock(&e->amu);
    const unsigned char *p = sf__emu_shadow_of(e, dev, bytes);
    if (p)
        memcpy(dst, p, bytes);
    pthread_mutex_unlock(&e->amu);
    return p ? 0 : EMU_INVALID_VALUE;
}

int sf__emu_is_device_ptr(const struct sf__emu *e, const void *p)
{
    pthread_mutex_lock((pthread_mutex_t *)&e->amu);
    int yes = sf__emu_shadow_of((struct sf__emu *)e, p, 1) != NULL;
    pthread_mutex_unlock((pthread_mutex_t *)&e->amu);
    return yes;
}
