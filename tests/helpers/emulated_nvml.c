/*
 * An emulated libnvidia-ml.so.1 for tests on machines without an NVIDIA driver.
 *
 * NVIDIA's own Python binding, pynvml (PyPI nvidia-ml-py 13.615.71, module pynvml.py), loads
 * the driver's library with ctypes.CDLL("libnvidia-ml.so.1") and resolves each function by
 * name. Built as that file (tests/helpers/emulated_nvml.py) and found first through
 * LD_LIBRARY_PATH, this library lets the binding run unchanged: its ctypes calls, structures
 * and error codes are the real ones.
 *
 * Every symbol, argument type, structure and constant below was taken from nvidia-ml-py
 * 13.615.71's pynvml.py, the binding itself (line numbers are that file's):
 *
 *   pynvml function                           C symbol it resolves          arguments it passes
 *   nvmlInit (L3161)                          nvmlInitWithFlags             c_int flags (0)
 *   nvmlInitWithFlags (L3144)                 nvmlInitWithFlags             flags
 *   nvmlShutdown (L3199)                      nvmlShutdown                  -
 *   nvmlErrorString (L3217)                   nvmlErrorString               code; restype c_char_p
 *   nvmlSystemGetDriverVersion (L3256)        nvmlSystemGetDriverVersion    char[80], c_uint 80
 *   nvmlDeviceGetCount (L3372)                nvmlDeviceGetCount_v2         c_uint*
 *   nvmlDeviceGetHandleByIndex (L3379)        nvmlDeviceGetHandleByIndex_v2 c_uint, nvmlDevice_t*
 *   nvmlDeviceGetHandleByUUID (L3399)         nvmlDeviceGetHandleByUUID     c_char_p, nvmlDevice_t*
 *   nvmlDeviceGetName (L3431)                 nvmlDeviceGetName             h, char[96], c_uint 96
 *   nvmlDeviceGetUUID (L3588)                 nvmlDeviceGetUUID             h, char[96], c_uint 96
 *   nvmlDeviceGetMemoryInfo (L3993)           nvmlDeviceGetMemoryInfo       h, c_nvmlMemory_t* (L1386:
 *                                             c_ulonglong total, free, used; bytes)
 *   nvmlDeviceGetClockInfo (L3674)            nvmlDeviceGetClockInfo        h, c_uint type, c_uint*
 *   nvmlDeviceGetMaxClockInfo (L3682)         nvmlDeviceGetMaxClockInfo     h, c_uint type, c_uint*
 *   nvmlDeviceGetTemperature (L3876)          nvmlDeviceGetTemperature      h, c_uint sensor, c_uint*
 *   nvmlDeviceGetTemperatureV (L3869, L3860)  nvmlDeviceGetTemperatureV     h, c_nvmlTemperature_v1_t*
 *   nvmlDeviceGetEnforcedPowerLimit (L3955)   nvmlDeviceGetEnforcedPowerLimit h, c_uint* (mW)
 *   nvmlDeviceGetPowerUsage (L3962)           nvmlDeviceGetPowerUsage       h, c_uint* (mW)
 *   nvmlDeviceGetTotalEnergyConsumption (L3969) nvmlDeviceGetTotalEnergyConsumption h, c_uint64* (mJ)
 *   nvmlDeviceGetCurrentClocksEventReasons (L4672)   same name              h, c_ulonglong*
 *   nvmlDeviceGetCurrentClocksThrottleReasons (L4665) same name (deprecated) h, c_ulonglong*
 *   nvmlDeviceGetSamples (L4815)              nvmlDeviceGetSamples          h, c_uint type,
 *                                             c_ulonglong lastSeen, c_uint* valueType,
 *                                             c_uint* count, c_nvmlSample_t* (NULL: the count)
 *   nvmlDeviceGetViolationStatus (L4836)      nvmlDeviceGetViolationStatus  h, c_uint policy,
 *                                             c_nvmlViolationTime_t*
 *
 * The handle (c_nvmlDevice_t, L1273-1275) is an opaque pointer; here it points at one of the
 * static device records. Every function returns nvmlReturn_t (_nvmlReturn_t = c_uint, L222).
 * The real library also exports nvmlInit, nvmlInit_v2, nvmlDeviceGetCount and
 * nvmlDeviceGetHandleByIndex (the older names); they are exported here too, as aliases.
 *
 * Constants (pynvml.py): NVML_SUCCESS 0, NVML_ERROR_UNINITIALIZED 1, _INVALID_ARGUMENT 2,
 * _NOT_SUPPORTED 3, _NOT_FOUND 6, _INSUFFICIENT_SIZE 7, _DRIVER_NOT_LOADED 9,
 * _ARGUMENT_VERSION_MISMATCH 25, _UNKNOWN 999 (L222-254); NVML_CLOCK_GRAPHICS 0, _SM 1, _MEM 2,
 * _VIDEO 3, _COUNT 4 (L175-180); NVML_TEMPERATURE_GPU 0, _GPU_MAX 1, _COUNT 2 (L81-84);
 * nvmlTemperature_v1 = 0x100000C, the size of {c_uint version; c_uint sensorType;
 * c_int temperature} with version 1 in the top byte (L3852-3858); nvmlClocksEventReasonNone 0,
 * nvmlClocksEventReasonSwPowerCap 0x4 (L2190-2200; the Throttle names have the same bits,
 * L2215-2227); NVML_SYSTEM_DRIVER_VERSION_BUFFER_SIZE 80, NVML_DEVICE_NAME_V2_BUFFER_SIZE 96,
 * NVML_DEVICE_UUID_V2_BUFFER_SIZE 96 (L472-478); NVML_TOTAL_POWER_SAMPLES 0,
 * NVML_PROCESSOR_CLK_SAMPLES 5, NVML_MEMORY_CLK_SAMPLES 6, 10 sampling types (L342-352);
 * NVML_VALUE_TYPE_UNSIGNED_INT 1 (L290); NVML_PERF_POLICY_POWER 0, _THERMAL 1, _COUNT 12
 * (L310-318); c_nvmlSample_t {c_ulonglong timeStamp; c_nvmlValue_t sampleValue}, the value a
 * union of 8-byte members (L1514-1529); c_nvmlViolationTime_t {c_ulonglong referenceTime;
 * c_ulonglong violationTime} (L1531-1535). NVIDIA's NVML reference gives the units: a
 * sample's timeStamp and referenceTime are CPU timestamps in microseconds, violationTime is
 * in nanoseconds; a query with nothing newer than lastSeenTimeStamp is NVML_ERROR_NOT_FOUND.
 *
 * The emulated machine (deterministic; t = CLOCK_MONOTONIC time since the first successful
 * nvmlInit of the process, which a later nvmlShutdown/nvmlInit does not reset, so the energy
 * counter never goes back, as a counter since driver load would not):
 *
 *   two devices, driver version "580.95.05";
 *   device 0 "NVIDIA H100 80GB HBM3", UUID GPU-00000000-1111-2222-3333-444444444444;
 *   device 1 "NVIDIA H200",           UUID GPU-00000000-1111-2222-3333-555555555555;
 *   both: max SM (and graphics) clock 1980 MHz, memory clock 2619 MHz (current = max),
 *     video clock 1710 MHz (current = max; a placeholder, not a measured figure);
 *     SM (and graphics) clock 1980 MHz for t < 40 ms, then 1755 MHz and 1830 MHz in turn,
 *     20 ms each (1755 over [40, 60) ms, 1830 over [60, 80) ms, ...);
 *     power 450000 mW for t < 40 ms, 690000 mW after;
 *     temperature 52 C + 1 C per whole 100 ms, at most 70 C;
 *     clock event reasons 0 for t < 40 ms, nvmlClocksEventReasonSwPowerCap (0x4) after;
 *   both: enforced power limit 700000 mW (an H100 SXM5's 700 W);
 *   device 0: energy = 123456789 mJ + the exact integral of that power over [0, t'], in whole
 *     mJ, where t' is t rounded down to the counter's period (100 ms: the counter advances in
 *     steps, as the real driver's does about every 100 ms; period 0: t' = t, every read);
 *   device 0: the driver's sample buffer: a sample every 10 ms of t (k = 0, 1, ... at t = k x
 *     10 ms, the newest 100 kept) of the SM clock, the memory clock and the power (mW) at
 *     that t, stamped CLOCK_REALTIME microseconds (the realtime clock at the first nvmlInit +
 *     t); other sampling types NVML_ERROR_NOT_SUPPORTED;
 *   both: violation time (ns) of NVML_PERF_POLICY_POWER = the time spent under SwPowerCap
 *     (t - 40 ms, from 40 ms on), of NVML_PERF_POLICY_THERMAL 0; other policies
 *     NVML_ERROR_NOT_SUPPORTED;
 *   device 1: nvmlDeviceGetTotalEnergyConsumption and nvmlDeviceGetSamples return
 *     NVML_ERROR_NOT_SUPPORTED;
 *   memory: device 0 81559 MiB in all (what nvidia-smi shows for an H100 80GB HBM3), 1 GiB of
 *     it used; device 1 143771 MiB (an H200's), 3 GiB used (placeholders, not measurements).
 *
 * Settings, read from the environment when nvmlInit takes the library from uninitialized to
 * initialized (a malformed value makes that nvmlInit return NVML_ERROR_INVALID_ARGUMENT, so a
 * typo in a test fails loudly instead of testing the defaults):
 *
 *   LCAB_EMULATED_NVML_SM_MHZ=<positive int>  every device's current SM and graphics clock is
 *                                             that fixed value (max clocks stay 1980 MHz)
 *   LCAB_EMULATED_NVML_NAME0=<text>           device 0's name (at most 95 bytes)
 *   LCAB_EMULATED_NVML_INIT=driver_not_loaded nvmlInit returns NVML_ERROR_DRIVER_NOT_LOADED
 *   LCAB_EMULATED_NVML_HANG_AFTER=<n >= 0>    after n successful nvmlDeviceGetPowerUsage calls
 *                                             (both devices together, counted from that
 *                                             nvmlInit), every further call blocks forever
 *   LCAB_EMULATED_NVML_ENERGY_PERIOD_MS=<n>   the energy counter's period (default 100; 0: it
 *                                             moves on every read)
 *   LCAB_EMULATED_NVML_SAMPLE_PERIOD_MS=<n>   the sample buffer's period (default 10, n >= 1)
 *   LCAB_EMULATED_NVML_POWER_LIMIT_W=<n>      the enforced power limit (default 700)
 *
 * Before nvmlInit (or after the last nvmlShutdown) queries return NVML_ERROR_UNINITIALIZED;
 * an unknown handle, a NULL output or an out-of-range enum returns NVML_ERROR_INVALID_ARGUMENT;
 * a buffer too small for a string returns NVML_ERROR_INSUFFICIENT_SIZE.
 *
 * Threads: nvmlInit/nvmlShutdown serialize on a spin lock; queries read the settings published
 * by the initializing call (release/acquire on the reference count) and count power calls with
 * an atomic, so a background sampler thread and the main thread may call at once.
 */

#define _POSIX_C_SOURCE 200809L

#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#define EXPORT __attribute__((visibility("default")))

typedef unsigned int nvmlReturn_t;

enum {
    NVML_SUCCESS = 0,
    NVML_ERROR_UNINITIALIZED = 1,
    NVML_ERROR_INVALID_ARGUMENT = 2,
    NVML_ERROR_NOT_SUPPORTED = 3,
    NVML_ERROR_NO_PERMISSION = 4,
    NVML_ERROR_ALREADY_INITIALIZED = 5,
    NVML_ERROR_NOT_FOUND = 6,
    NVML_ERROR_INSUFFICIENT_SIZE = 7,
    NVML_ERROR_DRIVER_NOT_LOADED = 9,
    NVML_ERROR_TIMEOUT = 10,
    NVML_ERROR_LIBRARY_NOT_FOUND = 12,
    NVML_ERROR_FUNCTION_NOT_FOUND = 13,
    NVML_ERROR_GPU_IS_LOST = 15,
    NVML_ERROR_ARGUMENT_VERSION_MISMATCH = 25,
    NVML_ERROR_UNKNOWN = 999,
};

enum { NVML_CLOCK_GRAPHICS = 0, NVML_CLOCK_SM = 1, NVML_CLOCK_MEM = 2, NVML_CLOCK_VIDEO = 3 };
enum { NVML_CLOCK_COUNT = 4 };
enum { NVML_TEMPERATURE_GPU = 0, NVML_TEMPERATURE_COUNT = 2 };

#define NVML_CLOCKS_EVENT_REASON_NONE 0x0ULL
#define NVML_CLOCKS_EVENT_REASON_SW_POWER_CAP 0x4ULL

typedef struct {
    unsigned int version;
    unsigned int sensorType;
    int temperature;
} nvmlTemperature_v1_t;

#define NVML_STRUCT_VERSION(size, ver) ((unsigned int)(size) | ((unsigned int)(ver) << 24U))
#define NVML_TEMPERATURE_V1 NVML_STRUCT_VERSION(sizeof(nvmlTemperature_v1_t), 1)

#define NAME_BYTES 96 /* NVML_DEVICE_NAME_V2_BUFFER_SIZE */

struct emulated_device {
    const char *uuid;
    char name[NAME_BYTES];
    int energy_supported;
    int samples_supported;
};

enum { NVML_TOTAL_POWER_SAMPLES = 0, NVML_PROCESSOR_CLK_SAMPLES = 5, NVML_MEMORY_CLK_SAMPLES = 6 };
enum { NVML_SAMPLINGTYPE_COUNT = 10, NVML_VALUE_TYPE_UNSIGNED_INT = 1 };
enum { NVML_PERF_POLICY_POWER = 0, NVML_PERF_POLICY_THERMAL = 1, NVML_PERF_POLICY_COUNT = 12 };

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
    unsigned long long timeStamp;
    nvmlValue_t sampleValue;
} nvmlSample_t;

typedef struct {
    unsigned long long referenceTime;
    unsigned long long violationTime;
} nvmlViolationTime_t;

typedef struct emulated_device *nvmlDevice_t;

#define DEVICE_COUNT 2U
static const char *const DEFAULT_NAMES[DEVICE_COUNT] = {"NVIDIA H100 80GB HBM3", "NVIDIA H200"};
static struct emulated_device devices[DEVICE_COUNT] = {
    {"GPU-00000000-1111-2222-3333-444444444444", "", 1, 1},
    {"GPU-00000000-1111-2222-3333-555555555555", "", 0, 0},
};

static const char DRIVER_VERSION[] = "580.95.05";

#define MS 1000000ULL /* nanoseconds */
#define BOOST_NS (40ULL * MS)
#define PHASE_NS (20ULL * MS)
#define MAX_SM_MHZ 1980U
#define BOOST_SM_MHZ 1980U
#define LOW_SM_MHZ 1755U
#define HIGH_SM_MHZ 1830U
#define MEM_MHZ 2619U
#define VIDEO_MHZ 1710U
#define BOOST_POWER_W 450ULL
#define CAPPED_POWER_W 690ULL
#define ENERGY_BASE_MJ 123456789ULL
#define TEMP_BASE_C 52U
#define TEMP_MAX_C 70U
#define TEMP_STEP_NS (100ULL * MS)
#define SAMPLES_KEPT 100ULL

static atomic_flag init_lock = ATOMIC_FLAG_INIT;
static atomic_uint refcount;          /* nvmlInit calls not yet shut down */
static atomic_uint_fast64_t calls;    /* nvmlDeviceGetPowerUsage calls since nvmlInit */
static uint64_t start_ns;             /* set once, by the first successful nvmlInit */
static uint64_t start_realtime_us;    /* CLOCK_REALTIME at that moment, for sample stamps */
static int started;
static unsigned int fixed_sm_mhz;     /* 0: the moving pattern */
static long long hang_after = -1;     /* -1: never hang */
static uint64_t energy_period_ns;     /* the energy counter's step (0: none) */
static uint64_t sample_period_ns;     /* the driver buffer's sampling period */
static unsigned int power_limit_w;    /* the enforced power limit */

static uint64_t monotonic_ns(void) {
    struct timespec now;
    clock_gettime(CLOCK_MONOTONIC, &now);
    return (uint64_t)now.tv_sec * 1000000000ULL + (uint64_t)now.tv_nsec;
}

static uint64_t realtime_us(void) {
    struct timespec now;
    clock_gettime(CLOCK_REALTIME, &now);
    return (uint64_t)now.tv_sec * 1000000ULL + (uint64_t)now.tv_nsec / 1000ULL;
}

static uint64_t elapsed_ns(void) {
    uint64_t now = monotonic_ns();
    return now > start_ns ? now - start_ns : 0;
}

static int initialized(void) {
    return atomic_load_explicit(&refcount, memory_order_acquire) > 0;
}

static nvmlReturn_t check_device(nvmlDevice_t device) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    for (unsigned int i = 0; i < DEVICE_COUNT; i++)
        if (device == &devices[i]) return NVML_SUCCESS;
    return NVML_ERROR_INVALID_ARGUMENT;
}

static nvmlReturn_t copy_string(const char *text, char *out, unsigned int length) {
    if (out == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (strlen(text) + 1 > length) return NVML_ERROR_INSUFFICIENT_SIZE;
    memcpy(out, text, strlen(text) + 1);
    return NVML_SUCCESS;
}

/* A whole non-negative decimal number, or -1. */
static long long parse_count(const char *text) {
    char *end = NULL;
    long long value;
    if (text[0] < '0' || text[0] > '9') return -1;
    value = strtoll(text, &end, 10);
    if (*end != '\0' || value < 0) return -1;
    return value;
}

/* Reads the settings; NVML_SUCCESS or the error nvmlInit returns. Called under init_lock. */
static nvmlReturn_t read_settings(void) {
    const char *init = getenv("LCAB_EMULATED_NVML_INIT");
    const char *sm = getenv("LCAB_EMULATED_NVML_SM_MHZ");
    const char *name0 = getenv("LCAB_EMULATED_NVML_NAME0");
    const char *hang = getenv("LCAB_EMULATED_NVML_HANG_AFTER");
    const char *texts[3] = {getenv("LCAB_EMULATED_NVML_ENERGY_PERIOD_MS"),
                            getenv("LCAB_EMULATED_NVML_SAMPLE_PERIOD_MS"),
                            getenv("LCAB_EMULATED_NVML_POWER_LIMIT_W")};
    long long numbers[3] = {100, 10, 700}; /* the defaults */
    long long value;

    if (init != NULL && init[0] != '\0') {
        if (strcmp(init, "driver_not_loaded") == 0) return NVML_ERROR_DRIVER_NOT_LOADED;
        return NVML_ERROR_INVALID_ARGUMENT;
    }
    fixed_sm_mhz = 0;
    if (sm != NULL && sm[0] != '\0') {
        value = parse_count(sm);
        if (value <= 0 || value > 100000) return NVML_ERROR_INVALID_ARGUMENT;
        fixed_sm_mhz = (unsigned int)value;
    }
    hang_after = -1;
    if (hang != NULL && hang[0] != '\0') {
        hang_after = parse_count(hang);
        if (hang_after < 0) return NVML_ERROR_INVALID_ARGUMENT;
    }
    for (unsigned int i = 0; i < 3; i++) {
        if (texts[i] == NULL || texts[i][0] == '\0') continue;
        numbers[i] = parse_count(texts[i]);
        if (numbers[i] < (i == 0 ? 0 : 1) || numbers[i] > 100000) return NVML_ERROR_INVALID_ARGUMENT;
    }
    energy_period_ns = (uint64_t)numbers[0] * MS;
    sample_period_ns = (uint64_t)numbers[1] * MS;
    power_limit_w = (unsigned int)numbers[2];
    if (name0 != NULL && strlen(name0) + 1 > NAME_BYTES) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < DEVICE_COUNT; i++) {
        const char *name = (i == 0 && name0 != NULL && name0[0] != '\0') ? name0 : DEFAULT_NAMES[i];
        memcpy(devices[i].name, name, strlen(name) + 1);
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlInitWithFlags(unsigned int flags) {
    nvmlReturn_t result = NVML_SUCCESS;
    (void)flags; /* NO_GPUS / NO_ATTACH / FORCE_INIT change nothing here */
    while (atomic_flag_test_and_set_explicit(&init_lock, memory_order_acquire)) {
    }
    if (atomic_load_explicit(&refcount, memory_order_relaxed) == 0) {
        result = read_settings();
        if (result == NVML_SUCCESS) {
            if (!started) {
                start_ns = monotonic_ns();
                start_realtime_us = realtime_us();
                started = 1;
            }
            atomic_store_explicit(&calls, 0, memory_order_relaxed);
        }
    }
    if (result == NVML_SUCCESS) atomic_fetch_add_explicit(&refcount, 1, memory_order_release);
    atomic_flag_clear_explicit(&init_lock, memory_order_release);
    return result;
}

EXPORT nvmlReturn_t nvmlInit_v2(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlInit(void) { return nvmlInitWithFlags(0); }

EXPORT nvmlReturn_t nvmlShutdown(void) {
    nvmlReturn_t result = NVML_SUCCESS;
    while (atomic_flag_test_and_set_explicit(&init_lock, memory_order_acquire)) {
    }
    if (atomic_load_explicit(&refcount, memory_order_relaxed) == 0)
        result = NVML_ERROR_UNINITIALIZED;
    else
        atomic_fetch_sub_explicit(&refcount, 1, memory_order_release);
    atomic_flag_clear_explicit(&init_lock, memory_order_release);
    return result;
}

EXPORT const char *nvmlErrorString(nvmlReturn_t result) {
    switch (result) {
    case NVML_SUCCESS: return "Success";
    case NVML_ERROR_UNINITIALIZED: return "Uninitialized";
    case NVML_ERROR_INVALID_ARGUMENT: return "Invalid Argument";
    case NVML_ERROR_NOT_SUPPORTED: return "Not Supported";
    case NVML_ERROR_NO_PERMISSION: return "Insufficient Permissions";
    case NVML_ERROR_ALREADY_INITIALIZED: return "Already Initialized";
    case NVML_ERROR_NOT_FOUND: return "Not Found";
    case NVML_ERROR_INSUFFICIENT_SIZE: return "Insufficient Size";
    case NVML_ERROR_DRIVER_NOT_LOADED: return "Driver Not Loaded";
    case NVML_ERROR_TIMEOUT: return "Timeout";
    case NVML_ERROR_LIBRARY_NOT_FOUND: return "NVML Shared Library Not Found";
    case NVML_ERROR_FUNCTION_NOT_FOUND: return "Function Not Found";
    case NVML_ERROR_GPU_IS_LOST: return "GPU is lost";
    case NVML_ERROR_ARGUMENT_VERSION_MISMATCH: return "Argument version mismatch";
    default: return "Unknown Error";
    }
}

EXPORT nvmlReturn_t nvmlSystemGetDriverVersion(char *version, unsigned int length) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    return copy_string(DRIVER_VERSION, version, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetCount_v2(unsigned int *count) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (count == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *count = DEVICE_COUNT;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCount(unsigned int *count) { return nvmlDeviceGetCount_v2(count); }

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex_v2(unsigned int index, nvmlDevice_t *device) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (device == NULL || index >= DEVICE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    *device = &devices[index];
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByIndex(unsigned int index, nvmlDevice_t *device) {
    return nvmlDeviceGetHandleByIndex_v2(index, device);
}

EXPORT nvmlReturn_t nvmlDeviceGetHandleByUUID(const char *uuid, nvmlDevice_t *device) {
    if (!initialized()) return NVML_ERROR_UNINITIALIZED;
    if (uuid == NULL || device == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    for (unsigned int i = 0; i < DEVICE_COUNT; i++) {
        if (strcmp(uuid, devices[i].uuid) == 0) {
            *device = &devices[i];
            return NVML_SUCCESS;
        }
    }
    return NVML_ERROR_NOT_FOUND;
}

EXPORT nvmlReturn_t nvmlDeviceGetName(nvmlDevice_t device, char *name, unsigned int length) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    return copy_string(device->name, name, length);
}

EXPORT nvmlReturn_t nvmlDeviceGetUUID(nvmlDevice_t device, char *uuid, unsigned int length) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    return copy_string(device->uuid, uuid, length);
}

typedef struct {
    unsigned long long total, free, used;
} nvmlMemory_t;

static const unsigned long long MEMORY_TOTAL_MIB[DEVICE_COUNT] = {81559ULL, 143771ULL};
static const unsigned long long MEMORY_USED_GIB[DEVICE_COUNT] = {1ULL, 3ULL};

EXPORT nvmlReturn_t nvmlDeviceGetMemoryInfo(nvmlDevice_t device, nvmlMemory_t *memory) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (memory == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    size_t i = (size_t)(device - devices);
    memory->total = MEMORY_TOTAL_MIB[i] << 20;
    memory->used = MEMORY_USED_GIB[i] << 30;
    memory->free = memory->total - memory->used;
    return NVML_SUCCESS;
}

static unsigned int sm_mhz(uint64_t t) {
    if (fixed_sm_mhz != 0) return fixed_sm_mhz;
    if (t < BOOST_NS) return BOOST_SM_MHZ;
    return ((t - BOOST_NS) / PHASE_NS) % 2 == 0 ? LOW_SM_MHZ : HIGH_SM_MHZ;
}

EXPORT nvmlReturn_t nvmlDeviceGetClockInfo(nvmlDevice_t device, unsigned int type,
                                           unsigned int *clock) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (clock == NULL || type >= NVML_CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: *clock = sm_mhz(elapsed_ns()); break;
    case NVML_CLOCK_MEM: *clock = MEM_MHZ; break;
    default: *clock = VIDEO_MHZ; break;
    }
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetMaxClockInfo(nvmlDevice_t device, unsigned int type,
                                              unsigned int *clock) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (clock == NULL || type >= NVML_CLOCK_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    switch (type) {
    case NVML_CLOCK_GRAPHICS:
    case NVML_CLOCK_SM: *clock = MAX_SM_MHZ; break;
    case NVML_CLOCK_MEM: *clock = MEM_MHZ; break;
    default: *clock = VIDEO_MHZ; break;
    }
    return NVML_SUCCESS;
}

static unsigned int temperature_c(uint64_t t) {
    uint64_t rise = t / TEMP_STEP_NS;
    return rise >= TEMP_MAX_C - TEMP_BASE_C ? TEMP_MAX_C : TEMP_BASE_C + (unsigned int)rise;
}

static nvmlReturn_t check_sensor(unsigned int sensor) {
    if (sensor >= NVML_TEMPERATURE_COUNT) return NVML_ERROR_INVALID_ARGUMENT;
    if (sensor != NVML_TEMPERATURE_GPU) return NVML_ERROR_NOT_SUPPORTED;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperature(nvmlDevice_t device, unsigned int sensor,
                                             unsigned int *temp) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (temp == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    result = check_sensor(sensor);
    if (result != NVML_SUCCESS) return result;
    *temp = temperature_c(elapsed_ns());
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTemperatureV(nvmlDevice_t device, nvmlTemperature_v1_t *temp) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (temp == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (temp->version != NVML_TEMPERATURE_V1) return NVML_ERROR_ARGUMENT_VERSION_MISMATCH;
    result = check_sensor(temp->sensorType);
    if (result != NVML_SUCCESS) return result;
    temp->temperature = (int)temperature_c(elapsed_ns());
    return NVML_SUCCESS;
}

static void hang_forever(void) {
    struct timespec second = {1, 0};
    for (;;) nanosleep(&second, NULL);
}

EXPORT nvmlReturn_t nvmlDeviceGetPowerUsage(nvmlDevice_t device, unsigned int *power) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (power == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    if (hang_after >= 0 &&
        atomic_fetch_add_explicit(&calls, 1, memory_order_relaxed) >= (uint64_t)hang_after)
        hang_forever();
    *power = (unsigned int)((elapsed_ns() < BOOST_NS ? BOOST_POWER_W : CAPPED_POWER_W) * 1000ULL);
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetEnforcedPowerLimit(nvmlDevice_t device, unsigned int *limit) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (limit == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *limit = power_limit_w * 1000U;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetTotalEnergyConsumption(nvmlDevice_t device,
                                                        unsigned long long *energy) {
    nvmlReturn_t result = check_device(device);
    uint64_t t, boost, capped;
    if (result != NVML_SUCCESS) return result;
    if (!device->energy_supported) return NVML_ERROR_NOT_SUPPORTED;
    if (energy == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    t = elapsed_ns();
    if (energy_period_ns) t -= t % energy_period_ns; /* the counter's last step */
    boost = t < BOOST_NS ? t : BOOST_NS;
    capped = t - boost;
    /* W x ns = nJ; / 1e6 = mJ */
    *energy = ENERGY_BASE_MJ + (BOOST_POWER_W * boost + CAPPED_POWER_W * capped) / MS;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksEventReasons(nvmlDevice_t device,
                                                           unsigned long long *reasons) {
    nvmlReturn_t result = check_device(device);
    if (result != NVML_SUCCESS) return result;
    if (reasons == NULL) return NVML_ERROR_INVALID_ARGUMENT;
    *reasons = elapsed_ns() < BOOST_NS ? NVML_CLOCKS_EVENT_REASON_NONE
                                       : NVML_CLOCKS_EVENT_REASON_SW_POWER_CAP;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetCurrentClocksThrottleReasons(nvmlDevice_t device,
                                                              unsigned long long *reasons) {
    return nvmlDeviceGetCurrentClocksEventReasons(device, reasons);
}

static unsigned int power_mw(uint64_t t) {
    return (unsigned int)((t < BOOST_NS ? BOOST_POWER_W : CAPPED_POWER_W) * 1000ULL);
}

/* The value of sample k of a buffered type (k x sample_period_ns after nvmlInit). */
static unsigned int buffered_value(unsigned int type, uint64_t k) {
    uint64_t t = k * sample_period_ns;
    if (type == NVML_PROCESSOR_CLK_SAMPLES) return sm_mhz(t);
    if (type == NVML_MEMORY_CLK_SAMPLES) return MEM_MHZ;
    return power_mw(t);
}

EXPORT nvmlReturn_t nvmlDeviceGetSamples(nvmlDevice_t device, unsigned int type,
                                         unsigned long long lastSeenTimeStamp,
                                         unsigned int *sampleValType, unsigned int *sampleCount,
                                         nvmlSample_t *samples) {
    nvmlReturn_t result = check_device(device);
    uint64_t newest, oldest, first, available, n;
    if (result != NVML_SUCCESS) return result;
    if (sampleValType == NULL || sampleCount == NULL || type >= NVML_SAMPLINGTYPE_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (!device->samples_supported) return NVML_ERROR_NOT_SUPPORTED;
    if (type != NVML_TOTAL_POWER_SAMPLES && type != NVML_PROCESSOR_CLK_SAMPLES &&
        type != NVML_MEMORY_CLK_SAMPLES)
        return NVML_ERROR_NOT_SUPPORTED;
    newest = elapsed_ns() / sample_period_ns;
    oldest = newest + 1 > SAMPLES_KEPT ? newest + 1 - SAMPLES_KEPT : 0;
    first = oldest; /* the first kept sample stamped after lastSeenTimeStamp */
    if (lastSeenTimeStamp >= start_realtime_us) {
        uint64_t after = (lastSeenTimeStamp - start_realtime_us) * 1000ULL / sample_period_ns + 1;
        if (after > first) first = after;
    }
    if (first > newest) return NVML_ERROR_NOT_FOUND;
    available = newest - first + 1;
    *sampleValType = NVML_VALUE_TYPE_UNSIGNED_INT;
    if (samples == NULL) {
        *sampleCount = (unsigned int)available;
        return NVML_SUCCESS;
    }
    n = *sampleCount < available ? *sampleCount : available;
    for (uint64_t i = 0; i < n; i++) {
        uint64_t k = first + i;
        samples[i].timeStamp = start_realtime_us + k * sample_period_ns / 1000ULL;
        samples[i].sampleValue.ullVal = 0;
        samples[i].sampleValue.uiVal = buffered_value(type, k);
    }
    *sampleCount = (unsigned int)n;
    return NVML_SUCCESS;
}

EXPORT nvmlReturn_t nvmlDeviceGetViolationStatus(nvmlDevice_t device, unsigned int perfPolicyType,
                                                 nvmlViolationTime_t *violTime) {
    nvmlReturn_t result = check_device(device);
    uint64_t t;
    if (result != NVML_SUCCESS) return result;
    if (violTime == NULL || perfPolicyType >= NVML_PERF_POLICY_COUNT)
        return NVML_ERROR_INVALID_ARGUMENT;
    if (perfPolicyType != NVML_PERF_POLICY_POWER && perfPolicyType != NVML_PERF_POLICY_THERMAL)
        return NVML_ERROR_NOT_SUPPORTED;
    t = elapsed_ns();
    violTime->referenceTime = realtime_us();
    violTime->violationTime =
        perfPolicyType == NVML_PERF_POLICY_POWER && t > BOOST_NS ? t - BOOST_NS : 0;
    return NVML_SUCCESS;
}
