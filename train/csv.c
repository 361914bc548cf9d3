/*
 * csv.c — reads a date-plus-series CSV (ETTh1's shape: "date,HUFL,...,OT") into memory.
 * The whole file is read at once and split into lines and fields in place; each numeric
 * cell goes through strtod and must be a finite number with nothing after it. The first
 * problem found stops the load with a message of the form "file:line:column (name): what".
 */
#include "csv.h"

#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

static int fail(char *err, size_t len, const char *fmt, ...) {
    va_list ap;
    va_start(ap, fmt);
    vsnprintf(err, len, fmt, ap);
    va_end(ap);
    return -1;
}

/* Trims blanks and one pair of surrounding double quotes, in place. */
static char *trim(char *s) {
    while (*s == ' ' || *s == '\t') s++;
    size_t n = strlen(s);
    while (n > 0 && (s[n - 1] == ' ' || s[n - 1] == '\t' || s[n - 1] == '\r')) s[--n] = 0;
    if (n >= 2 && s[0] == '"' && s[n - 1] == '"') {
        s[n - 1] = 0;
        s++;
    }
    return s;
}

/* Splits line into at most max fields at commas (in place); returns the field count. */
static int split(char *line, char **fields, int max) {
    int n = 0;
    char *p = line;
    for (;;) {
        char *comma = strchr(p, ',');
        if (comma) *comma = 0;
        if (n < max) fields[n] = trim(p);
        n++;
        if (!comma) break;
        p = comma + 1;
    }
    return n;
}

static char *read_all(const char *path, size_t *len, char *err, size_t errlen) {
    FILE *f = fopen(path, "rb");
    if (!f) {
        fail(err, errlen, "%s: cannot open: %s", path, strerror(errno));
        return NULL;
    }
    size_t cap = 1 << 20, n = 0;
    char *buf = malloc(cap + 1);
    while (buf) {
        size_t got = fread(buf + n, 1, cap - n, f);
        n += got;
        if (n < cap) break;
        char *grown = realloc(buf, cap * 2 + 1);
        if (!grown) {
            free(buf);
            buf = NULL;
            break;
        }
        buf = grown;
        cap *= 2;
    }
    int read_error = ferror(f);
    fclose(f);
    if (!buf) {
        fail(err, errlen, "%s: out of memory reading the file", path);
        return NULL;
    }
    if (read_error) {
        free(buf);
        fail(err, errlen, "%s: read error", path);
        return NULL;
    }
    buf[n] = 0;
    *len = n;
    return buf;
}

void csv_free(csv_table *t) {
    if (!t) return;
    for (int c = 0; t->names && c < t->cols; c++) free(t->names[c]);
    for (int64_t r = 0; t->dates && r < t->rows; r++) free(t->dates[r]);
    free(t->names);
    free(t->dates);
    free(t->values);
    memset(t, 0, sizeof *t);
}

int csv_load(const char *path, csv_table *out, char *err, size_t errlen) {
    memset(out, 0, sizeof *out);
    size_t len = 0;
    char *text = read_all(path, &len, err, errlen);
    if (!text) return -1;
    if (len >= 3 && (unsigned char)text[0] == 0xEF && (unsigned char)text[1] == 0xBB && (unsigned char)text[2] == 0xBF)
        memset(text, ' ', 3); /* a UTF-8 byte-order mark */
    if (memchr(text, 0, len)) {
        free(text);
        return fail(err, errlen, "%s: contains a NUL byte; not a text CSV", path);
    }
    /* lines: count them, then walk */
    int64_t nlines = 0;
    for (size_t i = 0; i < len; i++) nlines += text[i] == '\n';
    nlines += 1;
    char **lines = malloc(sizeof(char *) * (size_t)nlines);
    if (!lines) {
        free(text);
        return fail(err, errlen, "%s: out of memory", path);
    }
    int64_t nl = 0;
    for (char *p = text;;) {
        lines[nl++] = p;
        char *nlp = strchr(p, '\n');
        if (!nlp) break;
        *nlp = 0;
        p = nlp + 1;
    }
    while (nl > 0 && trim(lines[nl - 1])[0] == 0) nl--; /* trailing blank lines */
    int rc = -1;
    char **fields = NULL;
    if (nl == 0) {
        fail(err, errlen, "%s: the file is empty (want a header \"date,<series>...\" and rows)", path);
        goto done;
    }
    /* header */
    int max_fields = 1;
    for (char *p = lines[0]; *p; p++) max_fields += *p == ',';
    fields = malloc(sizeof(char *) * (size_t)(max_fields + 1));
    if (!fields) {
        fail(err, errlen, "%s: out of memory", path);
        goto done;
    }
    const int nh = split(lines[0], fields, max_fields + 1);
    if (strcasecmp(fields[0], "date") != 0) {
        fail(err, errlen, "%s:1:1: the header's first column is '%.40s'; expected 'date' (the header must be \"date,<series>...\")",
             path, fields[0]);
        goto done;
    }
    if (nh < 2) {
        fail(err, errlen, "%s:1: the header names no series after 'date'", path);
        goto done;
    }
    out->cols = nh - 1;
    out->names = calloc((size_t)out->cols, sizeof(char *));
    if (!out->names) {
        fail(err, errlen, "%s: out of memory", path);
        goto done;
    }
    for (int c = 0; c < out->cols; c++) {
        const char *name = fields[c + 1];
        if (!name[0]) {
            fail(err, errlen, "%s:1:%d: the header's column %d has no name", path, c + 2, c + 2);
            goto done;
        }
        for (int o = 0; o < c; o++)
            if (strcmp(out->names[o], name) == 0) {
                fail(err, errlen, "%s:1:%d: the header names '%.40s' twice (columns %d and %d)", path, c + 2, name,
                     o + 2, c + 2);
                goto done;
            }
        out->names[c] = strdup(name);
        if (!out->names[c]) {
            fail(err, errlen, "%s: out of memory", path);
            goto done;
        }
    }
    const int64_t rows = nl - 1;
    out->values = malloc(sizeof(double) * (size_t)(rows > 0 ? rows : 1) * (size_t)out->cols);
    out->dates = calloc((size_t)(rows > 0 ? rows : 1), sizeof(char *));
    if (!out->values || !out->dates) {
        fail(err, errlen, "%s: out of memory", path);
        goto done;
    }
    for (int64_t r = 0; r < rows; r++) {
        const int64_t line = r + 2;
        char *text_line = lines[r + 1];
        if (trim(text_line)[0] == 0) {
            fail(err, errlen, "%s:%lld: empty row", path, (long long)line);
            goto done;
        }
        const int nf = split(text_line, fields, max_fields + 1);
        if (nf != nh) {
            fail(err, errlen, "%s:%lld: %d fields, but the header has %d", path, (long long)line, nf, nh);
            goto done;
        }
        if (!fields[0][0]) {
            fail(err, errlen, "%s:%lld:1 (date): the date is empty", path, (long long)line);
            goto done;
        }
        out->dates[r] = strdup(fields[0]);
        out->rows = r + 1; /* owned so far, for csv_free */
        if (!out->dates[r]) {
            fail(err, errlen, "%s: out of memory", path);
            goto done;
        }
        for (int c = 0; c < out->cols; c++) {
            const char *cell = fields[c + 1];
            char *end = NULL;
            errno = 0;
            double v = cell[0] ? strtod(cell, &end) : 0.0;
            if (!cell[0]) {
                fail(err, errlen, "%s:%lld:%d (%s): the cell is empty", path, (long long)line, c + 2, out->names[c]);
                goto done;
            }
            if (end == cell || *end != 0) {
                fail(err, errlen, "%s:%lld:%d (%s): '%.40s' is not a number", path, (long long)line, c + 2,
                     out->names[c], cell);
                goto done;
            }
            if (!isfinite(v)) {
                fail(err, errlen, "%s:%lld:%d (%s): '%.40s' is not a finite number", path, (long long)line, c + 2,
                     out->names[c], cell);
                goto done;
            }
            out->values[r * out->cols + c] = v;
        }
    }
    out->rows = rows;
    rc = 0;
done:
    free(fields);
    free(lines);
    free(text);
    if (rc != 0) csv_free(out);
    return rc;
}
