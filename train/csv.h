/*
 * csv.h — the loader of fastgrad-train's data: a CSV whose first column is a date (kept as
 * text, for the forecasts' output) and whose other columns are numeric series. Every
 * problem is reported as one line naming the file, row and column, so the program can
 * print it and exit with status 2.
 */
#ifndef FGT_CSV_H
#define FGT_CSV_H

#include <stddef.h>
#include <stdint.h>

typedef struct csv_table {
    int64_t rows;      /* data rows (the header not counted) */
    int cols;          /* numeric columns (the date column not counted) */
    char **names;      /* [cols] the header's series names */
    char **dates;      /* [rows] the first column's text */
    double *values;    /* [rows, cols] row-major */
} csv_table;

/* Reads `path`. Returns 0, or -1 with a one-line message in err ("data/x.csv:5:3 (MUFL):
 * 'abc' is not a number"). Rows are numbered as lines of the file (the header is line 1),
 * columns from 1 (the date column). */
int csv_load(const char *path, csv_table *out, char *err, size_t errlen);
void csv_free(csv_table *t);

#endif
