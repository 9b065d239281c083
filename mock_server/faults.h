/* Fault injection for the mock server: rules scoped by key prefix, faults
 * forced on one request by header, and faults queued for the next N requests. */
#ifndef SF_MOCK_FAULTS_H
#define SF_MOCK_FAULTS_H

#include "shardfeed/common.h"

#include <stddef.h>
#include <stdint.h>

/* What happens to one request. */
struct mock_fault_plan {
    int status;         /* 0, 400, 500 or 503: answer with this error instead */
    int throttled;      /* the 503 comes from the rate limit */
    int latency_ms;     /* sleep before answering */
    uint64_t bandwidth; /* bytes/s cap on the body, 0 = none */
    int64_t reset_at;   /* cut the body after this many bytes, -1 = never */
    int64_t stall_at;   /* stall when this many body bytes were sent, -1 = never */
    int stall_ms;
    int no206;            /* answer a ranged GET with 200 and the whole object */
    int no_content_range; /* drop Content-Range from a 206 */
    int etag_changed;     /* report a different ETag */
};

struct mock_faults;

sf_status mock_faults_new(uint64_t seed, struct mock_faults **out);
void mock_faults_destroy(struct mock_faults *f);

/*
 * Adds one rule from a SPEC ("prefix=b/x/,p503=0.1,latency_ms=5"). On error
 * writes a message naming the bad field into err.
 */
sf_status mock_faults_add_rule(struct mock_faults *f, const char *spec, char *err, size_t err_len);
/* Replaces every rule with the SPEC lines of text (newline separated; empty
 * and '#' lines ignored). All-or-nothing. */
sf_status mock_faults_set_rules(struct mock_faults *f, const char *text, char *err, size_t err_len);
/* Writes the current rules, one SPEC per line, into a malloc'd string. */
char *mock_faults_describe(struct mock_faults *f);

/* Queues fault F (header syntax) for the next count requests under prefix. */
sf_status mock_faults_queue(struct mock_faults *f, const char *prefix, const char *fault,
                            unsigned count, char *err, size_t err_len);

/* The operations faults apply to: body faults and the rate limit to GETs,
 * etag_change_after counts GETs and HEADs, errors and latency to all; a
 * queued 400 waits for a GET or a PUT (PutObject, UploadPart). MOCK_OP_OTHER
 * is every other object request (multipart uploads' POSTs, ListParts). */
enum mock_op_kind { MOCK_OP_GET, MOCK_OP_HEAD, MOCK_OP_PUT, MOCK_OP_DELETE, MOCK_OP_OTHER };

/*
 * Decides the faults of one object request. target is "bucket/key"; range the Range header or NULL;
 * forced the value of the x-sfmock-fault header or NULL; op the operation; body_len the length of
 * the body that would be sent. SF_ERR_PARSE when the forced header is malformed (message in err).
 */
sf_status mock_faults_plan(struct mock_faults *f, const char *target, const char *range,
                           const char *forced, enum mock_op_kind op, uint64_t body_len,
                           struct mock_fault_plan *plan, char *err, size_t err_len);

/* Parses one forced fault ("503", "reset=100", "stall=2000") into plan. */
sf_status mock_fault_apply_forced(struct mock_fault_plan *plan, const char *fault,
                                  uint64_t body_len);

/* Parses "8M", "512K", "1G", "100" (bytes, binary multiples). */
sf_status mock_parse_size(const char *s, uint64_t *out);

#endif
