/* The AWS shared config and credentials files (s3/aws_config.c), read from
 * two memory files. Input: a byte choosing the profile, then the
 * credentials file, a NUL, then the config file. */
#include "fuzz.h"
#include "s3/aws_config.h"

#include <sys/mman.h>
#include <unistd.h>

static int mem_file(const char *name, char path[64])
{
    int fd = memfd_create(name, MFD_CLOEXEC);
    fz_check(fd >= 0, "memfd_create");
    snprintf(path, 64, "/proc/self/fd/%d", fd);
    return fd;
}

static void put(int fd, const char *s, size_t n)
{
    fz_check(ftruncate(fd, 0) == 0, "ftruncate");
    size_t at = 0;
    while (at < n) {
        ssize_t w = pwrite(fd, s + at, n - at, (off_t)at);
        fz_check(w > 0, "pwrite");
        at += (size_t)w;
    }
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
    static int cred_fd = -1, conf_fd = -1;
    static char cred_path[64], conf_path[64];
    if (cred_fd < 0) {
        cred_fd = mem_file("credentials", cred_path);
        conf_fd = mem_file("config", conf_path);
    }
    static const char *const names[] = {"default", "dev", "prod", "a b", "profile", "s3"};
    struct fz f = {data, size};
    const char *name = names[fz_u8(&f) % (sizeof names / sizeof names[0])];
    size_t cred_len;
    char *cred = fz_str(&f, &cred_len);
    put(cred_fd, cred, cred_len);
    put(conf_fd, (const char *)f.p, f.n);
    free(cred);

    struct sf__aws_profile p;
    char err[256];
    sf_status st = sf__aws_profile_load_files(name, cred_path, conf_path, &p, err, sizeof err);
    if (st == SF_OK) {
        fz_check(p.name && !strcmp(p.name, name), "profile name");
        /* Values are single-line strings. */
        const char *v[] = {p.aws_access_key_id, p.aws_secret_access_key,
                           p.aws_session_token, p.region,
                           p.endpoint_url,      p.ca_bundle,
                           p.addressing_style};
        for (size_t i = 0; i < sizeof v / sizeof v[0]; i++)
            fz_check(!v[i] || !strchr(v[i], '\n'), "a value with a newline");
    } else {
        fz_check(err[0] != '\0', "a failure without a message");
    }
    sf__aws_profile_free(&p);
    return 0;
}
