/* A deliberately broken ordering, for the ThreadSanitizer build: the host
 * batch is refilled after sf__gpu_submit and before sf__gpu_wait, while the
 * emulated copy engine may still be reading it (the ring's rule: a host slot
 * stays untouched until its copy is waited for). ctest expects TSan to
 * report the data race; a TSan build that stays silent here would not
 * prove anything by staying silent on the real suite.
 * With "ordered" as argument the program waits first: no race, no report. */
#include "src/gpu.h"
#include "src/gpu_dev.h"

#include <stdio.h>
#include <string.h>

int main(int argc, char **argv)
{
    int ordered = argc > 1 && !strcmp(argv[1], "ordered");
    /* The copy runs 20..40 ms after it is queued: long after the memset. */
    struct sf__emu_options eo;
    sf__emu_options_default(&eo);
    eo.delay_us = 20000;
    struct sf__gpu_config c = {SF__GPU_EMULATED, 0, 1, 1 << 16, 0, &eo};
    struct sf_gpu *g = NULL;
    char err[256] = "";
    if (sf__gpu_open(&c, &g, err, sizeof err) != SF_OK) {
        fprintf(stderr, "gpu_race: %s\n", err);
        return 2;
    }
    static unsigned char host[1 << 16];
    memset(host, 1, sizeof host);
    struct sf__gpu_job job = {.host = host, .bytes = sizeof host};
    if (sf__gpu_submit(g, 0, &job, err, sizeof err) != SF_OK) {
        fprintf(stderr, "gpu_race: %s\n", err);
        return 2;
    }
    if (ordered && sf__gpu_wait(g, 0, NULL, err, sizeof err) != SF_OK) {
        fprintf(stderr, "gpu_race: %s\n", err);
        return 2;
    }
    memset(host, 2, sizeof host); /* the broken order: before the wait */
    if (sf__gpu_wait(g, 0, NULL, err, sizeof err) != SF_OK) {
        fprintf(stderr, "gpu_race: %s\n", err);
        return 2;
    }
    sf__gpu_close(g);
    printf("gpu_race: done (%s)\n", ordered ? "ordered" : "racy");
    return 0;
}
