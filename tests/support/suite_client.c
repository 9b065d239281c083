#include "support/suite_client.h"

#include "support/mock_env.h"

struct sf_s3 *s3;

void client(const struct sf_s3_options *o)
{
    s3 = mock_env_s3_new(o);
}

void default_client(void)
{
    s3 = mock_env_s3_from(opts_init, 0);
}

void unsigned_client(void)
{
    s3 = mock_env_s3_from(opts_init, 1);
}
