/* Replays files through one fuzz harness's LLVMFuzzerTestOneInput(), built
 * with the normal compiler: ctest runs it on tests/fuzz/regressions/<harness>/
 * and corpus/<harness>/ in the normal and the ASan + UBSan builds, so every
 * input that once crashed stays a test (docs/testing.md).
 *
 *   fuzz_replay_<harness> FILE_OR_DIR...
 *
 * A path that does not exist is skipped. Exit status: 0 when every input
 * ran (a crash aborts), 1 when an input cannot be read or there was none. */
#include "fuzz.h"

#include "common/dirnames.h"

#include <errno.h>
#include <sys/stat.h>

static int run_file(const char *path)
{
    FILE *f = fopen(path, "rb");
    if (!f) {
        fprintf(stderr, "replay: %s: %s\n", path, strerror(errno));
        return -1;
    }
    unsigned char *buf = NULL;
    size_t n = 0, cap = 0;
    for (;;) {
        unsigned char *nb = sf__grow(buf, n, &cap, 1, 65536);
        if (!nb) {
            free(buf);
            fclose(f);
            fprintf(stderr, "replay: %s: out of memory\n", path);
            return -1;
        }
        buf = nb;
        size_t r = fread(buf + n, 1, cap - n, f);
        n += r;
        if (r == 0)
            break;
    }
    int bad = ferror(f);
    fclose(f);
    if (bad) {
        free(buf);
        fprintf(stderr, "replay: %s: read error\n", path);
        return -1;
    }
    /* An exact-size copy, as libFuzzer passes it. */
    unsigned char *exact = malloc(n ? n : 1);
    if (!exact) {
        free(buf);
        return -1;
    }
    if (n)
        memcpy(exact, buf, n);
    free(buf);
    LLVMFuzzerTestOneInput(exact, n);
    free(exact);
    return 0;
}

/* sf__dirnames filter: not ., .., .gitkeep. */
static int not_hidden(const char *dir, const char *name, void *user)
{
    (void)dir;
    (void)user;
    return name[0] != '.';
}

/* Runs every regular file of dir, in name order; returns how many, -1 on error. */
static long run_dir(const char *dir)
{
    char **names;
    size_t n;
    if (sf__dirnames(dir, not_hidden, NULL, &names, &n) != 0) {
        fprintf(stderr, "replay: %s: %s\n", dir, strerror(errno));
        return -1;
    }
    long ran = 0;
    for (size_t i = 0; i < n; i++) {
        char path[4096];
        snprintf(path, sizeof(path), "%s/%s", dir, names[i]);
        struct stat st;
        if (stat(path, &st) == 0 && S_ISREG(st.st_mode)) {
            if (run_file(path) != 0)
                ran = -1;
            else if (ran >= 0)
                ran++;
        }
    }
    sf__strv_free(names, n);
    return ran;
}

int main(int argc, char **argv)
{
    long total = 0;
    int failed = 0;
    for (int i = 1; i < argc; i++) {
        struct stat st;
        if (stat(argv[i], &st) != 0) {
            /* regressions/<harness>/ exists once a finding has been kept. */
            if (errno != ENOENT) {
                fprintf(stderr, "replay: %s: %s\n", argv[i], strerror(errno));
                failed = 1;
            }
            continue;
        }
        if (S_ISDIR(st.st_mode)) {
            long r = run_dir(argv[i]);
            if (r < 0)
                failed = 1;
            else
                total += r;
        } else if (run_file(argv[i]) != 0) {
            failed = 1;
        } else {
            total++;
        }
    }
    printf("replayed %ld inputs\n", total);
    return failed || total == 0 ? 1 : 0;
}
