/* Emits from several threads through libeventd and says what it did.
 *
 *   threads KMES_DIR THREADS EVENTS_PER_THREAD
 *
 * Every event: level err for every tenth, else info; name "worker";
 * message "thread T event I"; fields {"thread": T, "i": I, "even": bool,
 * "ratio": I/EVENTS} as JSON, every other one through eventd_emit_kv
 * (string fields). Prints "emitted N dropped M" and exits 0 whatever
 * eventd did: a producer never fails its program. */
#include "eventd.h"

#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>

static eventd_t *ev;
static long per_thread;

static void *work(void *arg) {
    long t = (long)arg;
    char message[96], fields[160], tv[24], iv[24];
    for (long i = 0; i < per_thread; i++) {
        int level = i % 10 == 0 ? EVENTD_ERR : EVENTD_INFO;
        snprintf(message, sizeof message, "thread %ld event %ld", t, i);
        if (i % 2 == 0) {
            snprintf(fields, sizeof fields,
                     "{\"thread\":%ld,\"i\":%ld,\"even\":true,\"ratio\":%.4f}", t, i,
                     (double)i / (double)per_thread);
            eventd_emit(ev, level, "worker", message, fields);
        } else {
            const char *keys[] = {"thread", "i", "even"};
            snprintf(tv, sizeof tv, "%ld", t);
            snprintf(iv, sizeof iv, "%ld", i);
            const char *values[] = {tv, iv, "no"};
            eventd_emit_kv(ev, level, "worker", message, 3, keys, values);
        }
    }
    return NULL;
}

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: %s KMES_DIR THREADS EVENTS_PER_THREAD\n", argv[0]);
        return 2;
    }
    int rc = eventd_open(argv[1], "c-threads", &ev);
    if (rc != EVENTD_OK) {
        fprintf(stderr, "eventd_open: %s\n", eventd_strerror(rc));
        return 1;
    }
    long threads = atol(argv[2]);
    per_thread = atol(argv[3]);
    pthread_t *ids = calloc((size_t)threads, sizeof *ids);
    for (long t = 0; t < threads; t++)
        pthread_create(&ids[t], NULL, work, (void *)t);
    for (long t = 0; t < threads; t++)
        pthread_join(ids[t], NULL);
    free(ids);
    /* A bad call is refused, not fatal. */
    if (eventd_emit(ev, 9, "bad", "level nine", NULL) != EVENTD_E_INVALID)
        return 3;
    printf("emitted %llu dropped %llu\n", (unsigned long long)eventd_emitted(ev),
           (unsigned long long)eventd_dropped(ev));
    eventd_close(ev);
    return 0;
}
