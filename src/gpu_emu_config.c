/* The emulated device's options: the documented defaults (docs/gpu.md) and
 * the SF_GPU_EMULATOR parser. */

#include "src/gpu_dev.h"

#include <errno.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* ------------------------------------------------------------------ options */

void sf__emu_options_default(struct sf__emu_options *o)
{
    memset(o, 0, sizeof *o);
    o->seed = 1;
    o->delay_us = 200;
    o->units = 2;
    o->mem_bytes = (uint64_t)4 << 30;
}

int sf__emu_options_from_env(struct sf__emu_options *o, char *err, size_t err_len)
{
    const char *v = getenv("SF_GPU_EMULATOR");
    if (v == NULL || !*v)
        return 0;
    char buf[256];
    if (strlen(v) >= sizeof buf) {
        snprintf(err, err_len, "SF_GPU_EMULATOR: longer than %zu bytes", sizeof buf - 1);
        return -1;
    }
    strcpy(buf, v);
    char *save = NULL;
    for (char *kv = strtok_r(buf, ",", &save); kv; kv = strtok_r(NULL, ",", &save)) {
        char *eq = strchr(kv, '=');
        char *end = NULL;
        unsigned long long n = 0;
        /* Digits only: strtoull would also take a sign ("-1" as 2^64 - 1)
         * and leading blanks. */
        if (eq && (eq[1] < '0' || eq[1] > '9'))
            eq = NULL;
        if (eq) {
            errno = 0;
            n = strtoull(eq + 1, &end, 10);
        }
        if (!eq || !eq[1] || *end || errno) {
            snprintf(err, err_len, "SF_GPU_EMULATOR: \"%s\" is not key=number", kv);
            return -1;
        }
        *eq = '\0';
        if (!strcmp(kv, "seed"))
            o->seed = n;
        else if (!strcmp(kv, "delay_us") && n <= 1000000)
            o->delay_us = (unsigned)n;
        else if (!strcmp(kv, "fail_at"))
            o->fail_at = (unsigned long)n;
        else if (!strcmp(kv, "fail_async") && n <= 1)
            o->fail_async = (int)n;
        else if (!strcmp(kv, "units") && n >= 1 && n <= 1024)
            o->units = (int)n;
        else if (!strcmp(kv, "mem_mib") && n >= 1 && n <= ((uint64_t)1 << 24))
            o->mem_bytes = (uint64_t)n << 20;
        else if (!strcmp(kv, "kernel_fault") && n <= 2)
            o->kernel_fault = (int)n;
        else {
            snprintf(err, err_len,
                     "SF_GPU_EMULATOR: %s=%llu (keys: seed, delay_us 0..1000000, fail_at, "
                     "fail_async 0..1, units 1..1024, mem_mib 1..16777216, kernel_fault 0..2)",
                     kv, n);
            return -1;
        }
    }
    return 0;
}
