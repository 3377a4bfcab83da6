/*
 * gpuprobe's native GPU sampler: the agent's per-tick NVML reads on their schedule, in C.
 *
 * It owns the schedule and the raw calls only. What a reading means (units, "not supported", "lost", the
 * sample's keys) is decided in Python (gpuprobe/nvml/native.py, gpuprobe/nvml/sensor.py), once: this file
 * knows NVML's C signatures and nothing else about GPUs.
 *
 *   - one thread, woken by clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME) on an absolute grid
 *     t0 + n * interval: a tick's cost never moves the next one. A tick that is already more than half an
 *     interval overdue when the previous one ends is skipped and counted (missed_ticks), as the Python
 *     sampler did.
 *   - per tick, per GPU: CLOCK_REALTIME just before the GPU is read, then its calls (the plan Python gave
 *     gs_start), consecutive field-value calls of one GPU batched into one nvmlDeviceGetFieldValues. The
 *     PCIe throughput calls (each one measures for ~20 ms on real GPUs) run after every GPU's other calls,
 *     so they delay no GPU's timestamp.
 *   - each tick is one fixed-size record (gs_record_header, the GPUs' timestamps, one gs_value per call)
 *     in a bounded ring. Python drains it once per flush; when it falls behind, the oldest records are
 *     overwritten and counted (overwritten), never silently.
 *   - a call that answers one of the "stop" codes (Python passes nvml.errors.GONE: GPU_IS_LOST and the
 *     like) ends that GPU's reads for the tick, and the GPU is skipped for retry_ticks ticks (the retry
 *     once per second that the sensor promises).
 *
 * NVML is reached through the libnvidia-ml.so.1 that the process already loaded (pynvml's): the same
 * library, so the same handles, whether it is NVIDIA's driver or gpuprobe's simulator.
 */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <errno.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

/* The ABI with gpuprobe/nvml/native.py: bump it with any change to the structures or the kinds below. */
#define GS_ABI 2

enum gs_kind {
    GS_FIELD = 0,          /* nvmlDeviceGetFieldValues, arg = field id (scope 0); a = the value's 8 bytes, b = valueType */
    GS_UTILIZATION = 1,    /* nvmlDeviceGetUtilizationRates: a = gpu, b = memory */
    GS_MEMORY_V2 = 2,      /* nvmlDeviceGetMemoryInfo_v2 (arg = struct version): a = used, b = total */
    GS_MEMORY = 3,         /* nvmlDeviceGetMemoryInfo: a = used, b = total */
    GS_POWER = 4,          /* nvmlDeviceGetPowerUsage: a = mW */
    GS_TEMPERATURE_V = 5,  /* nvmlDeviceGetTemperatureV (arg = struct version), GPU sensor: a = degrees (signed) */
    GS_TEMPERATURE = 6,    /* nvmlDeviceGetTemperature (arg = sensor): a = degrees */
    GS_FANS = 7,           /* nvmlDeviceGetFanSpeed_v2 of fans 0..arg-1: a = sum of %, b = fans read; rc = first failure */
    GS_CLOCK = 8,          /* nvmlDeviceGetClockInfo (arg = clock type): a = MHz */
    GS_EVENT_REASONS = 9,  /* nvmlDeviceGetCurrentClocksEventReasons: a = bitmask */
    GS_THROTTLE_REASONS = 10, /* nvmlDeviceGetCurrentClocksThrottleReasons (older drivers): a = bitmask */
    GS_ENFORCED_LIMIT = 11,   /* nvmlDeviceGetEnforcedPowerLimit: a = mW */
    GS_PCIE = 12,          /* nvmlDeviceGetPcieThroughput (arg = counter): a = KB/s; after every GPU's other calls */
    GS_KINDS
};

#define GS_NOT_READ (-1) /* gs_value.rc of a call not made on this tick (off its period, skipped, disabled) */
#define GS_MAX_FIELDS 64 /* field-value calls of one GPU */
#define GS_MAX_STOP 16
#define STOP_CHECK_NS 200000000LL

typedef struct {
    void *handle;     /* nvmlDevice_t */
    uint32_t first;   /* its calls: calls[first .. first + count) */
    uint32_t count;
} gs_gpu;

typedef struct {
    uint32_t kind;
    uint32_t arg;
    uint32_t every;   /* made on ticks n with n % every == phase (1, 0: every tick) */
    uint32_t phase;
} gs_call;

typedef struct {
    int32_t rc;       /* nvmlReturn_t, or GS_NOT_READ */
    uint32_t pad;
    uint64_t a, b;
} gs_value;

typedef struct {
    uint64_t tick;        /* n: due at t0 + n * interval (monotonic) */
    int64_t due_mono_ns;
    int64_t start_mono_ns; /* when the thread began the tick */
    int64_t end_mono_ns;
    /* then int64_t time_unix_ns[gpus] (0: the GPU was not read), then gs_value values[calls] */
} gs_record_header;

typedef struct {
    uint64_t written;     /* records written since gs_start */
    uint64_t overwritten; /* records overwritten before they were drained */
    uint64_t missed_ticks;
    int32_t running;
    int32_t error; /* the errno that stopped the thread (clock_nanosleep failed), 0 while it runs */
    int32_t realtime; /* 1: the thread runs under SCHED_FIFO (gs_start asked, and the process may) */
    int32_t pad;
} gs_stats;

typedef int (*fn_fields)(void *, int, void *);
typedef int (*fn_ptr)(void *, void *);
typedef int (*fn_uint_ptr)(void *, unsigned, void *);

typedef struct { unsigned fieldId, scopeId; long long timestamp, latencyUsec; int valueType, nvmlReturn; uint64_t value; } nvml_field;
typedef struct { unsigned gpu, memory; } nvml_util;
typedef struct { unsigned version; unsigned long long total, reserved, free, used; } nvml_memory_v2;
typedef struct { unsigned long long total, free, used; } nvml_memory;
typedef struct { unsigned version; unsigned sensorType; int temperature; } nvml_temperature_v1;

static struct {
    void *lib;
    void *fn[GS_KINDS];
    pthread_t thread;
    pthread_mutex_t lock; /* the ring and the stats */
    atomic_int stop;
    int running;
    /* the plan */
    gs_gpu *gpus;
    gs_call *calls;
    atomic_uchar *disabled;
    uint32_t ngpus, ncalls;
    int stop_codes[GS_MAX_STOP];
    uint32_t nstop;
    uint32_t retry_ticks;
    uint64_t *skip_until; /* per GPU: the first tick it is read again after a stop code */
    int64_t t0_ns, interval_ns;
    uint64_t first_tick;
    int rt_priority; /* the SCHED_FIFO priority gs_start asked for; 0: normal scheduling */
    /* the ring */
    unsigned char *ring, *scratch;
    size_t record_size;
    uint32_t capacity;
    uint64_t write_seq, read_seq;
    gs_stats stats;
} S = {.lock = PTHREAD_MUTEX_INITIALIZER};

static const char *const FUNCTION_NAMES[GS_KINDS] = {
    "nvmlDeviceGetFieldValues", "nvmlDeviceGetUtilizationRates", "nvmlDeviceGetMemoryInfo_v2",
    "nvmlDeviceGetMemoryInfo", "nvmlDeviceGetPowerUsage", "nvmlDeviceGetTemperatureV", "nvmlDeviceGetTemperature",
    "nvmlDeviceGetFanSpeed_v2", "nvmlDeviceGetClockInfo", "nvmlDeviceGetCurrentClocksEventReasons",
    "nvmlDeviceGetCurrentClocksThrottleReasons", "nvmlDeviceGetEnforcedPowerLimit", "nvmlDeviceGetPcieThroughput",
};

static int64_t now_ns(clockid_t clock) {
    struct timespec ts;
    clock_gettime(clock, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

EXPORT int gs_abi(void) { return GS_ABI; }
EXPORT size_t gs_sizeof_value(void) { return sizeof(gs_value); }
EXPORT size_t gs_sizeof_header(void) { return sizeof(gs_record_header); }

/* Binds NVML's functions from `library` (already loaded by the process: RTLD_NOLOAD first, so it is the
 * very library whose handles Python holds). 0, or -1 when the library cannot be opened; a missing function
 * is only an error when a plan uses it (gs_start answers -3). */
EXPORT int gs_open(const char *library) {
    if (S.lib) return 0;
    void *lib = dlopen(library, RTLD_NOW | RTLD_NOLOAD);
    if (!lib) lib = dlopen(library, RTLD_NOW);
    if (!lib) return -1;
    S.lib = lib;
    for (int k = 0; k < GS_KINDS; k++) S.fn[k] = dlsym(lib, FUNCTION_NAMES[k]);
    return 0;
}

static int is_stop(int rc) {
    for (uint32_t i = 0; i < S.nstop; i++)
        if (S.stop_codes[i] == rc) return 1;
    return 0;
}

/* One call (not a field value), its answer into v. */
static void call_one(void *h, const gs_call *c, gs_value *v) {
    void *fn = S.fn[c->kind];
    int rc;
    v->a = v->b = 0;
    switch (c->kind) {
    case GS_UTILIZATION: {
        nvml_util u = {0, 0};
        rc = ((fn_ptr)fn)(h, &u);
        v->a = u.gpu;
        v->b = u.memory;
        break;
    }
    case GS_MEMORY_V2: {
        nvml_memory_v2 m;
        memset(&m, 0, sizeof m);
        m.version = c->arg;
        rc = ((fn_ptr)fn)(h, &m);
        v->a = m.used;
        v->b = m.total;
        break;
    }
    case GS_MEMORY: {
        nvml_memory m = {0, 0, 0};
        rc = ((fn_ptr)fn)(h, &m);
        v->a = m.used;
        v->b = m.total;
        break;
    }
    case GS_TEMPERATURE_V: {
        nvml_temperature_v1 t = {c->arg, 0 /* NVML_TEMPERATURE_GPU */, 0};
        rc = ((fn_ptr)fn)(h, &t);
        v->a = (uint64_t)(int64_t)t.temperature;
        break;
    }
    case GS_FANS: {
        unsigned sum = 0, pct = 0, i = 0;
        rc = 0;
        for (; i < c->arg; i++) {
            rc = ((fn_uint_ptr)fn)(h, i, &pct);
            if (rc) break;
            sum += pct;
        }
        v->a = sum;
        v->b = i;
        break;
    }
    case GS_EVENT_REASONS:
    case GS_THROTTLE_REASONS: {
        unsigned long long r = 0;
        rc = ((fn_ptr)fn)(h, &r);
        v->a = r;
        break;
    }
    case GS_POWER:
    case GS_ENFORCED_LIMIT: {
        unsigned x = 0;
        rc = ((fn_ptr)fn)(h, &x);
        v->a = x;
        break;
    }
    case GS_TEMPERATURE:
    case GS_CLOCK:
    case GS_PCIE: {
        unsigned x = 0;
        rc = ((fn_uint_ptr)fn)(h, c->arg, &x);
        v->a = x;
        break;
    }
    default:
        rc = GS_NOT_READ;
    }
    v->rc = rc;
}

static int due(const gs_call *c, uint32_t index, uint64_t n) {
    return !atomic_load_explicit(&S.disabled[index], memory_order_relaxed) && n % c->every == c->phase;
}

/* Tick n into the scratch record. */
static void tick(uint64_t n, int64_t due_ns, int64_t start_ns) {
    gs_record_header *hdr = (gs_record_header *)S.scratch;
    int64_t *stamps = (int64_t *)(hdr + 1);
    gs_value *values = (gs_value *)(stamps + S.ngpus);
    hdr->tick = n;
    hdr->due_mono_ns = due_ns;
    hdr->start_mono_ns = start_ns;
    for (uint32_t i = 0; i < S.ncalls; i++) values[i].rc = GS_NOT_READ;
    nvml_field fields[GS_MAX_FIELDS];
    uint32_t field_call[GS_MAX_FIELDS];
    for (uint32_t g = 0; g < S.ngpus; g++) {
        const gs_gpu *gpu = &S.gpus[g];
        stamps[g] = 0;
        if (n < S.skip_until[g]) continue;
        stamps[g] = now_ns(CLOCK_REALTIME);
        int stopped = 0;
        uint32_t end = gpu->first + gpu->count;
        for (uint32_t i = gpu->first; i < end && !stopped;) {
            const gs_call *c = &S.calls[i];
            if (c->kind == GS_FIELD) { /* this and the next field calls of the GPU: one NVML call */
                uint32_t nf = 0;
                for (; i < end && S.calls[i].kind == GS_FIELD; i++) {
                    if (!due(&S.calls[i], i, n) || nf == GS_MAX_FIELDS) continue;
                    memset(&fields[nf], 0, sizeof fields[nf]);
                    fields[nf].fieldId = S.calls[i].arg;
                    field_call[nf++] = i;
                }
                if (!nf) continue;
                int rc = ((fn_fields)S.fn[GS_FIELD])(gpu->handle, (int)nf, fields);
                for (uint32_t j = 0; j < nf; j++) {
                    gs_value *v = &values[field_call[j]];
                    v->rc = rc ? rc : fields[j].nvmlReturn;
                    v->a = fields[j].value;
                    v->b = (uint64_t)(uint32_t)fields[j].valueType;
                    stopped |= is_stop(v->rc);
                }
                continue;
            }
            if (c->kind != GS_PCIE && due(c, i, n)) {
                call_one(gpu->handle, c, &values[i]);
                stopped = is_stop(values[i].rc);
            }
            i++;
        }
        if (stopped) S.skip_until[g] = n + S.retry_ticks;
    }
    for (uint32_t g = 0; g < S.ngpus; g++) { /* PCIe last: each read can block for ~20 ms */
        const gs_gpu *gpu = &S.gpus[g];
        if (!stamps[g] || S.skip_until[g] > n) continue;
        for (uint32_t i = gpu->first; i < gpu->first + gpu->count; i++) {
            if (S.calls[i].kind != GS_PCIE || !due(&S.calls[i], i, n)) continue;
            call_one(gpu->handle, &S.calls[i], &values[i]);
            if (is_stop(values[i].rc)) {
                S.skip_until[g] = n + S.retry_ticks;
                break;
            }
        }
    }
    hdr->end_mono_ns = now_ns(CLOCK_MONOTONIC);
}

static void publish(void) {
    pthread_mutex_lock(&S.lock);
    memcpy(S.ring + (S.write_seq % S.capacity) * S.record_size, S.scratch, S.record_size);
    S.write_seq++;
    S.stats.written++;
    if (S.write_seq - S.read_seq > S.capacity) { /* the oldest is gone: counted */
        S.read_seq = S.write_seq - S.capacity;
        S.stats.overwritten++;
    }
    pthread_mutex_unlock(&S.lock);
}

static void *run(void *unused) {
    (void)unused;
    if (S.rt_priority > 0) {
        /* a low real-time priority: its ~100 us a tick wake on time even with every core busy, and any
         * other real-time task (and the kernel's RT throttling) still comes first. Without CAP_SYS_NICE or an
         * RLIMIT_RTPRIO that high the call fails and the thread stays a normal one. */
        struct sched_param sp = {.sched_priority = S.rt_priority};
        int ok = pthread_setschedparam(pthread_self(), SCHED_FIFO, &sp) == 0;
        pthread_mutex_lock(&S.lock);
        S.stats.realtime = ok;
        pthread_mutex_unlock(&S.lock);
    }
    uint64_t n = S.first_tick;
    while (!atomic_load(&S.stop)) {
        int64_t due_ns = S.t0_ns + (int64_t)n * S.interval_ns;
        /* at most STOP_CHECK_NS at a time, so gs_stop is prompt at long intervals (one sleep a tick at 10 Hz) */
        for (int64_t now = now_ns(CLOCK_MONOTONIC); now < due_ns && !atomic_load(&S.stop);
             now = now_ns(CLOCK_MONOTONIC)) {
            int64_t until = due_ns - now > STOP_CHECK_NS ? now + STOP_CHECK_NS : due_ns;
            struct timespec ts = {.tv_sec = until / 1000000000LL, .tv_nsec = until % 1000000000LL};
            int rc = clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, NULL);
            if (rc && rc != EINTR) { /* no schedule without a clock to sleep on: stop, and say why */
                pthread_mutex_lock(&S.lock);
                S.stats.error = rc;
                pthread_mutex_unlock(&S.lock);
                return NULL;
            }
        }
        if (atomic_load(&S.stop)) break;
        tick(n, due_ns, now_ns(CLOCK_MONOTONIC));
        publish();
        /* the next tick runs, late, if it is less than half an interval overdue; else it is skipped */
        int64_t late = now_ns(CLOCK_MONOTONIC) - S.t0_ns;
        uint64_t first_runnable = late <= 0 ? 0 : (uint64_t)((late + S.interval_ns / 2 - 1) / S.interval_ns);
        uint64_t following = n + 1;
        if (first_runnable > following) {
            pthread_mutex_lock(&S.lock);
            S.stats.missed_ticks += first_runnable - following;
            pthread_mutex_unlock(&S.lock);
            following = first_runnable;
        }
        n = following;
    }
    return NULL;
}

static void free_plan(void) {
    free(S.gpus);
    free(S.calls);
    free(S.disabled);
    free(S.skip_until);
    free(S.ring);
    free(S.scratch);
    S.gpus = NULL;
    S.calls = NULL;
    S.disabled = NULL;
    S.skip_until = NULL;
    S.ring = S.scratch = NULL;
}

/* Starts the thread on the grid t0_mono_ns + n * interval_ns, n from first_tick, with a copy of the plan, under SCHED_FIFO at
 * rt_priority where the process may (0: normal scheduling). 0, or: -1 not opened,
 * -2 already running, -3 a call's NVML function is missing or its kind unknown, -4 no memory or no thread,
 * -5 a bad argument. */
EXPORT int gs_start(const gs_gpu *gpus, uint32_t ngpus, const gs_call *calls, uint32_t ncalls, const int *stop_codes,
                    uint32_t nstop, int64_t t0_mono_ns, int64_t interval_ns, uint32_t retry_ticks, uint32_t capacity,
                    uint64_t first_tick, int rt_priority) {
    if (!S.lib) return -1;
    if (S.running) return -2;
    if (interval_ns <= 0 || capacity == 0 || nstop > GS_MAX_STOP || retry_ticks == 0) return -5;
    for (uint32_t g = 0; g < ngpus; g++)
        if ((uint64_t)gpus[g].first + gpus[g].count > ncalls) return -5;
    for (uint32_t i = 0; i < ncalls; i++) {
        if (calls[i].kind >= GS_KINDS || !S.fn[calls[i].kind]) return -3;
        if (calls[i].every == 0 || calls[i].phase >= calls[i].every) return -5;
    }
    pthread_mutex_lock(&S.lock);
    free_plan(); /* the previous run's, kept for a last drain */
    pthread_mutex_unlock(&S.lock);
    S.record_size = sizeof(gs_record_header) + ngpus * sizeof(int64_t) + ncalls * sizeof(gs_value);
    S.gpus = malloc((ngpus ? ngpus : 1) * sizeof *S.gpus);
    S.calls = malloc((ncalls ? ncalls : 1) * sizeof *S.calls);
    S.disabled = calloc(ncalls ? ncalls : 1, sizeof *S.disabled);
    S.skip_until = calloc(ngpus ? ngpus : 1, sizeof *S.skip_until);
    S.ring = malloc((size_t)capacity * S.record_size);
    S.scratch = calloc(1, S.record_size);
    if (!S.gpus || !S.calls || !S.disabled || !S.skip_until || !S.ring || !S.scratch) {
        free_plan();
        return -4;
    }
    memcpy(S.gpus, gpus, ngpus * sizeof *S.gpus);
    memcpy(S.calls, calls, ncalls * sizeof *S.calls);
    memcpy(S.stop_codes, stop_codes, nstop * sizeof *stop_codes);
    S.ngpus = ngpus;
    S.ncalls = ncalls;
    S.nstop = nstop;
    S.retry_ticks = retry_ticks;
    S.t0_ns = t0_mono_ns;
    S.interval_ns = interval_ns;
    S.first_tick = first_tick;
    S.rt_priority = rt_priority;
    S.capacity = capacity;
    S.write_seq = S.read_seq = 0;
    memset(&S.stats, 0, sizeof S.stats);
    atomic_store(&S.stop, 0);
    if (pthread_create(&S.thread, NULL, run, NULL) != 0) {
        free_plan();
        return -4;
    }
    pthread_setname_np(S.thread, "gpuprobe-native"); /* so a per-thread profile tells it from Python's */
    S.running = 1;
    return 0;
}

/* Leaves call `index` out of every later tick (Python's answer to NOT_SUPPORTED and the like). */
EXPORT void gs_disable(uint32_t index) {
    if (S.disabled && index < S.ncalls) atomic_store(&S.disabled[index], 1);
}

/* Copies the undrained records, oldest first, into out (room for max records); returns how many. stats, when
 * given, is filled under the same lock. */
EXPORT uint32_t gs_drain(unsigned char *out, uint32_t max, gs_stats *stats) {
    uint32_t n = 0;
    pthread_mutex_lock(&S.lock);
    if (S.ring) {
        for (; S.read_seq < S.write_seq && n < max; S.read_seq++, n++)
            memcpy(out + (size_t)n * S.record_size, S.ring + (S.read_seq % S.capacity) * S.record_size, S.record_size);
    }
    if (stats) {
        *stats = S.stats;
        stats->running = S.running;
    }
    pthread_mutex_unlock(&S.lock);
    return n;
}

/* Stops the thread (at most one interval later); the records not drained yet stay for gs_drain. */
EXPORT void gs_stop(void) {
    if (!S.running) return;
    atomic_store(&S.stop, 1);
    pthread_join(S.thread, NULL);
    pthread_mutex_lock(&S.lock);
    S.running = 0;
    pthread_mutex_unlock(&S.lock);
}
