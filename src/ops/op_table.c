/*
 * op_table.c — the op table: the list of op families, each of which declares its ops once
 * in its own file (src/ops/<family>.c: id, name, operands with their roles, accepted plan
 * flags, options struct, lowering). The plan mechanism looks ops up here, and
 * fg_op_describe hands the same declarations to bindings, so no other list of ops exists.
 * A new family adds one line below.
 */
#include "../core/internal.h"

#include <string.h>

extern const fg_family fg_family_linear, fg_family_matmul, fg_family_outer, fg_family_elementwise,
    fg_family_linear_logp, fg_family_linear_act, fg_family_norm,
    fg_family_attention, fg_family_series;

static const fg_family *const families[] = {
    &fg_family_linear, &fg_family_matmul, &fg_family_outer, &fg_family_elementwise,
    &fg_family_linear_logp, &fg_family_linear_act, &fg_family_norm, &fg_family_attention,
    &fg_family_series,
};

const fg_op_decl *fg_op_find(fg_op op, const char **family) {
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++)
        for (int i = 0; i < families[f]->n_ops; i++)
            if (families[f]->ops[i].op == op) {
                if (family) *family = families[f]->name;
                return &families[f]->ops[i];
            }
    return NULL;
}

int32_t fg_op_count(void) {
    int32_t n = 0;
    for (size_t f = 0; f < sizeof families / sizeof families[0]; f++) n += families[f]->n_ops;
    return n;
}

fg_status fg_op_describe(fg_op op, fg_op_info *info) {
    if (!info) return fg_fail(FG_ERR_NULL_POINTER, "op_describe: info is NULL");
    const char *family = NULL;
    const fg_op_decl *e = fg_op_find(op, &family);
    if (!e) return fg_fail(FG_ERR_INVALID_VALUE, "op_describe: op=%d is not an op", (int)op);
    memset(info, 0, sizeof *info);
    info->op = e->op;
    info->name = e->name;
    info->family = family;
    info->n_operands = e->n_operands;
    for (int i = 0; i < e->n_operands; i++) {
        info->operands[i].name = e->operands[i].name;
        info->operands[i].role = e->operands[i].output ? FG_ROLE_OUTPUT : FG_ROLE_INPUT;
        info->operands[i].optional = e->operands[i].optional;
    }
    info->flags = FG_PLAN_ALLOW_TF32 | e->flags;
    info->options_type = e->options_type;
    info->options_size = e->options_size;
    fg_clear_error();
    return FG_OK;
}
