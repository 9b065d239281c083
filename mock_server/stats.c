#include "mock_server/stats.h"

#include <cjson/cJSON.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

struct mock_stats {
    pthread_mutex_t lock; /* guards root */
    cJSON *root;
};

static cJSON *fresh_root(void)
{
    cJSON *root = cJSON_CreateObject();
    if (!root)
        return NULL;
    cJSON_AddNumberToObject(root, "requests", 0);
    cJSON_AddNumberToObject(root, "bytes_sent", 0);
    cJSON_AddNumberToObject(root, "bytes_received", 0);
    cJSON_AddObjectToObject(root, "operations");
    cJSON_AddObjectToObject(root, "status");
    cJSON_AddObjectToObject(root, "faults");
    cJSON_AddObjectToObject(root, "keys");
    /* Credential endpoints are not S3 requests: they have their own counters,
     * present from the start so a reader can rely on every name. */
    cJSON *creds = cJSON_AddObjectToObject(root, "credentials");
    static const char *const names[] = {"imds_token", "imds_role_list", "imds_credentials",
                                        "container", "expired_token_rejections"};
    for (size_t i = 0; creds && i < sizeof(names) / sizeof(names[0]); i++)
        cJSON_AddNumberToObject(creds, names[i], 0);
    return root;
}

sf_status mock_stats_new(struct mock_stats **out)
{
    struct mock_stats *s = calloc(1, sizeof(*s));
    if (!s)
        return SF_ERR_NO_MEMORY;
    s->root = fresh_root();
    if (!s->root) {
        free(s);
        return SF_ERR_NO_MEMORY;
    }
    pthread_mutex_init(&s->lock, NULL);
    *out = s;
    return SF_OK;
}

void mock_stats_destroy(struct mock_stats *s)
{
    if (!s)
        return;
    cJSON_Delete(s->root);
    pthread_mutex_destroy(&s->lock);
    free(s);
}

/* Adds delta to obj[name], creating it at 0. Names are compared exactly:
 * object keys are case-sensitive. */
static void bump(cJSON *obj, const char *name, double delta)
{
    if (!obj)
        return;
    cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!item) {
        cJSON_AddNumberToObject(obj, name, delta);
        return;
    }
    cJSON_SetNumberValue(item, item->valuedouble + delta);
}

static cJSON *child(cJSON *obj, const char *name)
{
    cJSON *item = cJSON_GetObjectItemCaseSensitive(obj, name);
    if (!item)
        item = cJSON_AddObjectToObject(obj, name);
    return item;
}

void mock_stats_record(struct mock_stats *s, const char *op, int status, const char *key,
                       uint64_t bytes_sent, uint64_t bytes_received, const char *fault)
{
    char code[16];
    snprintf(code, sizeof(code), "%d", status);
    pthread_mutex_lock(&s->lock);
    cJSON *root = s->root;
    bump(root, "requests", 1);
    bump(root, "bytes_sent", (double)bytes_sent);
    bump(root, "bytes_received", (double)bytes_received);
    bump(child(root, "operations"), op, 1);
    bump(child(root, "status"), code, 1);
    if (fault)
        bump(child(root, "faults"), fault, 1);
    if (key) {
        cJSON *k = child(child(root, "keys"), key);
        bump(k, "requests", 1);
        bump(child(k, "operations"), op, 1);
        bump(child(k, "status"), code, 1);
    }
    pthread_mutex_unlock(&s->lock);
}

void mock_stats_unsent(struct mock_stats *s, uint64_t bytes)
{
    pthread_mutex_lock(&s->lock);
    bump(s->root, "bytes_sent", -(double)bytes);
    pthread_mutex_unlock(&s->lock);
}

void mock_stats_fault(struct mock_stats *s, const char *fault)
{
    pthread_mutex_lock(&s->lock);
    bump(child(s->root, "faults"), fault, 1);
    pthread_mutex_unlock(&s->lock);
}

void mock_stats_credential(struct mock_stats *s, const char *name)
{
    pthread_mutex_lock(&s->lock);
    bump(child(s->root, "credentials"), name, 1);
    pthread_mutex_unlock(&s->lock);
}

void mock_stats_count(struct mock_stats *s, const char *group, const char *name)
{
    pthread_mutex_lock(&s->lock);
    bump(child(s->root, group), name, 1);
    pthread_mutex_unlock(&s->lock);
}

char *mock_stats_json(struct mock_stats *s)
{
    pthread_mutex_lock(&s->lock);
    char *out = cJSON_PrintUnformatted(s->root);
    pthread_mutex_unlock(&s->lock);
    return out;
}

void mock_stats_reset(struct mock_stats *s)
{
    cJSON *root = fresh_root();
    if (!root)
        return;
    pthread_mutex_lock(&s->lock);
    cJSON_Delete(s->root);
    s->root = root;
    pthread_mutex_unlock(&s->lock);
}
