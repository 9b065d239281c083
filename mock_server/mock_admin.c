/* The admin endpoints under /_mock/ (stats, health, reset, faults, fault):
 * unsigned and never counted in the statistics they report. */

#include "mock_server/mock_internal.h"

#include "mock_server/faults.h"
#include "mock_server/stats.h"
#include "common/strbuf.h"

#include <stdlib.h>
#include <string.h>

enum MHD_Result mock_admin(struct request *rq, struct MHD_Connection *conn)
{
    struct mock_server *srv = rq->srv;
    const char *what = rq->path + strlen("/_mock/");
    int get = strcmp(rq->method, "GET") == 0;
    int post = strcmp(rq->method, "POST") == 0 || strcmp(rq->method, "PUT") == 0;
    rq->op = "Admin";
    char err[512];
    if (get && strcmp(what, "stats") == 0) {
        char *json = mock_stats_json(srv->stats);
        if (!json)
            return MHD_NO;
        enum MHD_Result r = mock_respond_json(rq, conn, 200, json);
        free(json);
        return r;
    }
    if (get && strcmp(what, "health") == 0)
        return mock_respond_json(rq, conn, 200, "{\"ok\":true}");
    if (post && strcmp(what, "reset") == 0) {
        mock_stats_reset(srv->stats);
        return mock_respond_json(rq, conn, 200, "{\"ok\":true}");
    }
    if (get && strcmp(what, "faults") == 0) {
        char *text = mock_faults_describe(srv->faults);
        if (!text)
            return MHD_NO;
        struct sf__strbuf b;
        sf__strbuf_init(&b, 0);
        sf__strbuf_puts(&b, text);
        free(text);
        return mock_respond_buffer(rq, conn, 200, "text/plain", &b, NULL);
    }
    if (post && strcmp(what, "faults") == 0) {
        if (rq->body.err != SF_OK)
            return mock_respond_json(rq, conn, 413, "{\"error\":\"body too large\"}");
        if (mock_faults_set_rules(srv->faults, sf__strbuf_str(&rq->body), err, sizeof(err)) !=
            SF_OK) {
            struct sf__strbuf b;
            sf__strbuf_init(&b, 0);
            sf__strbuf_puts(&b, err);
            return mock_respond_buffer(rq, conn, 400, "text/plain", &b, NULL);
        }
        return mock_respond_json(rq, conn, 200, "{\"ok\":true}");
    }
    if (post && strcmp(what, "fault") == 0) {
        const char *prefix = mock_param_get(rq, "prefix");
        const char *fault = mock_param_get(rq, "fault");
        const char *count_s = mock_param_get(rq, "count");
        long count = count_s ? strtol(count_s, NULL, 10) : 1;
        if (!prefix)
            prefix = "";
        if (!fault || count < 1 || count > 1000000 ||
            mock_faults_queue(srv->faults, prefix, fault, (unsigned)count, err, sizeof(err)) !=
                SF_OK) {
            struct sf__strbuf b;
            sf__strbuf_init(&b, 0);
            sf__strbuf_puts(&b, fault ? err : "missing fault parameter");
            return mock_respond_buffer(rq, conn, 400, "text/plain", &b, NULL);
        }
        return mock_respond_json(rq, conn, 200, "{\"ok\":true}");
    }
    return mock_respond_json(rq, conn, 404, "{\"error\":\"no such admin endpoint\"}");
}
