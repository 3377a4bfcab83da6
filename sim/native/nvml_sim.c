/*
 * gpuprobe's GPU simulator: a libnvidia-ml.so.1 that the official pynvml (and anything else that
 * links NVML) loads like the driver's.
 *
 * State lives in the directory named by GPUPROBE_SIM_DIR (see sim/state.py for the format). The
 * machine's state is a pure function of its GPUs' parameters, their append-only event histories and
 * the time, computed in fixed ticks of period_ns from start_ns, so every process sees the same values:
 *
 *   inputs of tick k     the latest events with t <= t_k (utilization, power limit, failure)
 *   power during tick k  P_k = min(idle + (peak - idle) * u / 100, limit), active part scaled
 *                        by throttle_clock_factor while thermally slowed down
 *   SM clock             the clock at which the DVFS curve draws P_k: the maximum clock when
 *                        nothing holds the power down, else solved by bisection (see sm_clock_fraction)
 *   energy at t_k        E_k = sum_{j<k} P_j * period            (the NVML counter, mJ)
 *   temperature          three first-order stages, each advanced over a tick by its exact solution
 *                        x <- x_ss + (x - x_ss) * exp(-period / tau) with the tick's inputs held:
 *                          fast (die)      dTf -> Rf * P_k,                       tau_fast
 *                          slow (heatsink) dTs -> Rs / G * P_k, Rs = R - Rf,       tau_s / G
 *                                          (heat capacity tau_s / Rs fixed; G = floor + (1 - floor)
 *                                          * fan / 100 on fan-cooled parts, from the fan curve at
 *                                          T_k before rounding, else 1)
 *                          inlet (air)     dTin -> k_in * P_node,k,                tau_in
 *                        T_k = T_amb + slot_offset + dTin + dTf + dTs; P_node,k is the sum of every
 *                        GPU's P_k, so all GPUs of the machine advance together, tick by tick
 *                        (memory: T_amb + slot_offset + dTin + its own first-order stage)
 *   slowdown             on when T_k >= slowdown threshold, off again below slowdown - 3 C
 *
 * A sim.conf without the newer thermal keys (older gpuprobe) gets Rf = k_in = slot_offset = 0 and
 * floor = 1: the first-order RC T_{k+1} = T_ss + (T_k - T_ss) * exp(-period / tau), T_ss = T_amb + R P_k,
 * bit for bit as before. gpuprobe.sim.thermal mirrors this operation for operation.
 *
 * Every reading inside [t_k, t_k+1) reports tick k, so values change on the driver's cadence only.
 * docs/simulator.md documents the model and the ground truth of each profile.
 */
#define _GNU_SOURCE
#include <errno.h>
#include <fcntl.h>
#include <math.h>
#include <pthread.h>
#include <signal.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <poll.h>
#include <sys/file.h>
#include <sys/inotify.h>
#include <time.h>
#include <unistd.h>

#define EXPORT __attribute__((visibility("default")))

typedef int nvmlReturn_t;
enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_RESET_REQUIRED = 16,
    NVML_ERROR_LIB_RM_VERSION_MISMATCH = 18,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

#define MAX_GPUS 64
#define HISTORY 128 /* ticks kept for nvmlDeviceGetSamples and the 1 s power average */
#define NAME_LEN 96

/* clocks-event reasons */
#define REASON_GPU_IDLE 0x1ULL
#define REASON_SW_POWER_CAP 0x4ULL
#define REASON_HW_SLOWDOWN 0x8ULL
#define REASON_HW_THERMAL 0x40ULL
#define REASONS_SUPPORTED 0x1FFULL

typedef struct {
    int64_t t_ns;
    char kind;
    long long value;
    long long pid;
    long long mem_bytes;
} sim_event;

typedef struct {
    int64_t t_us;
    unsigned power_mw, util, mem_util, sm_mhz, mem_mhz;
} sim_hist;

/* GPM metrics the simulator computes (ids as nvml.h's NVML_GPM_METRIC_*), in this order */
enum { GPM_SM_UTIL, GPM_SM_OCCUPANCY, GPM_ANY_TENSOR, GPM_DRAM_BW, GPM_FP16, GPM_FP32, GPM_FP64, GPM_N };
static const unsigned GPM_IDS[GPM_N] = {2, 3, 5, 10, 13, 12, 11};
static const char *const GPM_SHORT[GPM_N] = {"sm_util", "sm_occupancy", "any_tensor_util", "dram_bw_util",
                                             "fp16_util", "fp32_util", "fp64_util"};
#define MAX_WORKLOADS 32
/* sim.conf's workload table (gpuprobe.sim.profiles.WORKLOAD_ACTIVITY): per workload, each GPM metric as a
 * fraction of the GPU's utilization. Row 0 is the generic row of a load that names no workload. */
static double g_workload_ratio[MAX_WORKLOADS][GPM_N];
static unsigned g_workload_count;

#define MAX_NVLINKS 18
#define CLOCK_RING 64 /* clock-change ticks kept for event sets */
#define MAX_MIG 7

typedef struct sim_gpu {
    unsigned index;
    /* parameters (sim.conf) */
    char name[NAME_LEN], uuid[NAME_LEN], serial[NAME_LEN];
    unsigned pci_bus, architecture, brand, cc_major, cc_minor, pci_device_id;
    unsigned long long memory_total_bytes, memory_reserved_bytes;
    double idle_w, peak_demand_w, limit_default_w, limit_min_w, limit_max_w;
    int power_usage_is_average;
    double ambient_c, r_th, tau_s, mem_r_th, mem_tau_s;
    /* two-stage own-power path, node inlet air, slot offset, fan-dependent heatsink (docs/simulator.md) */
    double r_fast, tau_fast_s, inlet_c_per_w, inlet_tau_s, slot_offset_c, fan_floor;
    int mem_temp_supported;
    int shutdown_c, slowdown_c, gpu_max_c, mem_max_c;
    unsigned sm_clock_max_mhz, sm_clock_base_mhz, sm_clock_idle_mhz, mem_clock_mhz;
    double throttle_clock_factor;
    double uncore_power_share, voltage_floor, voltage_knee, voltage_exponent; /* the DVFS curve */
    unsigned fan_count, fan_min_pct;
    double fan_t_low_c, fan_t_high_c;
    double mem_util_per_util, pcie_bytes_per_s_full;
    unsigned pcie_gen, pcie_width;
    int ecc_supported;
    int virt; /* nvmlGpuVirtualizationMode_t */
    unsigned nvlink_links, mig_instances;
    unsigned nvlink_unsupported; /* bit c: nvmlNvLinkErrorCounter_t c answers NOT_SUPPORTED (and its total field) */
    int row_remapping; /* -1: absent from sim.conf (older gpuprobe), derived from the architecture */
    /* event history */
    char events_path[4096];
    int events_fd;       /* kept open: reopening it for every tick cost two syscalls per GPU and tick */
    pid_t events_fd_pid; /* the process that opened it (a forked child must not share its lock) */
    off_t events_read;
    char partial[256];
    size_t partial_len;
    sim_event *events;
    size_t n_events, cap_events, next_event;
    /* inputs in force */
    unsigned util;
    double limit_w;
    long long holder_pid, holder_mem_bytes;
    int failed; /* the code every query answers while failed (F events: GPU_IS_LOST, RESET_REQUIRED, ...), or 0 */
    unsigned workload, next_workload; /* rows of the workload table: in force, named by the last W event */
    /* health state (events E, R, N; F 0 is a GPU reset): docs/simulator.md, "Health" */
    unsigned long long ecc_corr_vol, ecc_corr_agg, ecc_unc_vol, ecc_unc_agg;
    unsigned remap_corr_rows, remap_unc_rows, retired_dbe_pages;
    int remap_pending, remap_failure, retire_pending;
    unsigned long long nvlink_crc_flit[MAX_NVLINKS], nvlink_replay[MAX_NVLINKS];
    /* state at the start of tick k */
    int64_t k;
    double temp_c, mem_temp_c, energy_j, pcie_tx_bytes, pcie_rx_bytes;
    /* the thermal stages behind temp_c and mem_temp_c: the slow and memory stages are kept with T_amb
     * included (T_amb + dT), so that with the newer parameters at zero the sums below add exact zeros and
     * an old machine's temperatures are the old first-order ones bit for bit */
    double slow_abs_c, fast_c, inlet_c, mem_abs_c;
    int slowed;
    double power_w;            /* during tick k */
    unsigned sm_mhz;           /* during tick k */
    unsigned long long reasons;
    sim_hist hist[HISTORY];
    unsigned n_hist;
    /* integrals up to t_k: throttled time (ns) and GPM activity (% x s); rates during tick k */
    unsigned long long viol_power_ns, viol_thermal_ns;
    double gpm_acc[GPM_N], gpm_rate[GPM_N];
    double nvlink_kib_per_link; /* data each link has carried per direction up to t_k, KiB */
    /* ticks whose SM clock differs from the tick before: the ClockChange events */
    int64_t clock_ring_t_ns[CLOCK_RING];
    unsigned long long clock_changes; /* how many so far; entry i lives at i % CLOCK_RING */
} sim_gpu;

static pthread_mutex_t g_lock = PTHREAD_MUTEX_INITIALIZER;
static int g_init_count;
static int g_loaded;
static sim_gpu g_gpus[MAX_GPUS];
static unsigned g_gpu_count;
static int64_t g_start_ns, g_period_ns;
static int64_t g_tick = -1; /* the tick every GPU's state is at (-1: none computed yet) */
static char g_driver_version[80];
static int g_cuda_driver_version;
#define MAX_ADMIN_UIDS 16
static uid_t g_admin_uids[MAX_ADMIN_UIDS]; /* who may set power limits (sim.conf admin_uids): root */
static unsigned g_admin_count;

static int64_t now_ns(void) {
    struct timespec ts;
    clock_gettime(CLOCK_REALTIME, &ts);
    return (int64_t)ts.tv_sec * 1000000000LL + ts.tv_nsec;
}

/* ---------------------------------------------------------------- configuration */

static void set_param(sim_gpu *g, const char *key, const char *v) {
#define STR(f) if (!strcmp(key, #f)) { snprintf(g->f, sizeof g->f, "%s", v); return; }
#define UINT(f, k) if (!strcmp(key, k)) { g->f = (unsigned)strtoul(v, NULL, 10); return; }
#define ULL(f, k) if (!strcmp(key, k)) { g->f = strtoull(v, NULL, 10); return; }
#define INT(f, k) if (!strcmp(key, k)) { g->f = atoi(v); return; }
#define DBL(f, k) if (!strcmp(key, k)) { g->f = strtod(v, NULL); return; }
    if (!strcmp(key, "nvml_name")) { snprintf(g->name, sizeof g->name, "%s", v); return; }
    STR(uuid) STR(serial)
    UINT(pci_bus, "pci_bus") UINT(architecture, "architecture") UINT(brand, "brand")
    UINT(cc_major, "cuda_cc_major") UINT(cc_minor, "cuda_cc_minor") UINT(pci_device_id, "pci_device_id")
    ULL(memory_total_bytes, "memory_total_bytes") ULL(memory_reserved_bytes, "memory_reserved_bytes")
    DBL(idle_w, "idle_w") DBL(peak_demand_w, "peak_demand_w") DBL(limit_default_w, "limit_default_w")
    DBL(limit_min_w, "limit_min_w") DBL(limit_max_w, "limit_max_w")
    INT(power_usage_is_average, "power_usage_is_average")
    DBL(ambient_c, "ambient_c") DBL(r_th, "r_th_c_per_w") DBL(tau_s, "tau_s")
    DBL(r_fast, "r_fast_c_per_w") DBL(tau_fast_s, "tau_fast_s") DBL(inlet_c_per_w, "inlet_c_per_w")
    DBL(inlet_tau_s, "inlet_tau_s") DBL(slot_offset_c, "slot_offset_c") DBL(fan_floor, "fan_conductance_floor")
    DBL(mem_r_th, "mem_r_th_c_per_w") DBL(mem_tau_s, "mem_tau_s") INT(mem_temp_supported, "mem_temp_supported")
    INT(shutdown_c, "shutdown_c") INT(slowdown_c, "slowdown_c") INT(gpu_max_c, "gpu_max_c") INT(mem_max_c, "mem_max_c")
    UINT(sm_clock_max_mhz, "sm_clock_max_mhz") UINT(sm_clock_base_mhz, "sm_clock_base_mhz")
    UINT(sm_clock_idle_mhz, "sm_clock_idle_mhz") UINT(mem_clock_mhz, "mem_clock_mhz")
    DBL(throttle_clock_factor, "throttle_clock_factor")
    UINT(fan_count, "fan_count") UINT(fan_min_pct, "fan_min_pct")
    DBL(fan_t_low_c, "fan_t_low_c") DBL(fan_t_high_c, "fan_t_high_c")
    DBL(mem_util_per_util, "mem_util_per_util") DBL(pcie_bytes_per_s_full, "pcie_bytes_per_s_at_full_util")
    UINT(pcie_gen, "pcie_gen") UINT(pcie_width, "pcie_width") INT(ecc_supported, "ecc_supported")
    DBL(uncore_power_share, "uncore_power_share") DBL(voltage_floor, "voltage_floor")
    DBL(voltage_knee, "voltage_knee") DBL(voltage_exponent, "voltage_exponent")
    INT(virt, "virt")
    UINT(nvlink_links, "nvlink_links") UINT(mig_instances, "mig_instances")
    UINT(nvlink_unsupported, "nvlink_unsupported_counters") INT(row_remapping, "row_remapping")
    /* unknown keys (the profile's own name, ...) are ignored */
#undef STR
#undef UINT
#undef ULL
#undef INT
#undef DBL
}

/*
 * The DVFS curve (docs/simulator.md, "Clocks: the DVFS curve"; gpuprobe.sim.perf mirrors it operation for
 * operation). At SM clock fraction x = f / f_max the active power (above idle) is the one at the
 * maximum clock times
 *     a(x) = s + (1 - s) * x * v(x)^2
 * where s is the share that does not follow the SM clock (memory, fabric) and v the voltage relative
 * to the one at f_max: flat at the floor up to the knee, then rising to 1 ever more steeply. Dynamic
 * power grows faster than the clock near the top, linearly below the knee.
 */
static double dvfs_voltage(const sim_gpu *g, double x) {
    if (x <= g->voltage_knee) return g->voltage_floor;
    double t = (x - g->voltage_knee) / (1.0 - g->voltage_knee);
    return g->voltage_floor + (1.0 - g->voltage_floor) * pow(t, g->voltage_exponent);
}

static double active_power_fraction(const sim_gpu *g, double x) {
    double v = dvfs_voltage(g, x);
    return g->uncore_power_share + (1.0 - g->uncore_power_share) * x * v * v;
}

#define CLOCK_BISECTIONS 60

/* The clock fraction at which the active power is `target` of the one at the maximum clock
 * (a(x) = target; a rises with x), never below the idle clock. */
static double sm_clock_fraction(const sim_gpu *g, double target) {
    double lo = (double)g->sm_clock_idle_mhz / (double)g->sm_clock_max_mhz, hi = 1.0;
    if (active_power_fraction(g, lo) >= target) return lo;
    if (target >= 1.0) return 1.0;
    for (int i = 0; i < CLOCK_BISECTIONS; i++) {
        double mid = 0.5 * (lo + hi);
        if (active_power_fraction(g, mid) < target) lo = mid;
        else hi = mid;
    }
    return 0.5 * (lo + hi);
}

static double power_of(const sim_gpu *g, unsigned util, double limit_w, int slowed) {
    double demand = g->idle_w + (g->peak_demand_w - g->idle_w) * util / 100.0;
    if (slowed) demand = g->idle_w + (demand - g->idle_w) * g->throttle_clock_factor;
    return demand < limit_w ? demand : limit_w;
}

/* ---------------------------------------------------------------- thermal model
 * (docs/simulator.md, "Temperature"; gpuprobe.sim.thermal mirrors it operation for operation) */

/* The fan curve at die temperature t, in % before NVML's rounding to whole percent. */
static double fan_curve_pct(const sim_gpu *g, double t) {
    if (t <= g->fan_t_low_c) return g->fan_min_pct;
    if (t >= g->fan_t_high_c) return 100.0;
    return g->fan_min_pct + (t - g->fan_t_low_c) * (100.0 - g->fan_min_pct) / (g->fan_t_high_c - g->fan_t_low_c);
}

/* The heatsink's conductance relative to the one at full fan, at die temperature t. The curve's value
 * before rounding, so that the steady state is the one solution of a continuous equation rather than a
 * chatter between two whole percents. Passive parts, and floor 1 (an old machine): 1. */
static double fan_conductance(const sim_gpu *g, double t) {
    if (!g->fan_count || g->fan_floor >= 1.0) return 1.0;
    return g->fan_floor + (1.0 - g->fan_floor) * fan_curve_pct(g, t) / 100.0;
}

/* One first-order stage's decay over dt; tau 0 (the stage's key absent from an old sim.conf) settles at once. */
static double stage_decay(double dt, double tau) { return tau > 0 ? exp(-dt / tau) : 0.0; }

/* The sums in this order, in C as in Python: with the newer stages at zero they add exact zeros. */
static double die_temp(const sim_gpu *g) { return g->slow_abs_c + g->slot_offset_c + g->inlet_c + g->fast_c; }
static double mem_temp(const sim_gpu *g) { return g->mem_abs_c + g->slot_offset_c + g->inlet_c; }

#define FAN_BISECTIONS 60

/* Every stage in equilibrium at constant own power p and node power p_node. On a fan-cooled part the fan
 * and the heatsink's resistance depend on each other: the die temperature solves T = base + Rs / G(T) * p,
 * whose right side falls as T rises, so bisection between G = 1 and G = floor finds the one solution. */
static void thermal_equilibrium(sim_gpu *g, double p, double p_node) {
    double rs = g->r_th - g->r_fast;
    g->fast_c = g->r_fast * p;
    g->inlet_c = g->inlet_c_per_w * p_node;
    double cond = 1.0;
    if (g->fan_count && g->fan_floor < 1.0) {
        double base = g->ambient_c + g->slot_offset_c + g->inlet_c + g->fast_c;
        double lo = base + rs * p, hi = base + rs / g->fan_floor * p;
        for (int i = 0; i < FAN_BISECTIONS; i++) {
            double mid = 0.5 * (lo + hi);
            if (base + rs / fan_conductance(g, mid) * p > mid) lo = mid;
            else hi = mid;
        }
        cond = fan_conductance(g, 0.5 * (lo + hi));
    }
    g->slow_abs_c = g->ambient_c + rs / cond * p;
    g->mem_abs_c = g->ambient_c + g->mem_r_th * p;
    g->temp_c = die_temp(g);
    g->mem_temp_c = mem_temp(g);
}

static void reset_state(sim_gpu *g) {
    g->util = 0;
    g->limit_w = g->limit_default_w;
    g->holder_pid = 0;
    g->holder_mem_bytes = 0;
    g->failed = 0;
    g->next_event = 0;
    g->k = -1; /* nothing computed yet */
    g->slowed = 0;
    g->energy_j = 0.0;
    g->pcie_tx_bytes = g->pcie_rx_bytes = 0.0;
    g->n_hist = 0;
    g->workload = g->next_workload = 0;
    g->ecc_corr_vol = g->ecc_corr_agg = g->ecc_unc_vol = g->ecc_unc_agg = 0;
    g->remap_corr_rows = g->remap_unc_rows = g->retired_dbe_pages = 0;
    g->remap_pending = g->remap_failure = g->retire_pending = 0;
    memset(g->nvlink_crc_flit, 0, sizeof g->nvlink_crc_flit);
    memset(g->nvlink_replay, 0, sizeof g->nvlink_replay);
    g->viol_power_ns = g->viol_thermal_ns = 0;
    memset(g->gpm_acc, 0, sizeof g->gpm_acc);
    memset(g->gpm_rate, 0, sizeof g->gpm_rate);
    g->nvlink_kib_per_link = 0.0;
    g->clock_changes = 0;
}

static int load_config(void) {
    const char *dir = getenv("GPUPROBE_SIM_DIR");
    if (!dir || !*dir) return NVML_ERROR_DRIVER_NOT_LOADED;
    char path[4096];
    snprintf(path, sizeof path, "%s/sim.conf", dir);
    FILE *f = fopen(path, "r");
    if (!f) return NVML_ERROR_DRIVER_NOT_LOADED;
    char line[1024];
    unsigned count = 0;
    static int has_dvfs[MAX_GPUS];
    memset(has_dvfs, 0, sizeof has_dvfs);
    memset(g_gpus, 0, sizeof g_gpus);
    /* a sim.conf from before the fan mattered has no floor: the fan leaves the heatsink as it is */
    for (unsigned i = 0; i < MAX_GPUS; i++) g_gpus[i].fan_floor = 1.0;
    for (unsigned i = 0; i < MAX_GPUS; i++) g_gpus[i].row_remapping = -1;
    memset(g_workload_ratio, 0, sizeof g_workload_ratio);
    g_workload_count = 0;
    g_admin_uids[0] = 0; /* root, unless sim.conf says who */
    g_admin_count = 1;
    g_start_ns = g_period_ns = 0;
    snprintf(g_driver_version, sizeof g_driver_version, "0.0");
    while (fgets(line, sizeof line, f)) {
        line[strcspn(line, "\n")] = 0;
        char *sp = strchr(line, ' ');
        if (!sp) continue;
        *sp = 0;
        const char *key = line, *val = sp + 1;
        unsigned idx;
        char sub[128];
        if (sscanf(key, "gpu.%u.%127s", &idx, sub) == 2) {
            if (idx < MAX_GPUS) set_param(&g_gpus[idx], sub, val);
            if (idx < MAX_GPUS && !strcmp(sub, "voltage_knee")) has_dvfs[idx] = 1;
        } else if (!strcmp(key, "start_ns")) g_start_ns = strtoll(val, NULL, 10);
        else if (!strcmp(key, "period_ns")) g_period_ns = strtoll(val, NULL, 10);
        else if (!strcmp(key, "gpu_count")) count = (unsigned)strtoul(val, NULL, 10);
        else if (!strcmp(key, "driver_version")) snprintf(g_driver_version, sizeof g_driver_version, "%s", val);
        else if (!strcmp(key, "cuda_driver_version")) g_cuda_driver_version = atoi(val);
        else if (sscanf(key, "workload.%u", &idx) == 1 && idx < MAX_WORKLOADS) {
            /* workload.<id> <name> <ratio per GPM metric, in GPM_* order> */
            double *r = g_workload_ratio[idx];
            char wname[64];
            if (sscanf(val, "%63s %lf %lf %lf %lf %lf %lf %lf", wname, &r[0], &r[1], &r[2], &r[3], &r[4], &r[5],
                       &r[6]) == 1 + GPM_N && idx >= g_workload_count)
                g_workload_count = idx + 1;
        }
        else if (!strcmp(key, "admin_uids")) {
            g_admin_count = 0;
            for (char *p = (char *)val, *end; *p && g_admin_count < MAX_ADMIN_UIDS; p = *end ? end + 1 : end) {
                unsigned long uid = strtoul(p, &end, 10);
                if (end == p) break;
                g_admin_uids[g_admin_count++] = (uid_t)uid;
            }
        }
    }
    fclose(f);
    if (count == 0 || count > MAX_GPUS || g_period_ns <= 0) return NVML_ERROR_DRIVER_NOT_LOADED;
    for (unsigned i = 0; i < count; i++) {
        sim_gpu *g = &g_gpus[i];
        if (!has_dvfs[i]) {
            /* written by an older gpuprobe: power linear in the clock, as it was then */
            g->uncore_power_share = 0.0;
            g->voltage_floor = 1.0;
            g->voltage_knee = 0.0;
            g->voltage_exponent = 1.0;
        }
        if (g->row_remapping < 0) g->row_remapping = g->architecture >= 7 && g->ecc_supported;
        if (g->nvlink_links > MAX_NVLINKS) g->nvlink_links = MAX_NVLINKS;
        if (g->mig_instances > MAX_MIG) g->mig_instances = MAX_MIG;
        g->index = i;
        snprintf(g->events_path, sizeof g->events_path, "%s/gpu%u.events", dir, i);
        g->events_fd = -1;
        reset_state(g);
    }
    /* the machine starts with every GPU's every stage in equilibrium at idle */
    double p_node_idle = 0.0;
    for (unsigned i = 0; i < count; i++) p_node_idle += power_of(&g_gpus[i], 0, g_gpus[i].limit_w, 0);
    for (unsigned i = 0; i < count; i++)
        thermal_equilibrium(&g_gpus[i], power_of(&g_gpus[i], 0, g_gpus[i].limit_w, 0), p_node_idle);
    g_tick = -1;
    g_gpu_count = count;
    return NVML_SUCCESS;
}

/* ---------------------------------------------------------------- events and ticks */

static void add_event_line(sim_gpu *g, const char *line) {
    sim_event e;
    if (sscanf(line, "%ld %c %lld %lld %lld", &e.t_ns, &e.kind, &e.value, &e.pid, &e.mem_bytes) != 5) return;
    if (g->n_events == g->cap_events) {
        size_t cap = g->cap_events ? g->cap_events * 2 : 64;
        sim_event *n = realloc(g->events, cap * sizeof *n);
        if (!n) return;
        g->events = n;
        g->cap_events = cap;
    }
    g->events[g->n_events++] = e;
}

/* Reads new events under a shared lock and returns the time taken while still holding it. */
static int64_t read_events(sim_gpu *g) {
    /* flock belongs to the open file description, which a forked child shares: the child opens its own */
    pid_t pid = getpid();
    if (g->events_fd >= 0 && g->events_fd_pid != pid) {
        close(g->events_fd);
        g->events_fd = -1;
    }
    if (g->events_fd < 0) {
        g->events_fd = open(g->events_path, O_RDONLY | O_CLOEXEC);
        g->events_fd_pid = pid;
    }
    int fd = g->events_fd;
    if (fd < 0) return now_ns();
    flock(fd, LOCK_SH);
    char buf[8192];
    ssize_t n;
    while ((n = pread(fd, buf, sizeof buf, g->events_read)) > 0) {
        g->events_read += n;
        for (ssize_t i = 0; i < n; i++) {
            char c = buf[i];
            if (c == '\n') {
                g->partial[g->partial_len] = 0;
                add_event_line(g, g->partial);
                g->partial_len = 0;
            } else if (g->partial_len < sizeof g->partial - 1) {
                g->partial[g->partial_len++] = c;
            }
        }
    }
    int64_t t = now_ns();
    flock(fd, LOCK_UN);
    return t;
}

static void apply_events_until(sim_gpu *g, int64_t t_ns) {
    while (g->next_event < g->n_events && g->events[g->next_event].t_ns <= t_ns) {
        const sim_event *e = &g->events[g->next_event++];
        switch (e->kind) {
        case 'U':
            /* the pid (0: none) is the process that holds the GPU, listed while it is alive */
            g->util = e->value < 0 ? 0 : e->value > 100 ? 100 : (unsigned)e->value;
            g->holder_pid = e->pid;
            g->holder_mem_bytes = e->mem_bytes;
            break;
        case 'L': g->limit_w = e->value / 1000.0; break;
        case 'F':
            /* F 1 (older gpuprobe, and the default): GPU_IS_LOST; any other non-zero value is the code answered */
            g->failed = e->value == 1 ? NVML_ERROR_GPU_IS_LOST : (int)e->value;
            if (!g->failed) {
                /* brought back = a GPU reset: volatile counters restart, pending remaps and retirements are
                 * carried out; aggregate counts, remapped rows, retired pages and a remap failure persist */
                g->ecc_corr_vol = g->ecc_unc_vol = 0;
                g->remap_pending = g->retire_pending = 0;
            }
            break;
        case 'W': g->next_workload = e->value >= 0 && e->value < MAX_WORKLOADS ? (unsigned)e->value : 0; break;
        case 'E':
            if (e->value == 1) { g->ecc_corr_vol++; g->ecc_corr_agg++; }
            else if (e->value == 2) {
                g->ecc_unc_vol++;
                g->ecc_unc_agg++;
                /* Ampere and newer remap the row; older parts retire the page, pending until a reset */
                if (g->row_remapping) g->remap_unc_rows++;
                else { g->retired_dbe_pages++; g->retire_pending = 1; }
            }
            break;
        case 'R':
            if (e->value == 1) g->remap_pending = 1;
            else if (e->value == 2) g->remap_failure = 1;
            break;
        case 'N':
            /* value errors on link `pid`: each CRC-failed flit is replayed, so both counters move together */
            if (e->pid >= 0 && e->pid < MAX_NVLINKS && e->value > 0) {
                g->nvlink_crc_flit[e->pid] += (unsigned long long)e->value;
                g->nvlink_replay[e->pid] += (unsigned long long)e->value;
            }
            break;
        }
        if (e->kind == 'U') {
            /* a load names its workload in a W line just before it; one that does not is generic (row 0) */
            g->workload = g->next_workload < g_workload_count ? g->next_workload : 0;
            g->next_workload = 0;
        }
    }
}

/* Inputs and derived readings for tick k, from the state at its start. */
static void begin_tick(sim_gpu *g, int64_t k) {
    int64_t t_k = g_start_ns + k * g_period_ns;
    apply_events_until(g, t_k);
    if (g->temp_c >= g->slowdown_c) g->slowed = 1;
    else if (g->temp_c < g->slowdown_c - 3) g->slowed = 0;
    double demand = g->idle_w + (g->peak_demand_w - g->idle_w) * g->util / 100.0;
    /* what it would draw at the clocks thermal slowdown allows, before the power cap */
    double thermal = g->slowed ? g->throttle_clock_factor : 1.0;
    double wanted = g->idle_w + (demand - g->idle_w) * thermal;
    g->power_w = power_of(g, g->util, g->limit_w, g->slowed);
    g->reasons = 0;
    double clock_fraction = 1.0;
    if (g->util == 0) {
        g->reasons |= REASON_GPU_IDLE;
    } else {
        /* the power cap is a reason only while it is what holds the power down */
        int capped = wanted > g->limit_w + 1e-9;
        if (capped) g->reasons |= REASON_SW_POWER_CAP;
        if (g->slowed) g->reasons |= REASON_HW_SLOWDOWN | REASON_HW_THERMAL;
        /* the clock at which the DVFS curve draws exactly the power drawn */
        if (capped || g->slowed) clock_fraction = sm_clock_fraction(g, (g->power_w - g->idle_w) / (demand - g->idle_w));
    }
    unsigned prev_mhz = g->sm_mhz;
    if (g->util == 0) {
        g->sm_mhz = g->sm_clock_idle_mhz;
    } else {
        double mhz = g->sm_clock_max_mhz * clock_fraction;
        g->sm_mhz = mhz < g->sm_clock_idle_mhz ? g->sm_clock_idle_mhz : (unsigned)(mhz + 0.5);
    }
    if (k > 0 && g->sm_mhz != prev_mhz) g->clock_ring_t_ns[g->clock_changes++ % CLOCK_RING] = t_k;
    for (int m = 0; m < GPM_N; m++) {
        /* the workload's activity as a fraction of the utilization; no table (older sim.conf): SMs busy
         * while utilized, nothing else */
        double ratio = g_workload_count ? g_workload_ratio[g->workload][m] : (m == GPM_SM_UTIL ? 1.0 : 0.0);
        double v = g->util * ratio;
        g->gpm_rate[m] = v > 100.0 ? 100.0 : v;
    }
    sim_hist *h = &g->hist[k % HISTORY];
    h->t_us = t_k / 1000;
    h->power_mw = (unsigned)(g->power_w * 1000.0 + 0.5);
    h->util = g->util;
    h->mem_util = (unsigned)(g->util * g->mem_util_per_util + 0.5);
    h->sm_mhz = g->sm_mhz;
    h->mem_mhz = g->mem_clock_mhz;
    if (g->n_hist < HISTORY) g->n_hist++;
    g->k = k;
}

/* NVLink data per link and direction during tick k (KiB/s): a data-parallel job's gradient all-reduce
 * keeps the links busy in proportion to its DRAM traffic. Simulated: NVLINK_BYTES_PER_S_PER_LINK (25 GB/s per
 * direction, NVLink 3 and 4) times NVLINK_BUSY_AT_FULL_DRAM at 100 % DRAM bandwidth utilization. */
#define NVLINK_BYTES_PER_S_PER_LINK 25.0e9
#define NVLINK_BUSY_AT_FULL_DRAM 0.5
static double nvlink_rate_kib_per_s(const sim_gpu *g) {
    if (!g->nvlink_links) return 0.0;
    return NVLINK_BYTES_PER_S_PER_LINK * NVLINK_BUSY_AT_FULL_DRAM * g->gpm_rate[GPM_DRAM_BW] / 100.0 / 1024.0;
}

/* State at the start of tick k + 1 from tick k's inputs; p_node is every GPU's power during tick k. */
static void end_tick(sim_gpu *g, double p_node) {
    double dt = g_period_ns / 1e9;
    double p = g->power_w;
    /* the fan as the tick starts sets the heatsink's resistance and, its heat capacity being fixed,
     * its time constant */
    double cond = fan_conductance(g, g->temp_c);
    double s_ss = g->ambient_c + (g->r_th - g->r_fast) / cond * p;
    g->slow_abs_c = s_ss + (g->slow_abs_c - s_ss) * stage_decay(dt, g->tau_s / cond);
    double f_ss = g->r_fast * p;
    g->fast_c = f_ss + (g->fast_c - f_ss) * stage_decay(dt, g->tau_fast_s);
    double i_ss = g->inlet_c_per_w * p_node;
    g->inlet_c = i_ss + (g->inlet_c - i_ss) * stage_decay(dt, g->inlet_tau_s);
    double m_ss = g->ambient_c + g->mem_r_th * p;
    g->mem_abs_c = m_ss + (g->mem_abs_c - m_ss) * exp(-dt / g->mem_tau_s);
    g->temp_c = die_temp(g);
    g->mem_temp_c = mem_temp(g);
    g->energy_j += g->power_w * dt;
    double pcie = g->pcie_bytes_per_s_full * g->util / 100.0 * dt;
    g->pcie_tx_bytes += pcie * 0.25;
    g->pcie_rx_bytes += pcie;
    if (g->reasons & REASON_SW_POWER_CAP) g->viol_power_ns += (unsigned long long)g_period_ns;
    if (g->reasons & REASON_HW_THERMAL) g->viol_thermal_ns += (unsigned long long)g_period_ns;
    for (int m = 0; m < GPM_N; m++) g->gpm_acc[m] += g->gpm_rate[m] * dt;
    g->nvlink_kib_per_link += nvlink_rate_kib_per_s(g) * dt;
}

/* Brings every GPU of the machine to the tick that contains the present moment: the inlet air couples
 * them through the node's power, so they advance together. Called with g_lock held.
 *
 * Each GPU's events are read under that file's lock with a clock t_i taken before releasing it; an
 * event not seen carries a time after t_i, so computing up to the tick that contains the earliest t_i
 * never computes a tick that an unseen event should have changed. */
static void refresh(void) {
    int64_t t = now_ns();
    int64_t k = (t - g_start_ns) / g_period_ns;
    if (t < g_start_ns) k = 0;
    if (k == g_tick) return;
    for (unsigned i = 0; i < g_gpu_count; i++) {
        int64_t t_i = read_events(&g_gpus[i]);
        if (i == 0 || t_i < t) t = t_i;
    }
    k = t < g_start_ns ? 0 : (t - g_start_ns) / g_period_ns;
    if (g_tick < 0) {
        for (unsigned i = 0; i < g_gpu_count; i++) begin_tick(&g_gpus[i], 0);
        g_tick = 0;
    }
    while (g_tick < k) {
        double p_node = 0.0;
        for (unsigned i = 0; i < g_gpu_count; i++) p_node += g_gpus[i].power_w;
        for (unsigned i = 0; i < g_gpu_count; i++) end_tick(&g_gpus[i], p_node);
        g_tick++;
        for (unsigned i = 0; i < g_gpu_count; i++) begin_tick(&g_gpus[i], g_tick);
    }
}

static int append_event(sim_gpu *g, char kind, long long value) {
    int fd = open(g->events_path, O_WRONLY | O_APPEND | O_CLOEXEC);
    if (fd < 0) return NVML_ERROR_NO_PERMISSION;
    flock(fd, LOCK_EX);
    char line[128];
    int n = snprintf(line, sizeof line, "%ld %c %lld %d 0\n", (long)now_ns(), kind, value, (int)getpid());
    ssize_t w = write(fd, line, (size_t)n);
    flock(fd, LOCK_UN);
    close(fd);
    return w == n ? NVML_SUCCESS : NVML_ERROR_UNKNOWN;
}

/* ---------------------------------------------------------------- call boundary */

typedef sim_gpu *nvmlDevice_t;

static int check_device(nvmlDevice_t d) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    if (d < g_gpus || d >= g_gpus + g_gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    refresh();
    if (d->failed) return d->failed;
    return NVML_SUCCESS;
}

/* MIG (docs/simulator.md, "MIG"): a GPU with mig_instances N > 0 is in MIG mode, split into N 1g
 * GPU instances (one compute instance each) whose handles are these. */
typedef struct { sim_gpu *parent; unsigned index; } sim_mig;
static sim_mig g_mig[MAX_GPUS][MAX_MIG];
static const unsigned MIG_GI_IDS[MAX_MIG] = {7, 8, 9, 11, 12, 13, 14}; /* 1g placements on a 7-slice GPU */

static sim_mig *mig_of(const void *dev) {
    const sim_mig *first = &g_mig[0][0], *end = first + MAX_GPUS * MAX_MIG;
    const sim_mig *m = dev;
    if (m < first || m >= end) return NULL;
    sim_mig *found = (sim_mig *)m;
    return found->parent ? found : NULL;
}
static unsigned long long mig_memory_bytes(const sim_gpu *g) {
    return g->memory_total_bytes / 8 / (256ULL << 20) * (256ULL << 20); /* one eighth, in 256 MiB blocks */
}
static void mig_name(const sim_mig *m, char *out, size_t len) {
    double gib = (double)m->parent->memory_total_bytes / 8.0 / (1024.0 * 1024.0 * 1024.0);
    snprintf(out, len, "%s MIG 1g.%.0fgb", m->parent->name, gib);
}
static void mig_uuid(const sim_mig *m, char *out, size_t len) {
    const char *u = m->parent->uuid;
    size_t n = strlen(u);
    /* the parent's UUID with its last two hex digits replaced by the GPU instance id */
    snprintf(out, len, "MIG-%.*s%02x", (int)(n > 6 ? n - 6 : 0), u + 4, MIG_GI_IDS[m->index]);
}

/* Opens a device call: locks, validates, refreshes; every path out goes through DONE. */
#define BEGIN(dev)                                      \
    pthread_mutex_lock(&g_lock);                        \
    nvmlReturn_t rc_ = check_device(dev);               \
    if (rc_ != NVML_SUCCESS) goto done_;                \
    sim_gpu *g = (dev); (void)g;
#define FAIL(code) do { rc_ = (code); goto done_; } while (0)
#define DONE done_: pthread_mutex_unlock(&g_lock); return rc_;
#define NEED(ptr) if (!(ptr)) FAIL(NVML_ERROR_INVALID_ARGUMENT);
/* nvml.h on a MIG-enabled GPU's own handle (docs/simulator.md, "MIG"): the aggregate reads that need
 * privileges answer NO_PERMISSION to a caller outside sim.conf's admin_uids, and the reads that MIG does
 * not support answer NOT_SUPPORTED */
static int privileged(void);
#define MIG_NEEDS_PRIVILEGE if (g->mig_instances && !privileged()) FAIL(NVML_ERROR_NO_PERMISSION);
#define MIG_UNSUPPORTED if (g->mig_instances) FAIL(NVML_ERROR_NOT_SUPPORTED);
/* A MIG call on a MIG handle: locks, checks the parent GPU; the body runs with m set. */
#define BEGIN_MIG(dev)                                  \
    sim_mig *m = mig_of(dev);                           \
    pthread_mutex_lock(&g_lock);                        \
    nvmlReturn_t rc_ = check_device(m->parent);         \
    if (rc_ != NVML_SUCCESS) goto done_;

static unsigned temp_reading(double t) { return t <= 0 ? 0 : (unsigned)(t + 0.5); }

static unsigned fan_pct(const sim_gpu *g) { return (unsigned)(fan_curve_pct(g, g->temp_c) + 0.5); }

static unsigned power_usage_mw(const sim_gpu *g) {
    if (!g->power_usage_is_average) return g->hist[g->k % HISTORY].power_mw;
    /* mean over the last second of ticks */
    int64_t want = 1000000000LL / g_period_ns;
    if (want < 1) want = 1;
    if (want > (int64_t)g->n_hist) want = g->n_hist;
    double sum = 0;
    for (int64_t i = 0; i < want; i++) sum += g->hist[(g->k - i) % HISTORY].power_mw;
    return (unsigned)(sum / (double)want + 0.5);
}

static int holder_alive(const sim_gpu *g);

/* A holder's memory is freed when it exits, like the driver does (pid 0: memory with no process). */
static unsigned long long mem_used_bytes(const sim_gpu *g) {
    int held = g->holder_mem_bytes > 0 && (g->holder_pid <= 0 || holder_alive(g));
    return g->memory_reserved_bytes + (held ? (unsigned long long)g->holder_mem_bytes : 0ULL);
}

/* ---------------------------------------------------------------- init and system */

static nvmlReturn_t do_init(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = NVML_SUCCESS;
    if (!g_loaded) {
        rc = load_config();
        if (rc == NVML_SUCCESS) g_loaded = 1;
    }
    if (rc == NVML_SUCCESS) g_init_count++;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

EXPORT nvmlReturn_t nvmlInit(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInit_v2(void) { return do_init(); }
EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) { (void)flags; return do_init(); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    pthread_mutex_lock(&g_lock);
    nvmlReturn_t rc = g_init_count ? NVML_SUCCESS : NVML_ERROR_UNINITIALIZED;
    if (g_init_count) g_init_count--;
    pthread_mutex_unlock(&g_lock);
    return rc;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t r) {
    switch (r) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded (gpuprobe simulator: GPUPROBE_SIM_DIR not set or has no sim.conf)";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_RESET_REQUIRED: return "GPU requires restart";
    case NVML_ERROR_LIB_RM_VERSION_MISMATCH: return "RM has detected an NVML/RM version mismatch.";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

static nvmlReturn_t copy_str(char *dst, unsigned len, const char *src) {
    if (!dst) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(src) + 1 > len) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(dst, src, strlen(src) + 1);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    return copy_str(version, length, g_driver_version);
}

EXPORT nvmlReturn_t nvmlSystemGetNVMLVersion(char *version, unsigned int length) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    /* "<CUDA major the driver supports>.<driver version>", as the driver's library answers (13.580.65.06 for
     * driver 580.65.06, CUDA 13.0: NVML API 13, the header's NVML_API_VERSION) */
    char v[96];
    snprintf(v, sizeof v, "%d.%s", g_cuda_driver_version / 1000, g_driver_version);
    return copy_str(version, length, v);
}

EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion(int *v) {
    if (!v) return NVML_ERROR_INVALID_ARGUMENT;
    *v = g_cuda_driver_version;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlSystemGetCudaDriverVersion_v2(int *v) { return nvmlSystemGetCudaDriverVersion(v); }

EXPORT nvmlReturn_t nvmlSystemGetProcessName(unsigned int pid, char *name, unsigned int length) {
    if (!name || !length) return NVML_ERROR_INVALID_ARGUMENT;
    char path[64], buf[4096];
    snprintf(path, sizeof path, "/proc/%u/cmdline", pid);
    FILE *f = fopen(path, "r");
    if (!f) return NVML_ERROR_NOT_FOUND;
    size_t n = fread(buf, 1, sizeof buf - 1, f);
    fclose(f);
    buf[n] = 0;
    snprintf(name, length, "%s", buf);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = g_gpu_count;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    if (!device || index >= g_gpu_count) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &g_gpus[index];
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    if (!uuid || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g_gpu_count; i++)
        if (!strcmp(g_gpus[i].uuid, uuid)) { *device = &g_gpus[i]; return NVML_SUCCESS; }
    return NVML_ERROR_NOT_FOUND;
}

static void bus_id(const sim_gpu *g, char *out, size_t len, int legacy) {
    snprintf(out, len, legacy ? "%04X:%02X:00.0" : "%08X:%02X:00.0", 0, g->pci_bus);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId_v2(const char *pci, nvmlDevice_t *device) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    if (!pci || !device) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned i = 0; i < g_gpu_count; i++) {
        char a[32], b[32];
        bus_id(&g_gpus[i], a, sizeof a, 0);
        bus_id(&g_gpus[i], b, sizeof b, 1);
        if (!strcasecmp(a, pci) || !strcasecmp(b, pci)) { *device = &g_gpus[i]; return NVML_SUCCESS; }
    }
    return NVML_ERROR_NOT_FOUND;
}
EXPORT nvmlReturn_t nvmlDeviceGetHandleByPciBusId(const char *pci, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByPciBusId_v2(pci, device);
}

/* ---------------------------------------------------------------- identity */

EXPORT nvmlReturn_t nvmlDeviceGetIndex(nvmlDevice_t dev, unsigned int *index) {
    BEGIN(dev) NEED(index) *index = g->index; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetMinorNumber(nvmlDevice_t dev, unsigned int *minor) {
    BEGIN(dev) NEED(minor) *minor = g->index; DONE
}
static nvmlReturn_t mig_name_call(nvmlDevice_t dev, char *name, unsigned int length) {
    char buf[NAME_LEN + 32];
    BEGIN_MIG(dev) mig_name(m, buf, sizeof buf); rc_ = copy_str(name, length, buf); DONE
}
static nvmlReturn_t mig_uuid_call(nvmlDevice_t dev, char *uuid, unsigned int length) {
    char buf[NAME_LEN + 8];
    BEGIN_MIG(dev) mig_uuid(m, buf, sizeof buf); rc_ = copy_str(uuid, length, buf); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t dev, char *name, unsigned int length) {
    if (mig_of(dev)) return mig_name_call(dev, name, length);
    BEGIN(dev) rc_ = copy_str(name, length, g->name); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t dev, char *uuid, unsigned int length) {
    if (mig_of(dev)) return mig_uuid_call(dev, uuid, length);
    BEGIN(dev) rc_ = copy_str(uuid, length, g->uuid); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetSerial(nvmlDevice_t dev, char *serial, unsigned int length) {
    BEGIN(dev) rc_ = copy_str(serial, length, g->serial); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetBrand(nvmlDevice_t dev, int *brand) {
    BEGIN(dev) NEED(brand) *brand = (int)g->brand; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetArchitecture(nvmlDevice_t dev, unsigned int *arch) {
    BEGIN(dev) NEED(arch) *arch = g->architecture; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetCudaComputeCapability(nvmlDevice_t dev, int *major, int *minor) {
    BEGIN(dev) NEED(major) NEED(minor) *major = (int)g->cc_major; *minor = (int)g->cc_minor; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetVbiosVersion(nvmlDevice_t dev, char *v, unsigned int length) {
    BEGIN(dev) rc_ = copy_str(v, length, "96.00.99.00.01"); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetBoardPartNumber(nvmlDevice_t dev, char *v, unsigned int length) {
    BEGIN(dev) rc_ = copy_str(v, length, "gpuprobe-simulated"); DONE
}

typedef struct {
    char busIdLegacy[16];
    unsigned int domain, bus, device, pciDeviceId, pciSubSystemId;
    char busId[32];
} nvmlPciInfo_t;

EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v3(nvmlDevice_t dev, nvmlPciInfo_t *pci) {
    BEGIN(dev) NEED(pci)
    memset(pci, 0, sizeof *pci);
    bus_id(g, pci->busIdLegacy, sizeof pci->busIdLegacy, 1);
    bus_id(g, pci->busId, sizeof pci->busId, 0);
    pci->bus = g->pci_bus;
    pci->pciDeviceId = g->pci_device_id;
    pci->pciSubSystemId = (g->pci_device_id & 0xFFFF0000u) | 0x10DE;
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo_v2(nvmlDevice_t dev, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(dev, pci); }
EXPORT nvmlReturn_t nvmlDeviceGetPciInfo(nvmlDevice_t dev, nvmlPciInfo_t *pci) { return nvmlDeviceGetPciInfo_v3(dev, pci); }

EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkGeneration(nvmlDevice_t dev, unsigned int *v) { BEGIN(dev) NEED(v) *v = g->pcie_gen; DONE }
EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkGeneration(nvmlDevice_t dev, unsigned int *v) { BEGIN(dev) NEED(v) *v = g->pcie_gen; DONE }
EXPORT nvmlReturn_t nvmlDeviceGetCurrPcieLinkWidth(nvmlDevice_t dev, unsigned int *v) { BEGIN(dev) NEED(v) *v = g->pcie_width; DONE }
EXPORT nvmlReturn_t nvmlDeviceGetMaxPcieLinkWidth(nvmlDevice_t dev, unsigned int *v) { BEGIN(dev) NEED(v) *v = g->pcie_width; DONE }

/* Modes that real datacenter parts report and monitoring tools display. */
EXPORT nvmlReturn_t nvmlDeviceGetPersistenceMode(nvmlDevice_t dev, int *mode) { BEGIN(dev) NEED(mode) *mode = 1; DONE }
EXPORT nvmlReturn_t nvmlDeviceGetDisplayActive(nvmlDevice_t dev, int *v) { BEGIN(dev) NEED(v) *v = 0; DONE }
EXPORT nvmlReturn_t nvmlDeviceGetDisplayMode(nvmlDevice_t dev, int *v) { BEGIN(dev) NEED(v) *v = 0; DONE }
EXPORT nvmlReturn_t nvmlDeviceGetComputeMode(nvmlDevice_t dev, int *v) { BEGIN(dev) NEED(v) *v = 0; DONE }
EXPORT nvmlReturn_t nvmlDeviceGetVirtualizationMode(nvmlDevice_t dev, int *v) { BEGIN(dev) NEED(v) *v = g->virt; DONE }
EXPORT nvmlReturn_t nvmlDeviceGetMultiGpuBoard(nvmlDevice_t dev, unsigned int *v) { BEGIN(dev) NEED(v) *v = 0; DONE }
static nvmlReturn_t mig_is_mig(nvmlDevice_t dev, unsigned int *v) { BEGIN_MIG(dev) NEED(v) *v = 1; DONE }
EXPORT nvmlReturn_t nvmlDeviceIsMigDeviceHandle(nvmlDevice_t dev, unsigned int *v) {
    if (mig_of(dev)) return mig_is_mig(dev, v);
    BEGIN(dev) NEED(v) *v = 0; DONE
}
/* the datacenter parts (NVML_BRAND_NVIDIA, 14) of compute capability x.0, Ampere and newer: A100, H100, H200 */
static int mig_capable(const sim_gpu *g) { return g->brand == 14 && g->architecture >= 7 && g->cc_minor == 0; }
EXPORT nvmlReturn_t nvmlDeviceGetMigMode(nvmlDevice_t dev, unsigned int *cur, unsigned int *pending) {
    BEGIN(dev) NEED(cur) NEED(pending)
    if (!mig_capable(g)) FAIL(NVML_ERROR_NOT_SUPPORTED);
    *cur = *pending = g->mig_instances ? 1 : 0;
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetMaxMigDeviceCount(nvmlDevice_t dev, unsigned int *count) {
    BEGIN(dev) NEED(count) *count = mig_capable(g) ? MAX_MIG : 0; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetMigDeviceHandleByIndex(nvmlDevice_t dev, unsigned int index, nvmlDevice_t *mig) {
    BEGIN(dev) NEED(mig)
    if (!mig_capable(g)) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (!g->mig_instances) FAIL(NVML_ERROR_INVALID_ARGUMENT); /* MIG mode is off */
    if (index >= g->mig_instances) FAIL(NVML_ERROR_NOT_FOUND);
    sim_mig *m = &g_mig[g->index][index];
    m->parent = g;
    m->index = index;
    *mig = (nvmlDevice_t)(void *)m;
    DONE
}
/* The calls below take a MIG handle only: a GPU's own handle is an invalid argument (after the usual checks). */
static nvmlReturn_t not_a_mig_handle(nvmlDevice_t dev) { BEGIN(dev) FAIL(NVML_ERROR_INVALID_ARGUMENT); DONE }
EXPORT nvmlReturn_t nvmlDeviceGetDeviceHandleFromMigDeviceHandle(nvmlDevice_t dev, nvmlDevice_t *parent) {
    if (!mig_of(dev)) return not_a_mig_handle(dev);
    BEGIN_MIG(dev) NEED(parent) *parent = m->parent; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetGpuInstanceId(nvmlDevice_t dev, unsigned int *id) {
    if (!mig_of(dev)) return not_a_mig_handle(dev);
    BEGIN_MIG(dev) NEED(id) *id = MIG_GI_IDS[m->index]; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeInstanceId(nvmlDevice_t dev, unsigned int *id) {
    if (!mig_of(dev)) return not_a_mig_handle(dev);
    BEGIN_MIG(dev) NEED(id) *id = 0; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetDriverModel_v2(nvmlDevice_t dev, int *cur, int *pending) {
    BEGIN(dev) (void)cur; (void)pending; FAIL(NVML_ERROR_NOT_SUPPORTED); DONE /* Windows only */
}
EXPORT nvmlReturn_t nvmlDeviceGetDriverModel(nvmlDevice_t dev, int *cur, int *pending) {
    return nvmlDeviceGetDriverModel_v2(dev, cur, pending);
}
EXPORT nvmlReturn_t nvmlDeviceGetEccMode(nvmlDevice_t dev, int *cur, int *pending) {
    BEGIN(dev) NEED(cur) NEED(pending)
    if (!g->ecc_supported) FAIL(NVML_ERROR_NOT_SUPPORTED);
    *cur = *pending = 1;
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetPerformanceState(nvmlDevice_t dev, int *pstate) {
    BEGIN(dev) NEED(pstate) *pstate = g->util ? 0 : 8; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetPowerState(nvmlDevice_t dev, int *pstate) { return nvmlDeviceGetPerformanceState(dev, pstate); }

/* ---------------------------------------------------------------- memory and utilization */

typedef struct { unsigned long long total, free, used; } nvmlMemory_t;
typedef struct { unsigned int version; unsigned long long total, reserved, free, used; } nvmlMemory_v2_t;
#define NVML_MEMORY_V2 0x02000028u

/* A MIG instance: its slice of the memory, with its share of the driver's reserve in use. */
static nvmlReturn_t mig_memory(nvmlDevice_t dev, unsigned long long *total, unsigned long long *reserved) {
    BEGIN_MIG(dev) *total = mig_memory_bytes(m->parent); *reserved = m->parent->memory_reserved_bytes / 8; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t dev, nvmlMemory_t *m) {
    if (mig_of(dev)) {
        unsigned long long total = 0, reserved = 0;
        if (!m) return NVML_ERROR_INVALID_ARGUMENT;
        nvmlReturn_t rc = mig_memory(dev, &total, &reserved);
        if (rc == NVML_SUCCESS) { m->total = total; m->used = reserved; m->free = total - reserved; }
        return rc;
    }
    BEGIN(dev) NEED(m) MIG_NEEDS_PRIVILEGE
    m->total = g->memory_total_bytes;
    m->used = mem_used_bytes(g);
    m->free = m->total - m->used;
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo_v2(nvmlDevice_t dev, nvmlMemory_v2_t *m) {
    if (mig_of(dev)) {
        unsigned long long total = 0, reserved = 0;
        if (!m) return NVML_ERROR_INVALID_ARGUMENT;
        if (m->version != NVML_MEMORY_V2) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
        nvmlReturn_t rc = mig_memory(dev, &total, &reserved);
        if (rc == NVML_SUCCESS) { m->total = total; m->reserved = reserved; m->used = 0; m->free = total - reserved; }
        return rc;
    }
    BEGIN(dev) NEED(m)
    if (m->version != NVML_MEMORY_V2) FAIL(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    MIG_NEEDS_PRIVILEGE
    m->total = g->memory_total_bytes;
    m->reserved = g->memory_reserved_bytes;
    m->used = mem_used_bytes(g) - g->memory_reserved_bytes;
    m->free = m->total - m->reserved - m->used;
    DONE
}
typedef struct { unsigned long long bar1Total, bar1Free, bar1Used; } nvmlBAR1Memory_t;
EXPORT nvmlReturn_t nvmlDeviceGetBAR1MemoryInfo(nvmlDevice_t dev, nvmlBAR1Memory_t *m) {
    BEGIN(dev) NEED(m)
    m->bar1Total = g->memory_total_bytes;
    m->bar1Used = 2ULL << 20;
    m->bar1Free = m->bar1Total - m->bar1Used;
    DONE
}

typedef struct { unsigned int gpu, memory; } nvmlUtilization_t;
EXPORT nvmlReturn_t nvmlDeviceGetUtilizationRates(nvmlDevice_t dev, nvmlUtilization_t *u) {
    BEGIN(dev) NEED(u) MIG_UNSUPPORTED
    u->gpu = g->hist[g->k % HISTORY].util;
    u->memory = g->hist[g->k % HISTORY].mem_util;
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetEncoderUtilization(nvmlDevice_t dev, unsigned int *util, unsigned int *period_us) {
    BEGIN(dev) NEED(util) NEED(period_us) MIG_UNSUPPORTED *util = 0; *period_us = 167000; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetDecoderUtilization(nvmlDevice_t dev, unsigned int *util, unsigned int *period_us) {
    BEGIN(dev) NEED(util) NEED(period_us) MIG_UNSUPPORTED *util = 0; *period_us = 167000; DONE
}

/* ---------------------------------------------------------------- power and energy */

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t dev, unsigned int *mw) {
    BEGIN(dev) NEED(mw) *mw = power_usage_mw(g); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t dev, unsigned long long *mj) {
    BEGIN(dev) NEED(mj) *mj = (unsigned long long)(g->energy_j * 1000.0); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementMode(nvmlDevice_t dev, int *mode) { BEGIN(dev) NEED(mode) *mode = 1; DONE }
EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimit(nvmlDevice_t dev, unsigned int *mw) {
    BEGIN(dev) NEED(mw) *mw = (unsigned)(g->limit_w * 1000.0 + 0.5); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t dev, unsigned int *mw) {
    return nvmlDeviceGetPowerManagementLimit(dev, mw);
}
EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementDefaultLimit(nvmlDevice_t dev, unsigned int *mw) {
    BEGIN(dev) NEED(mw) *mw = (unsigned)(g->limit_default_w * 1000.0 + 0.5); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetPowerManagementLimitConstraints(nvmlDevice_t dev, unsigned int *min_mw, unsigned int *max_mw) {
    BEGIN(dev) NEED(min_mw) NEED(max_mw)
    *min_mw = (unsigned)(g->limit_min_w * 1000.0 + 0.5);
    *max_mw = (unsigned)(g->limit_max_w * 1000.0 + 0.5);
    DONE
}
static int privileged(void) {
    uid_t me = geteuid();
    for (unsigned i = 0; i < g_admin_count; i++)
        if (g_admin_uids[i] == me) return 1;
    return 0;
}

/* Takes effect at the next update boundary, in every process (it is an event in the GPU's history).
 * Like the driver, only root may set it (or a uid sim.conf's admin_uids grants it to, for tests run
 * unprivileged): any other effective uid gets NO_PERMISSION, whatever the value. */
EXPORT nvmlReturn_t nvmlDeviceSetPowerManagementLimit(nvmlDevice_t dev, unsigned int mw) {
    BEGIN(dev)
    if (!privileged()) FAIL(NVML_ERROR_NO_PERMISSION);
    if (mw < (unsigned)(g->limit_min_w * 1000.0 + 0.5) || mw > (unsigned)(g->limit_max_w * 1000.0 + 0.5))
        FAIL(NVML_ERROR_INVALID_ARGUMENT);
    rc_ = append_event(g, 'L', mw);
    DONE
}

/* ---------------------------------------------------------------- temperature and cooling */

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t dev, int sensor, unsigned int *t) {
    BEGIN(dev) NEED(t)
    if (sensor != 0) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *t = temp_reading(g->temp_c);
    DONE
}
typedef struct { unsigned int version; int sensorType; int temperature; } nvmlTemperature_t;
#define NVML_TEMPERATURE_V1 0x100000Cu
EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t dev, nvmlTemperature_t *t) {
    BEGIN(dev) NEED(t)
    if (t->version != NVML_TEMPERATURE_V1) FAIL(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (t->sensorType != 0) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    t->temperature = (int)temp_reading(g->temp_c);
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetTemperatureThreshold(nvmlDevice_t dev, int type, unsigned int *t) {
    BEGIN(dev) NEED(t)
    switch (type) {
    case 0: *t = (unsigned)g->shutdown_c; break;
    case 1: *t = (unsigned)g->slowdown_c; break;
    case 2: *t = (unsigned)g->mem_max_c; break;
    case 3: *t = (unsigned)g->gpu_max_c; break;
    default: FAIL(NVML_ERROR_NOT_SUPPORTED);
    }
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetNumFans(nvmlDevice_t dev, unsigned int *n) {
    BEGIN(dev) NEED(n)
    if (!g->fan_count) FAIL(NVML_ERROR_NOT_SUPPORTED);
    *n = g->fan_count;
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed_v2(nvmlDevice_t dev, unsigned int fan, unsigned int *pct) {
    BEGIN(dev) NEED(pct)
    if (!g->fan_count) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (fan >= g->fan_count) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *pct = fan_pct(g);
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetFanSpeed(nvmlDevice_t dev, unsigned int *pct) { return nvmlDeviceGetFanSpeed_v2(dev, 0, pct); }

/* ---------------------------------------------------------------- clocks and clock events */

static unsigned clock_now(const sim_gpu *g, int type) {
    switch (type) {
    case 0: case 1: return g->sm_mhz;  /* graphics, SM */
    case 2: return g->mem_clock_mhz;
    case 3: return g->sm_mhz * 9 / 10; /* video */
    default: return 0;
    }
}
static unsigned clock_max(const sim_gpu *g, int type) {
    switch (type) {
    case 0: case 1: return g->sm_clock_max_mhz;
    case 2: return g->mem_clock_mhz;
    case 3: return g->sm_clock_max_mhz * 9 / 10;
    default: return 0;
    }
}
EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    BEGIN(dev) NEED(mhz)
    if (type < 0 || type > 3) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *mhz = clock_now(g, type);
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t dev, int type, unsigned int *mhz) {
    BEGIN(dev) NEED(mhz)
    if (type < 0 || type > 3) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *mhz = clock_max(g, type);
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetClock(nvmlDevice_t dev, int type, int id, unsigned int *mhz) {
    BEGIN(dev) NEED(mhz)
    if (type < 0 || type > 3) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    switch (id) {
    case 0: *mhz = clock_now(g, type); break;
    case 1: case 2: *mhz = type == 2 ? g->mem_clock_mhz : g->sm_clock_base_mhz; break;
    case 3: *mhz = clock_max(g, type); break;
    default: FAIL(NVML_ERROR_INVALID_ARGUMENT);
    }
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetApplicationsClock(nvmlDevice_t dev, int type, unsigned int *mhz) {
    return nvmlDeviceGetClock(dev, type, 1, mhz);
}
EXPORT nvmlReturn_t nvmlDeviceGetDefaultApplicationsClock(nvmlDevice_t dev, int type, unsigned int *mhz) {
    return nvmlDeviceGetClock(dev, type, 2, mhz);
}
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t dev, unsigned long long *r) {
    BEGIN(dev) NEED(r) *r = g->reasons; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *r) {
    return nvmlDeviceGetCurrentClocksEventReasons(dev, r);
}
EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksEventReasons(nvmlDevice_t dev, unsigned long long *r) {
    BEGIN(dev) NEED(r) *r = REASONS_SUPPORTED; DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetSupportedClocksThrottleReasons(nvmlDevice_t dev, unsigned long long *r) {
    return nvmlDeviceGetSupportedClocksEventReasons(dev, r);
}

/* ---------------------------------------------------------------- PCIe */

EXPORT nvmlReturn_t nvmlDeviceGetPcieThroughput(nvmlDevice_t dev, int counter, unsigned int *kb_per_s) {
    BEGIN(dev) NEED(kb_per_s)
    double rx = g->pcie_bytes_per_s_full * g->hist[g->k % HISTORY].util / 100.0;
    if (counter == 0) *kb_per_s = (unsigned)(rx * 0.25 / 1024.0);
    else if (counter == 1) *kb_per_s = (unsigned)(rx / 1024.0);
    else FAIL(NVML_ERROR_INVALID_ARGUMENT);
    DONE
}

/* ---------------------------------------------------------------- processes */

static int holder_alive(const sim_gpu *g) {
    if (g->holder_pid <= 0) return 0;
    return kill((pid_t)g->holder_pid, 0) == 0 || errno == EPERM;
}

#define NO_INSTANCE 0xFFFFFFFFu /* a process not in a MIG instance */
/* The GPU's process list into nvml.h's records of `stride` bytes (v1: no MIG ids); `gi`: the GPU instance
 * the processes are in (NO_INSTANCE on a GPU without MIG; their compute instance is then 0). */
static nvmlReturn_t fill_processes(sim_gpu *g, unsigned int *count, void *infos, size_t stride, int v1, unsigned gi) {
    unsigned n = holder_alive(g) ? 1 : 0;
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    if (!infos || *count < n) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    *count = n;
    if (n) {
        unsigned char *p = infos;
        memset(p, 0, stride);
        unsigned pid = (unsigned)g->holder_pid;
        unsigned long long mem = (unsigned long long)g->holder_mem_bytes;
        memcpy(p, &pid, 4);
        memcpy(p + 8, &mem, 8);
        if (!v1) {
            unsigned ci = gi == NO_INSTANCE ? NO_INSTANCE : 0;
            memcpy(p + 16, &gi, 4);
            memcpy(p + 20, &ci, 4);
        }
    }
    return NVML_SUCCESS;
}
static nvmlReturn_t no_processes(unsigned int *count);
/* A MIG instance's processes (no privileges needed, as nvml.h says): the GPU's holder runs in the first one. */
static nvmlReturn_t mig_processes(nvmlDevice_t dev, unsigned int *count, void *infos, size_t stride, int v1) {
    BEGIN_MIG(dev)
    rc_ = m->index == 0 ? fill_processes(m->parent, count, infos, stride, v1, MIG_GI_IDS[0]) : no_processes(count);
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count, void *infos) {
    if (mig_of(dev)) return mig_processes(dev, count, infos, 24, 0);
    BEGIN(dev) MIG_NEEDS_PRIVILEGE rc_ = fill_processes(g, count, infos, 24, 0, NO_INSTANCE); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses_v2(nvmlDevice_t dev, unsigned int *count, void *infos) {
    if (mig_of(dev)) return mig_processes(dev, count, infos, 24, 0);
    BEGIN(dev) MIG_NEEDS_PRIVILEGE rc_ = fill_processes(g, count, infos, 24, 0, NO_INSTANCE); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetComputeRunningProcesses(nvmlDevice_t dev, unsigned int *count, void *infos) {
    if (mig_of(dev)) return mig_processes(dev, count, infos, 16, 1);
    BEGIN(dev) MIG_NEEDS_PRIVILEGE rc_ = fill_processes(g, count, infos, 16, 1, NO_INSTANCE); DONE
}
static nvmlReturn_t no_processes(unsigned int *count) {
    if (!count) return NVML_ERROR_INVALID_ARGUMENT;
    *count = 0;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count, void *infos) {
    BEGIN(dev) MIG_NEEDS_PRIVILEGE (void)infos; rc_ = no_processes(count); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses_v2(nvmlDevice_t dev, unsigned int *count, void *infos) {
    BEGIN(dev) MIG_NEEDS_PRIVILEGE (void)infos; rc_ = no_processes(count); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetGraphicsRunningProcesses(nvmlDevice_t dev, unsigned int *count, void *infos) {
    BEGIN(dev) MIG_NEEDS_PRIVILEGE (void)infos; rc_ = no_processes(count); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetMPSComputeRunningProcesses_v3(nvmlDevice_t dev, unsigned int *count, void *infos) {
    BEGIN(dev) MIG_NEEDS_PRIVILEGE (void)infos; rc_ = no_processes(count); DONE
}

typedef struct {
    unsigned int pid;
    unsigned long long timeStamp;
    unsigned int smUtil, memUtil, encUtil, decUtil;
} nvmlProcessUtilizationSample_t;

EXPORT nvmlReturn_t nvmlDeviceGetProcessUtilization(nvmlDevice_t dev, nvmlProcessUtilizationSample_t *s,
                                                    unsigned int *count, unsigned long long last_seen_us) {
    BEGIN(dev) NEED(count) MIG_UNSUPPORTED
    const sim_hist *h = &g->hist[g->k % HISTORY];
    if (!holder_alive(g) || (unsigned long long)h->t_us <= last_seen_us) FAIL(NVML_ERROR_NOT_FOUND);
    if (!s || *count < 1) { *count = 1; FAIL(NVML_ERROR_INSUFFICIENT_SIZE); }
    s->pid = (unsigned)g->holder_pid;
    s->timeStamp = (unsigned long long)h->t_us;
    s->smUtil = h->util;
    s->memUtil = h->mem_util;
    s->encUtil = s->decUtil = 0;
    *count = 1;
    DONE
}

/* ---------------------------------------------------------------- field values and samples */

typedef union {
    double dVal;
    unsigned int uiVal;
    unsigned long ulVal;
    unsigned long long ullVal;
    signed long long sllVal;
    signed int siVal;
    unsigned short usVal;
} nvmlValue_t;

typedef struct {
    unsigned int fieldId;
    unsigned int scopeId;
    long long timestamp;
    long long latencyUsec;
    int valueType;
    int nvmlReturn;
    nvmlValue_t value;
} nvmlFieldValue_t;

enum { VT_DOUBLE = 0, VT_UINT = 1, VT_ULL = 3, VT_SLL = 4, VT_SINT = 5 };

static int read_field(const sim_gpu *g, nvmlFieldValue_t *f) {
    unsigned mw;
    if (f->fieldId >= 138 && f->fieldId <= 141) {
        /* NVLINK_THROUGHPUT_DATA_TX/RX, RAW_TX/RX: KiB carried by link scopeId so far; all-reduce traffic is
         * symmetric (TX = RX); raw adds the protocol overhead (simulated: 1/16) */
        if (!g->nvlink_links) return NVML_ERROR_NOT_SUPPORTED;
        if (f->scopeId >= g->nvlink_links) return NVML_ERROR_INVALID_ARGUMENT;
        double kib = g->nvlink_kib_per_link * (f->fieldId >= 140 ? 17.0 / 16.0 : 1.0);
        f->valueType = VT_ULL;
        f->value.ullVal = (unsigned long long)kib;
        return NVML_SUCCESS;
    }
    if (f->fieldId == 38 || f->fieldId == 45 || f->fieldId == 52 || f->fieldId == 59) {
        /* NVLINK_CRC_FLIT / CRC_DATA / REPLAY / RECOVERY_ERROR_COUNT_TOTAL: per link, as nvml.h says ("Link ID
         * needs to be specified in the scopeId field"; the total is over the link's lanes): what
         * nvmlDeviceGetNvLinkErrorCounter answers for link scopeId (CRC flit and replay move together, the
         * others stay 0) */
        if (!g->nvlink_links) return NVML_ERROR_NOT_SUPPORTED;
        if (f->scopeId >= g->nvlink_links) return NVML_ERROR_INVALID_ARGUMENT;
        /* the counter each total stands for: 52 DL_REPLAY (0), 59 DL_RECOVERY (1), 38 DL_CRC_FLIT (2), 45 DL_CRC_DATA (3) */
        unsigned counter = f->fieldId == 52 ? 0 : f->fieldId == 59 ? 1 : f->fieldId == 38 ? 2 : 3;
        if (g->nvlink_unsupported >> counter & 1) return NVML_ERROR_NOT_SUPPORTED;
        unsigned l = f->scopeId;
        f->valueType = VT_ULL;
        f->value.ullVal = f->fieldId == 38 ? g->nvlink_crc_flit[l] : f->fieldId == 52 ? g->nvlink_replay[l] : 0;
        return NVML_SUCCESS;
    }
    switch (f->fieldId) {
    case 91: /* NVLINK_LINK_COUNT: what nvitop's NVLink view asks first */
        if (!g->nvlink_links) return NVML_ERROR_NOT_SUPPORTED;
        f->valueType = VT_UINT; f->value.uiVal = (unsigned)g->nvlink_links; return NVML_SUCCESS;
    case 82: /* MEMORY_TEMP */
        if (!g->mem_temp_supported) return NVML_ERROR_NOT_SUPPORTED;
        f->valueType = VT_UINT; f->value.uiVal = temp_reading(g->mem_temp_c); return NVML_SUCCESS;
    case 83: case 191: /* TOTAL_ENERGY_CONSUMPTION, ENERGY (mJ) */
        f->valueType = VT_ULL; f->value.ullVal = (unsigned long long)(g->energy_j * 1000.0); return NVML_SUCCESS;
    case 185: /* POWER_AVERAGE: not on GA100 */
        if (!g->power_usage_is_average) return NVML_ERROR_NOT_SUPPORTED;
        f->valueType = VT_UINT; f->value.uiVal = power_usage_mw(g); return NVML_SUCCESS;
    case 186: /* POWER_INSTANT */
        f->valueType = VT_UINT; f->value.uiVal = g->hist[g->k % HISTORY].power_mw; return NVML_SUCCESS;
    case 187: mw = (unsigned)(g->limit_min_w * 1000 + 0.5); break;
    case 188: mw = (unsigned)(g->limit_max_w * 1000 + 0.5); break;
    case 189: mw = (unsigned)(g->limit_default_w * 1000 + 0.5); break;
    case 190: case 192: mw = (unsigned)(g->limit_w * 1000 + 0.5); break;
    case 195: /* TEMPERATURE_MEM_MAX_TLIMIT: margin to the memory limit */
        if (!g->mem_temp_supported) return NVML_ERROR_NOT_SUPPORTED;
        f->valueType = VT_SINT; f->value.siVal = g->mem_max_c - (int)temp_reading(g->mem_temp_c); return NVML_SUCCESS;
    case 196: /* TEMPERATURE_GPU_MAX_TLIMIT */
        f->valueType = VT_SINT; f->value.siVal = g->gpu_max_c - (int)temp_reading(g->temp_c); return NVML_SUCCESS;
    case 197: f->valueType = VT_ULL; f->value.ullVal = (unsigned long long)g->pcie_tx_bytes; return NVML_SUCCESS;
    case 198: f->valueType = VT_ULL; f->value.ullVal = (unsigned long long)g->pcie_rx_bytes; return NVML_SUCCESS;
    default: return NVML_ERROR_NOT_SUPPORTED;
    }
    f->valueType = VT_UINT;
    f->value.uiVal = mw;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetFieldValues(nvmlDevice_t dev, int n, nvmlFieldValue_t *values) {
    BEGIN(dev)
    if (n <= 0 || !values) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    int any = 0;
    long long ts_us = g->hist[g->k % HISTORY].t_us;
    for (int i = 0; i < n; i++) {
        nvmlFieldValue_t *f = &values[i];
        f->timestamp = ts_us;
        f->latencyUsec = 0;
        f->value.ullVal = 0;
        /* scopeId is the link: the throughput counters and the error totals */
        unsigned id = f->fieldId;
        int per_link = (id >= 138 && id <= 141) || id == 38 || id == 45 || id == 52 || id == 59;
        f->nvmlReturn = f->scopeId > 1 && !per_link ? NVML_ERROR_NOT_SUPPORTED : read_field(g, f);
        any |= f->nvmlReturn == NVML_SUCCESS;
    }
    (void)any; /* like the driver: per-field status, SUCCESS for the call */
    DONE
}

typedef struct { unsigned long long timeStamp; nvmlValue_t sampleValue; } nvmlSample_t;

static int sample_value(const sim_hist *h, int type, unsigned *v) {
    switch (type) {
    case 0: *v = h->power_mw; return 1;
    case 1: *v = h->util; return 1;
    case 2: *v = h->mem_util; return 1;
    case 3: case 4: *v = 0; return 1;
    case 5: *v = h->sm_mhz; return 1;
    case 6: *v = h->mem_mhz; return 1;
    default: return 0;
    }
}

EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t dev, int type, unsigned long long last_seen_us,
                                         int *value_type, unsigned int *count, nvmlSample_t *samples) {
    BEGIN(dev) NEED(value_type) NEED(count)
    /* GPU, memory, encoder and decoder utilization samples (1-4): not on MIG */
    if (g->mig_instances && type >= 1 && type <= 4) FAIL(NVML_ERROR_NOT_SUPPORTED);
    unsigned dummy;
    if (!sample_value(&g->hist[0], type, &dummy)) FAIL(NVML_ERROR_NOT_SUPPORTED);
    *value_type = VT_UINT;
    if (!samples) { *count = g->n_hist; FAIL(NVML_SUCCESS); }
    unsigned out = 0;
    for (int64_t i = (int64_t)g->n_hist - 1; i >= 0; i--) {
        const sim_hist *h = &g->hist[(g->k - i) % HISTORY];
        if ((unsigned long long)h->t_us <= last_seen_us) continue;
        if (out == *count) break;
        samples[out].timeStamp = (unsigned long long)h->t_us;
        samples[out].sampleValue.ullVal = 0;
        sample_value(h, type, &samples[out].sampleValue.uiVal);
        out++;
    }
    *count = out;
    if (!out) FAIL(NVML_ERROR_NOT_FOUND);
    DONE
}

/* ---------------------------------------------------------------- health: ECC, retired pages, remapped rows */

static nvmlReturn_t ecc_count(const sim_gpu *g, int type, int counter, unsigned long long *count) {
    if (!g->ecc_supported) return NVML_ERROR_NOT_SUPPORTED;
    if (type == 0 && counter == 0) *count = g->ecc_corr_vol;       /* corrected, volatile */
    else if (type == 0 && counter == 1) *count = g->ecc_corr_agg;  /* corrected, aggregate */
    else if (type == 1 && counter == 0) *count = g->ecc_unc_vol;   /* uncorrected, volatile */
    else if (type == 1 && counter == 1) *count = g->ecc_unc_agg;   /* uncorrected, aggregate */
    else return NVML_ERROR_INVALID_ARGUMENT;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEccErrors(nvmlDevice_t dev, int type, int counter, unsigned long long *count) {
    BEGIN(dev) NEED(count) rc_ = ecc_count(g, type, counter, count); DONE
}

/* Every simulated error is a device-memory (DRAM) error: the other locations count none. */
EXPORT nvmlReturn_t nvmlDeviceGetMemoryErrorCounter(nvmlDevice_t dev, int type, int counter, int location,
                                                    unsigned long long *count) {
    BEGIN(dev) NEED(count)
    if (location < 0 || location > 7) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    rc_ = ecc_count(g, type, counter, count);
    if (rc_ == NVML_SUCCESS && location != 2) *count = 0;
    DONE
}

/* Page retirement: parts older than Ampere (row_remapping 0). A retired page's address is made up but stable. */
static nvmlReturn_t retired_pages(sim_gpu *g, int cause, unsigned int *count, unsigned long long *addresses,
                                  unsigned long long *times) {
    if (!g->ecc_supported || g->row_remapping) return NVML_ERROR_NOT_SUPPORTED;
    if (!count || cause < 0 || cause > 1) return NVML_ERROR_INVALID_ARGUMENT;
    unsigned n = cause == 1 ? g->retired_dbe_pages : 0;
    if (!addresses || *count < n) {
        *count = n;
        return n ? NVML_ERROR_INSUFFICIENT_SIZE : NVML_SUCCESS;
    }
    for (unsigned i = 0; i < n; i++) {
        addresses[i] = 0x1000ULL * (0x2000 + 17 * (unsigned long long)i);
        if (times) times[i] = (unsigned long long)(g_start_ns / 1000000000LL);
    }
    *count = n;
    return NVML_SUCCESS;
}
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages(nvmlDevice_t dev, int cause, unsigned int *count,
                                              unsigned long long *addresses) {
    BEGIN(dev) rc_ = retired_pages(g, cause, count, addresses, NULL); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPages_v2(nvmlDevice_t dev, int cause, unsigned int *count,
                                                 unsigned long long *addresses, unsigned long long *times) {
    BEGIN(dev) rc_ = retired_pages(g, cause, count, addresses, times); DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetRetiredPagesPendingStatus(nvmlDevice_t dev, int *pending) {
    BEGIN(dev) NEED(pending)
    if (!g->ecc_supported || g->row_remapping) FAIL(NVML_ERROR_NOT_SUPPORTED);
    *pending = g->retire_pending;
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetRemappedRows(nvmlDevice_t dev, unsigned int *corr, unsigned int *unc,
                                              unsigned int *pending, unsigned int *failure) {
    BEGIN(dev) NEED(corr) NEED(unc) NEED(pending) NEED(failure) MIG_UNSUPPORTED
    if (!g->ecc_supported || !g->row_remapping) FAIL(NVML_ERROR_NOT_SUPPORTED);
    *corr = g->remap_corr_rows;
    *unc = g->remap_unc_rows;
    *pending = (unsigned)g->remap_pending;
    *failure = (unsigned)g->remap_failure;
    DONE
}
/* No replays are simulated on the PCIe link. */
EXPORT nvmlReturn_t nvmlDeviceGetPcieReplayCounter(nvmlDevice_t dev, unsigned int *value) {
    BEGIN(dev) NEED(value) *value = 0; DONE
}

/* ---------------------------------------------------------------- violation time, fan RPM */

typedef struct { unsigned long long referenceTime, violationTime; } nvmlViolationTime_t;

/* The time (ns, nvml.h) the clocks were held down by the power cap or by thermal slowdown: the ticks whose
 * clock-event reasons had SW_POWER_CAP / HW_THERMAL, up to the start of the present tick (referenceTime, µs). */
EXPORT nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t dev, int policy, nvmlViolationTime_t *v) {
    BEGIN(dev) NEED(v)
    v->referenceTime = (unsigned long long)g->hist[g->k % HISTORY].t_us;
    switch (policy) {
    case 0: v->violationTime = g->viol_power_ns; break;   /* NVML_PERF_POLICY_POWER */
    case 1: v->violationTime = g->viol_thermal_ns; break; /* NVML_PERF_POLICY_THERMAL */
    case 2: case 3: case 4: case 5: case 10: case 11: v->violationTime = 0; break; /* never limited by these */
    default: FAIL(NVML_ERROR_INVALID_ARGUMENT);
    }
    DONE
}

typedef struct { unsigned int version, fan, speed; } nvmlFanSpeedInfo_t;
#define NVML_FAN_SPEED_INFO_V1 0x100000Cu
#define FAN_MAX_RPM 3000.0 /* simulated: the speed at 100 % */
EXPORT nvmlReturn_t nvmlDeviceGetFanSpeedRPM(nvmlDevice_t dev, nvmlFanSpeedInfo_t *info) {
    BEGIN(dev) NEED(info)
    if (info->version != NVML_FAN_SPEED_INFO_V1) FAIL(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    if (!g->fan_count) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (info->fan >= g->fan_count) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    info->speed = (unsigned)(fan_curve_pct(g, g->temp_c) / 100.0 * FAN_MAX_RPM + 0.5);
    DONE
}

/* ---------------------------------------------------------------- NVLink */

EXPORT nvmlReturn_t nvmlDeviceGetNvLinkState(nvmlDevice_t dev, unsigned int link, int *active) {
    BEGIN(dev) NEED(active)
    if (!g->nvlink_links) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (link >= g->nvlink_links) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *active = 1;
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkVersion(nvmlDevice_t dev, unsigned int link, unsigned int *version) {
    BEGIN(dev) NEED(version)
    if (!g->nvlink_links) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (link >= g->nvlink_links) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    *version = g->architecture >= 9 ? 4 : 3; /* Hopper NVLink 4, Ampere NVLink 3 */
    DONE
}
EXPORT nvmlReturn_t nvmlDeviceGetNvLinkErrorCounter(nvmlDevice_t dev, unsigned int link, int counter,
                                                    unsigned long long *value) {
    BEGIN(dev) NEED(value)
    if (!g->nvlink_links) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (link >= g->nvlink_links) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (counter >= 0 && counter < 5 && (g->nvlink_unsupported >> counter & 1)) FAIL(NVML_ERROR_NOT_SUPPORTED);
    switch (counter) {
    case 0: *value = g->nvlink_replay[link]; break;   /* DL_REPLAY */
    case 1: *value = 0; break;                         /* DL_RECOVERY: no link retraining simulated */
    case 2: *value = g->nvlink_crc_flit[link]; break; /* DL_CRC_FLIT */
    case 3: case 4: *value = 0; break;                 /* DL_CRC_DATA, DL_ECC_DATA */
    default: FAIL(NVML_ERROR_INVALID_ARGUMENT);
    }
    DONE
}

/* ---------------------------------------------------------------- events */

#define EVENT_SBE 0x1ULL
#define EVENT_DBE 0x2ULL
#define EVENT_XID 0x8ULL
#define EVENT_CLOCK 0x10ULL
#define EVENT_POWER_SOURCE 0x80ULL

static unsigned long long supported_events(const sim_gpu *g) {
    /* PowerSourceChange is supported but never happens: no simulated GPU runs on a battery */
    return EVENT_XID | EVENT_CLOCK | EVENT_POWER_SOURCE | (g->ecc_supported ? EVENT_SBE | EVENT_DBE : 0);
}

/* One registration per device: events after reg_ns, read from the device's history (cursor) and clock ring. */
typedef struct {
    unsigned long long mask;
    int64_t reg_ns;
    size_t cursor;
    unsigned long long clock_cursor;
} sim_event_reg;

#define EVENT_SET_MAGIC 0x65767473u
typedef struct sim_event_set {
    unsigned magic;
    sim_event_reg regs[MAX_GPUS];
    /* How a wait blocks (see nvmlEventSetWait_v2): an inotify descriptor watching every GPU's history
     * (-1: not opened yet, -2: unavailable, so the wait looks at every tick), the tick at which the set
     * must next look at the state, and the tick by which a history write seen by inotify (or one that may
     * have come before the watch existed) has been read into memory (-1: none outstanding). All under g_lock. */
    int inotify_fd;
    int64_t check_tick, unread_tick;
} *nvmlEventSet_t;

typedef struct {
    nvmlDevice_t device;
    unsigned long long eventType, eventData;
    unsigned int gpuInstanceId, computeInstanceId;
} nvmlEventData_t;

EXPORT nvmlReturn_t nvmlEventSetCreate(nvmlEventSet_t *set) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    if (!set) return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_event_set *s = calloc(1, sizeof *s);
    if (!s) return NVML_ERROR_UNKNOWN;
    s->magic = EVENT_SET_MAGIC;
    s->inotify_fd = -1;
    s->unread_tick = -1;
    *set = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlEventSetFree(nvmlEventSet_t set) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    if (!set || set->magic != EVENT_SET_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    set->magic = 0;
    if (set->inotify_fd >= 0) close(set->inotify_fd);
    free(set);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetSupportedEventTypes(nvmlDevice_t dev, unsigned long long *types) {
    BEGIN(dev) NEED(types) *types = supported_events(g); DONE
}

/* Like the driver, a set sees only what happens after the registration: a restarted agent does not get
 * the old events again. Registering again for a device adds types and keeps the set's place. */
EXPORT nvmlReturn_t nvmlDeviceRegisterEvents(nvmlDevice_t dev, unsigned long long types, nvmlEventSet_t set) {
    BEGIN(dev)
    if (!set || set->magic != EVENT_SET_MAGIC) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (types & ~supported_events(g)) FAIL(NVML_ERROR_NOT_SUPPORTED);
    sim_event_reg *r = &set->regs[g->index];
    if (!r->mask) {
        r->reg_ns = now_ns();
        r->cursor = 0;
        r->clock_cursor = g->clock_changes;
    }
    r->mask |= types;
    DONE
}

/* The next event for the set, or 0. Events in the history apply at the first tick boundary at or after their
 * time (like every input), so the set delivers those up to the present tick: g->next_event. */
static int next_event_of(struct sim_event_set *set, unsigned i, nvmlEventData_t *out) {
    {
        sim_event_reg *r = &set->regs[i];
        if (!r->mask) return 0;
        sim_gpu *g = &g_gpus[i];
        while (r->cursor < g->next_event) {
            const sim_event *e = &g->events[r->cursor++];
            if (e->t_ns <= r->reg_ns) continue;
            unsigned long long type = 0, data = 0;
            if (e->kind == 'X') { type = EVENT_XID; data = (unsigned long long)e->value; }
            else if (e->kind == 'E' && e->value == 1) type = EVENT_SBE;
            else if (e->kind == 'E' && e->value == 2) type = EVENT_DBE;
            if (!(type & r->mask)) continue;
            out->device = g;
            out->eventType = type;
            out->eventData = data;
            out->gpuInstanceId = out->computeInstanceId = 0xFFFFFFFFu; /* not in a MIG instance */
            return 1;
        }
        if (r->mask & EVENT_CLOCK) {
            /* the ring keeps the latest CLOCK_RING changes; older ones are dropped, as a full driver queue drops */
            if (g->clock_changes > CLOCK_RING && r->clock_cursor < g->clock_changes - CLOCK_RING)
                r->clock_cursor = g->clock_changes - CLOCK_RING;
            while (r->clock_cursor < g->clock_changes) {
                int64_t t = g->clock_ring_t_ns[r->clock_cursor++ % CLOCK_RING];
                if (t <= r->reg_ns) continue;
                out->device = g;
                out->eventType = EVENT_CLOCK;
                out->eventData = 0;
                out->gpuInstanceId = out->computeInstanceId = 0xFFFFFFFFu;
                return 1;
            }
        }
    }
    return 0;
}

/* The next event for the set, or 0; or, while a registered GPU is failed, that GPU's own queued events (an
 * XID 79 comes before the loss) and then its failure code (> 1: nvml.h's GPU_IS_LOST, or the other code
 * `sim fail --answer` gave) in place of any other GPU's event: one lost GPU spoils the whole wait, as
 * nvml.h's nvmlEventSetWait_v2 allows, so a reader must take it out of the set to hear the others. */
static int next_event_for(struct sim_event_set *set, nvmlEventData_t *out) {
    for (unsigned i = 0; i < g_gpu_count; i++) {
        if (!set->regs[i].mask || !g_gpus[i].failed) continue;
        if (next_event_of(set, i, out)) return 1;
        return g_gpus[i].failed;
    }
    for (unsigned i = 0; i < g_gpu_count; i++)
        if (next_event_of(set, i, out)) return 1;
    return 0;
}

static int64_t tick_of(int64_t t) { return t < g_start_ns ? 0 : (t - g_start_ns) / g_period_ns; }

/* Opens the set's inotify descriptor with a watch on every GPU's history (all of them: a load on one GPU
 * moves the node's power, hence the inlet air and the clocks of the others). Without inotify, or when a
 * history is missing, the set falls back to looking at every tick. Called with g_lock held. */
static void open_watch(struct sim_event_set *s) {
    int fd = inotify_init1(IN_NONBLOCK | IN_CLOEXEC);
    for (unsigned i = 0; fd >= 0 && i < g_gpu_count; i++) {
        if (inotify_add_watch(fd, g_gpus[i].events_path, IN_MODIFY) < 0) {
            close(fd);
            fd = -1;
        }
    }
    s->inotify_fd = fd >= 0 ? fd : -2;
    /* a line written before the watch existed is read at the next tick boundary at the latest */
    s->unread_tick = tick_of(now_ns()) + 1;
    s->check_tick = 0;
}

/* Empties the descriptor; 1 if a history was written since the last drain. */
static int drain_watch(struct sim_event_set *s) {
    char buf[4096] __attribute__((aligned(__alignof__(struct inotify_event))));
    int written = 0;
    while (read(s->inotify_fd, buf, sizeof buf) > 0) written = 1;
    return written;
}

#define PREDICT_TICKS 50 /* how far ahead one look computes, 5 s at the default 100 ms period */
static sim_gpu g_scratch[MAX_GPUS];

/* The first tick after g_tick in which something could reach the set if no history is written meanwhile:
 * a line of a registered GPU's history takes effect (kept in memory, not yet applied), or a registered
 * GPU's SM clock changes (thermal slowdown, the power cap). The machine is a pure function of its histories
 * and the time, so stepping a copy of every GPU ahead is exactly what the reader will compute then. At most
 * PREDICT_TICKS ahead; the caller looks again then. Called with g_lock held, after refresh(). */
static int64_t next_change_tick(const struct sim_event_set *s) {
    unsigned n = g_gpu_count;
    memcpy(g_scratch, g_gpus, n * sizeof *g_scratch);
    for (int64_t k = g_tick + 1; k <= g_tick + PREDICT_TICKS; k++) {
        double p_node = 0.0;
        for (unsigned i = 0; i < n; i++) p_node += g_scratch[i].power_w;
        for (unsigned i = 0; i < n; i++) end_tick(&g_scratch[i], p_node);
        for (unsigned i = 0; i < n; i++) begin_tick(&g_scratch[i], k);
        for (unsigned i = 0; i < n; i++) {
            const sim_event_reg *r = &s->regs[i];
            if (!r->mask) continue;
            if (g_scratch[i].next_event != g_gpus[i].next_event) return k;
            if ((r->mask & EVENT_CLOCK) && g_scratch[i].clock_changes != g_gpus[i].clock_changes) return k;
        }
    }
    return g_tick + PREDICT_TICKS;
}

/* Blocks up to timeout_ms, as the driver's wait blocks: idle, it costs nothing. Events reach a set only at
 * tick boundaries, and only two things make one: a line appended to a history (`gpuprobe sim fail`, a load,
 * a power limit), which inotify reports, and the model's own evolution (clock changes), which is computed
 * ahead. So the wait sleeps in ppoll on the inotify descriptor until the tick at which the next event can
 * arrive, or the deadline; a write wakes it, and it looks just after the following tick boundary, when the
 * line has taken effect. It reads the histories only when it looks. */
EXPORT nvmlReturn_t nvmlEventSetWait_v2(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    if (!set || set->magic != EVENT_SET_MAGIC || !data) return NVML_ERROR_INVALID_ARGUMENT;
    int64_t deadline = now_ns() + (int64_t)timeout_ms * 1000000LL;
    pthread_mutex_lock(&g_lock);
    if (set->inotify_fd == -1) open_watch(set);
    for (;;) {
        int64_t t = now_ns();
        int64_t tick = tick_of(t);
        if (set->inotify_fd >= 0 && drain_watch(set) && set->unread_tick < 0) set->unread_tick = tick + 1;
        if (tick >= set->check_tick || set->inotify_fd < 0) {
            refresh();
            int found = next_event_for(set, data);
            if (found) {
                set->check_tick = 0; /* more may be queued: the next wait looks at once */
                pthread_mutex_unlock(&g_lock);
                return found == 1 ? NVML_SUCCESS : found;
            }
            /* every history line written before this tick began is in memory now */
            if (set->unread_tick >= 0 && g_tick >= set->unread_tick) set->unread_tick = -1;
            set->check_tick = set->inotify_fd >= 0 ? next_change_tick(set) : g_tick + 1;
        }
        int64_t look = set->check_tick;
        if (set->unread_tick >= 0 && set->unread_tick < look) look = set->unread_tick;
        if (look < set->check_tick) set->check_tick = look;
        t = now_ns();
        if (t >= deadline) {
            pthread_mutex_unlock(&g_lock);
            return NVML_ERROR_TIMEOUT;
        }
        /* just after the boundary of the tick to look at (or the deadline) */
        int64_t until = g_start_ns + look * g_period_ns + 200000;
        if (until > deadline) until = deadline;
        int fd = set->inotify_fd;
        pthread_mutex_unlock(&g_lock);
        if (until > t) {
            struct timespec ts = {(time_t)((until - t) / 1000000000LL), (long)((until - t) % 1000000000LL)};
            if (fd >= 0) {
                struct pollfd pfd = {.fd = fd, .events = POLLIN};
                ppoll(&pfd, 1, &ts, NULL);
            } else {
                nanosleep(&ts, NULL);
            }
        }
        pthread_mutex_lock(&g_lock);
    }
}
EXPORT nvmlReturn_t nvmlEventSetWait(nvmlEventSet_t set, nvmlEventData_t *data, unsigned int timeout_ms) {
    return nvmlEventSetWait_v2(set, data, timeout_ms);
}

/* ---------------------------------------------------------------- GPM (Hopper and newer) */

typedef struct { unsigned int version, isSupportedDevice; } nvmlGpmSupport_t;
#define GPM_SAMPLE_MAGIC 0x67706d73u
typedef struct sim_gpm_sample {
    unsigned magic;
    sim_gpu *gpu; /* NULL until nvmlGpmSampleGet filled it */
    int instance; /* the MIG GPU instance (its index) it was taken of; -1: the whole GPU */
    int64_t t_us;  /* the start of the tick it was taken in */
    double acc[GPM_N], rate[GPM_N];
} *nvmlGpmSample_t;

typedef struct { const char *shortName, *longName, *unit; } nvmlGpmMetricInfo_t;
typedef struct {
    unsigned int metricId;
    nvmlReturn_t nvmlReturn;
    double value;
    nvmlGpmMetricInfo_t metricInfo;
} nvmlGpmMetric_t;
#define NVML_GPM_METRIC_MAX 477 /* pynvml's bound: the most metrics one call may ask for */
typedef struct {
    unsigned int version, numMetrics;
    nvmlGpmSample_t sample1, sample2;
    nvmlGpmMetric_t metrics[NVML_GPM_METRIC_MAX];
} nvmlGpmMetricsGet_t;

static int gpm_supported(const sim_gpu *g) { return g->architecture >= 9; }

EXPORT nvmlReturn_t nvmlGpmQueryDeviceSupport(nvmlDevice_t dev, nvmlGpmSupport_t *s) {
    BEGIN(dev) NEED(s)
    if (s->version != 1) FAIL(NVML_ERROR_ARGUMENT_VERSION_MISMATCH);
    s->isSupportedDevice = (unsigned)gpm_supported(g);
    if (!s->isSupportedDevice) FAIL(NVML_ERROR_NOT_SUPPORTED);
    DONE
}

EXPORT nvmlReturn_t nvmlGpmSampleAlloc(nvmlGpmSample_t *sample) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    if (!sample) return NVML_ERROR_INVALID_ARGUMENT;
    struct sim_gpm_sample *s = calloc(1, sizeof *s);
    if (!s) return NVML_ERROR_UNKNOWN;
    s->magic = GPM_SAMPLE_MAGIC;
    *sample = s;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlGpmSampleFree(nvmlGpmSample_t sample) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    if (!sample || sample->magic != GPM_SAMPLE_MAGIC) return NVML_ERROR_INVALID_ARGUMENT;
    sample->magic = 0;
    free(sample);
    return NVML_SUCCESS;
}

/* A sample holds the activity integrals up to the start of the present tick and the present tick's rates:
 * the whole GPU's (instance -1), or one MIG GPU instance's. The load's process runs in the first instance
 * (as the process lists say), so that instance is as active as the load and the others are idle; the parent
 * keeps answering as a whole GPU. */
static void gpm_fill(sim_gpu *g, int instance, struct sim_gpm_sample *sample) {
    sample->gpu = g;
    sample->instance = instance;
    sample->t_us = g->hist[g->k % HISTORY].t_us;
    if (instance <= 0) {
        memcpy(sample->acc, g->gpm_acc, sizeof sample->acc);
        memcpy(sample->rate, g->gpm_rate, sizeof sample->rate);
    } else {
        memset(sample->acc, 0, sizeof sample->acc);
        memset(sample->rate, 0, sizeof sample->rate);
    }
}
static nvmlReturn_t mig_gpm_sample(nvmlDevice_t dev, nvmlGpmSample_t sample) {
    BEGIN_MIG(dev)
    if (!sample || sample->magic != GPM_SAMPLE_MAGIC) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!gpm_supported(m->parent)) FAIL(NVML_ERROR_NOT_SUPPORTED);
    gpm_fill(m->parent, (int)m->index, sample);
    DONE
}
EXPORT nvmlReturn_t nvmlGpmSampleGet(nvmlDevice_t dev, nvmlGpmSample_t sample) {
    /* nvml.h: "This API supports the device handle and MIG device handle" */
    if (mig_of(dev)) return mig_gpm_sample(dev, sample);
    BEGIN(dev)
    if (!sample || sample->magic != GPM_SAMPLE_MAGIC) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!gpm_supported(g)) FAIL(NVML_ERROR_NOT_SUPPORTED);
    gpm_fill(g, -1, sample);
    DONE
}
/* One GPU instance of a MIG-enabled GPU by its GPU instance id, on the parent's handle (what DCGM samples).
 * nvml.h documents no particular error codes; the simulator's: NOT_SUPPORTED without GPM, INVALID_ARGUMENT
 * with MIG off (as nvmlDeviceGetMigDeviceHandleByIndex), NOT_FOUND for an id that is no instance of the GPU. */
EXPORT nvmlReturn_t nvmlGpmMigSampleGet(nvmlDevice_t dev, unsigned int gpuInstanceId, nvmlGpmSample_t sample) {
    BEGIN(dev)
    if (!sample || sample->magic != GPM_SAMPLE_MAGIC) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    if (!gpm_supported(g)) FAIL(NVML_ERROR_NOT_SUPPORTED);
    if (!g->mig_instances) FAIL(NVML_ERROR_INVALID_ARGUMENT);
    int found = -1;
    for (unsigned i = 0; i < g->mig_instances; i++)
        if (MIG_GI_IDS[i] == gpuInstanceId) found = (int)i;
    if (found < 0) FAIL(NVML_ERROR_NOT_FOUND);
    gpm_fill(g, found, sample);
    DONE
}

static const char *const GPM_LONG[GPM_N] = {
    "Percentage of SMs that were busy", "Percentage of warps that were active vs theoretical maximum",
    "Percentage of time the GPU's SMs were doing any tensor operations", "Percentage of DRAM bw used vs theoretical maximum",
    "Percentage of time the GPU's SMs were doing non-tensor FP16 math",
    "Percentage of time the GPU's SMs were doing non-tensor FP32 math",
    "Percentage of time the GPU's SMs were doing non-tensor FP64 math"};

/* Each metric is the mean over [sample1, sample2): the difference of the integrals over the time between the
 * samples; two samples of the same tick give that tick's value. */
EXPORT nvmlReturn_t nvmlGpmMetricsGet(nvmlGpmMetricsGet_t *mg) {
    if (!g_init_count) return NVML_ERROR_UNINITIALIZED;
    if (!mg) return NVML_ERROR_INVALID_ARGUMENT;
    if (mg->version != 1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    struct sim_gpm_sample *a = mg->sample1, *b = mg->sample2;
    if (!a || !b || a->magic != GPM_SAMPLE_MAGIC || b->magic != GPM_SAMPLE_MAGIC || !a->gpu || a->gpu != b->gpu ||
        a->instance != b->instance)
        return NVML_ERROR_INVALID_ARGUMENT; /* two samples of one GPU, or of one GPU instance */
    if (mg->numMetrics == 0 || mg->numMetrics > NVML_GPM_METRIC_MAX) return NVML_ERROR_INVALID_ARGUMENT;
    if (b->t_us < a->t_us) { struct sim_gpm_sample *t = a; a = b; b = t; }
    double dt = (double)(b->t_us - a->t_us) / 1e6;
    for (unsigned i = 0; i < mg->numMetrics; i++) {
        nvmlGpmMetric_t *m = &mg->metrics[i];
        int found = -1;
        for (int j = 0; j < GPM_N; j++)
            if (GPM_IDS[j] == m->metricId) found = j;
        m->value = 0.0;
        memset(&m->metricInfo, 0, sizeof m->metricInfo);
        if (found < 0) { m->nvmlReturn = NVML_ERROR_NOT_SUPPORTED; continue; }
        double v = dt > 0 ? (b->acc[found] - a->acc[found]) / dt : b->rate[found];
        m->value = v < 0 ? 0 : v > 100 ? 100 : v;
        m->nvmlReturn = NVML_SUCCESS;
        m->metricInfo.shortName = GPM_SHORT[found];
        m->metricInfo.longName = GPM_LONG[found];
        m->metricInfo.unit = "%";
    }
    return NVML_SUCCESS;
}
