/*
 * eventd.h: emit events into eventd's per-CPU rings from C or C++.
 *
 *   eventd_t *ev;
 *   eventd_open(NULL, "backup", &ev);              // rings: $EVENTD_KMES_DIR, ...
 *   eventd_emit(ev, EVENTD_ERR, "nightly", "backup failed", "{\"tries\":3}");
 *   eventd_field_t f[1] = {{"tries", EVENTD_KIND_I64, {0}}};
 *   f[0].value.i64 = 3;
 *   eventd_emit_fields(ev, EVENTD_ERR, "nightly", "backup failed", f, 1);
 *   eventd_close(ev);
 *
 * Build:  cc prog.c -I clients/c/include -L target/release -leventd
 *         (static: target/release/libeventd.a -lpthread -ldl -lm -Wl,--gc-sections)
 *
 * One emit writes one record into the ring of the CPU the calling thread
 * runs on: no system call, no lock, never a wait for eventd. An emit that
 * cannot be written (no rings yet, too large, not allowed) returns a
 * negative code, is counted (eventd_dropped) and costs little; the program
 * goes on. The first time the rings cannot be opened is said once on
 * stderr; they are tried again once a second.
 *
 * ABI rules: eventd_t is opaque and only used through a pointer; all
 * arguments are C types (NUL-terminated UTF-8 strings, int, size_t,
 * uint64_t); no C++ exception or Rust panic crosses these functions (an
 * internal failure returns EVENTD_E_INTERNAL); nothing is allocated for
 * the caller except the handle, freed by eventd_close. Every function is
 * thread safe and may run on one handle from many threads at once, except
 * eventd_close, which must be the handle's last call. Strings are only
 * read during the call. New functions may be added in later versions;
 * existing ones keep their signatures and codes.
 */
#ifndef EVENTD_H
#define EVENTD_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

/* Syslog severities, as eventd stores them in `level`. */
enum eventd_level {
    EVENTD_EMERG = 0,
    EVENTD_ALERT = 1,
    EVENTD_CRIT = 2,
    EVENTD_ERR = 3,
    EVENTD_WARNING = 4,
    EVENTD_NOTICE = 5,
    EVENTD_INFO = 6,
    EVENTD_DEBUG = 7
};

/* Results: 0, or one of these (negative). All but EVENTD_E_INVALID mean
 * the event was dropped and counted. */
#define EVENTD_OK 0
#define EVENTD_E_INVALID (-1)    /* NULL handle or message, not UTF-8, level outside 0..7 */
#define EVENTD_E_NO_RINGS (-2)   /* the ring directory or this CPU's ring does not exist */
#define EVENTD_E_PERMISSION (-3) /* not allowed to open the rings (eventd's ProducerGroup) */
#define EVENTD_E_TOO_LARGE (-4)  /* larger than a ring record holds */
#define EVENTD_E_BUSY (-5)       /* the ring was contended or replaced under the event */
#define EVENTD_E_FAILED (-6)     /* the ring could not be written (damaged, I/O) */
#define EVENTD_E_INTERNAL (-7)   /* a bug in libeventd, caught */
#define EVENTD_E_LIMITED (-8)    /* past this provider's rate limit in this process (EVENTD_RATE_LIMIT) */

typedef struct eventd eventd_t;

/* Makes a handle in *out. kmes_dir NULL: $EVENTD_KMES_DIR, else
 * $EVENTD_DATA_DIR/kmes, else ./eventd-data/kmes. provider NULL: the
 * program's name; at most 255 bytes are kept. Succeeds whether or not the
 * rings exist yet; EVENTD_E_INVALID for a NULL out or non-UTF-8 text. */
int eventd_open(const char *kmes_dir, const char *provider, eventd_t **out);

/* One event. name may be NULL (""), at most 255 bytes are kept;
 * fields_json NULL, "" or the text of a JSON object (eventd stores other
 * text as {"invalid_fields": "..."}). */
int eventd_emit(const eventd_t *ev, int level, const char *name, const char *message,
                const char *fields_json);

/* One event with n string fields keys[i] = values[i] (escaped for you). */
int eventd_emit_kv(const eventd_t *ev, int level, const char *name, const char *message,
                   size_t n, const char *const *keys, const char *const *values);

/* Kinds of a typed field's value: which member of eventd_field_t's value
 * is set. */
#define EVENTD_KIND_I64 1  /* value.i64 */
#define EVENTD_KIND_U64 2  /* value.u64 */
#define EVENTD_KIND_F64 3  /* value.f64 (NaN and the infinities are stored as text) */
#define EVENTD_KIND_BOOL 4 /* value.boolean, 0 false, anything else true */
#define EVENTD_KIND_STR 5  /* value.str, NUL-terminated UTF-8 */

/* One typed field. The key is NUL-terminated UTF-8 (at most 255 bytes are
 * kept). */
typedef struct eventd_field {
    const char *key;
    int kind;
    union {
        int64_t i64;
        uint64_t u64;
        double f64;
        int boolean;
        const char *str;
    } value;
} eventd_field_t;

/* One event with n typed fields: numbers and booleans are stored as JSON
 * numbers and booleans, without being formatted on the way (the fastest
 * emit). fields may be NULL when n is 0; EVENTD_E_INVALID for an unknown
 * kind or a NULL key or string. */
int eventd_emit_fields(const eventd_t *ev, int level, const char *name, const char *message,
                       const eventd_field_t *fields, size_t n);

/* Events written, and dropped, through this handle so far. */
uint64_t eventd_emitted(const eventd_t *ev);
uint64_t eventd_dropped(const eventd_t *ev);

/* Frees the handle (NULL is ignored). */
void eventd_close(eventd_t *ev);

/* A static description of a result code; never NULL, never to be freed. */
const char *eventd_strerror(int code);

/* The library's version ("0.1.0"), static; never NULL, never to be freed.
 * A program built against one version may check the one it runs with. */
const char *eventd_version(void);

#ifdef __cplusplus
}
#endif

#endif /* EVENTD_H */
