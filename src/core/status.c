/*
 * status.c — status names, the thread-local error message, and the version.
 * Every failure in the library goes through fg_fail(), so fg_last_error() always
 * describes the most recent failed call on the calling thread.
 */
#include "internal.h"

#include <stdarg.h>
#include <stdio.h>

static _Thread_local char last_error[512];

fg_status fg_fail(fg_status status, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(last_error, sizeof last_error, fmt, ap);
    va_end(ap);
    return status;
}

void fg_clear_error(void) { last_error[0] = '\0'; }

const char *fg_last_error(void) { return last_error; }

const char *fg_status_string(fg_status status) {
    switch (status) {
    case FG_OK: return "FG_OK";
    case FG_ERR_NULL_POINTER: return "FG_ERR_NULL_POINTER";
    case FG_ERR_INVALID_VALUE: return "FG_ERR_INVALID_VALUE";
    case FG_ERR_SHAPE: return "FG_ERR_SHAPE";
    case FG_ERR_DTYPE: return "FG_ERR_DTYPE";
    case FG_ERR_WRONG_DEVICE: return "FG_ERR_WRONG_DEVICE";
    case FG_ERR_MISALIGNED: return "FG_ERR_MISALIGNED";
    case FG_ERR_WORKSPACE: return "FG_ERR_WORKSPACE";
    case FG_ERR_OVERFLOW: return "FG_ERR_OVERFLOW";
    case FG_ERR_ALIAS: return "FG_ERR_ALIAS";
    case FG_ERR_UNSUPPORTED: return "FG_ERR_UNSUPPORTED";
    case FG_ERR_NO_DEVICE: return "FG_ERR_NO_DEVICE";
    case FG_ERR_OUT_OF_MEMORY: return "FG_ERR_OUT_OF_MEMORY";
    case FG_ERR_BACKEND: return "FG_ERR_BACKEND";
    case FG_ERR_DEVICE_VALUE: return "FG_ERR_DEVICE_VALUE";
    case FG_ERR_INTERNAL: return "FG_ERR_INTERNAL";
    }
    return "FG_ERR_UNKNOWN";
}

uint32_t fg_version(void) { return FG_VERSION; }
