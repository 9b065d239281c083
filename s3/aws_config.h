/*
 * The AWS shared configuration files, read as the AWS CLI and SDKs read them:
 *   credentials: $AWS_SHARED_CREDENTIALS_FILE, else ~/.aws/credentials,
 *                sections "[name]";
 *   config:      $AWS_CONFIG_FILE, else ~/.aws/config, sections "[default]"
 *                and "[profile name]" (and "[name]" is ignored for non-default,
 *                as the CLI does), with nested sub-sections such as
 *                "s3 =\n  endpoint_url = ..." (indented lines).
 * Values from the credentials file win over the config file for keys.
 * Comments start with '#' or ';' at the start of a line (or after
 * whitespace). The files are untrusted: lines are capped at 64 KiB, files at
 * 4 MiB.
 */
#ifndef SF_S3_AWS_CONFIG_H
#define SF_S3_AWS_CONFIG_H

#include "shardfeed/common.h"

#include <stddef.h>

/* The settings of one profile that shardfeed uses; NULL when absent.
 * Every string is malloc'd. */
struct sf__aws_profile {
    char *name;
    char *aws_access_key_id;
    char *aws_secret_access_key;
    char *aws_session_token;
    char *region;
    char *endpoint_url; /* "s3 = endpoint_url" sub-section wins over top-level endpoint_url */
    char *ca_bundle;
    char *addressing_style; /* s3 sub-section "addressing_style" (path/virtual/auto) */
    int found;              /* 1 when the profile exists in either file */
};

/*
 * Loads profile `name` (NULL: $AWS_PROFILE, else "default"). Missing files
 * are not an error (found = 0). A file that exists but cannot be read, or is
 * over the caps, is SF_ERR_IO / SF_ERR_LIMIT with a message in err naming
 * the file (never a value from it).
 */
sf_status sf__aws_profile_load(const char *name, struct sf__aws_profile *out, char *err,
                               size_t err_len);

/*
 * The same, from explicit paths (either may be NULL: no such file) instead
 * of the environment. For callers that resolve the environment once and read
 * the files later (the credential chain reads env in sf__cred_chain_new and
 * the files on the first get). name may not be NULL.
 */
sf_status sf__aws_profile_load_files(const char *name, const char *credentials_path,
                                     const char *config_path, struct sf__aws_profile *out,
                                     char *err, size_t err_len);

/* Frees the strings and zeroes *p. p may be NULL; a zeroed struct is fine. */
void sf__aws_profile_free(struct sf__aws_profile *p);

/* Path of the file as resolved from the environment (malloc'd), for messages.
 * which: 0 = credentials, 1 = config. NULL when HOME is unset and no override. */
char *sf__aws_config_path(int which);

#endif
