/* Test support: the one client of a suite that drives the mock, made from
 * the suite's own defaults. The suite's fixture defines opts_init; this
 * file defines s3 and the ways of making it, so suites with the same
 * clients share one definition of them. */
#ifndef SF_TEST_SUITE_CLIENT_H
#define SF_TEST_SUITE_CLIENT_H

#include "shardfeed_s3.h"

extern struct sf_s3 *s3; /* the client, once made */

/* The suite's client options (defined by the suite's fixture). */
void opts_init(struct sf_s3_options *o);
/* s3 = a client with o. */
void client(const struct sf_s3_options *o);
/* s3 = a client with opts_init's options. */
void default_client(void);
/* s3 = a client with opts_init's options that does not sign (no keys). */
void unsigned_client(void);

#endif
