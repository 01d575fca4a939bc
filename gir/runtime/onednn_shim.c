/* GIR's library ops on oneDNN (C API): a convolution or matmul primitive created once per op
 * when the session is made, constant weights reordered once into the layout the primitive
 * prefers, and one call per run that points the primitive at the op's operands and at its
 * output's arena slot. Built by gir/runtime/onednn.py with the CPU backend's compiler and
 * linked against the onednn-cpu-gomp wheel's libdnnl (GNU OpenMP: GIR's kernels' own pool). */
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <oneapi/dnnl/dnnl.h>

/* libgomp's, which libdnnl (the gomp build) and GIR's kernels share */
extern void omp_set_num_threads(int n);
extern int omp_get_max_threads(void);

#define GIR_MAX_POST 16

static dnnl_engine_t engine;
static dnnl_stream_t stream;

typedef struct {
    dnnl_primitive_t prim;
    /* memories the primitive reads and writes, in its own layouts */
    dnnl_memory_t src, wei, bias, dst;
    /* the op's operands in their plain (row-major) layouts, and reorders to and from them;
     * NULL where the primitive uses the plain layout itself */
    dnnl_memory_t src_user, dst_user;
    dnnl_primitive_t src_reorder, dst_reorder;
    int wei_const, has_bias;
    int threads; /* OpenMP threads a run uses: 0 = the pool's default */
    /* the epilogue's residual inputs, in order: the first is a sum post-op (the output is
     * filled with it before the run: a plain copy, or a reorder into the primitive's layout), the
     * others binary-add post-ops over the output's plain dims */
    int n_res, has_sum;
    size_t res_bytes;
    dnnl_memory_t sum_user;          /* the first residual as a plain memory (blocked output) */
    dnnl_primitive_t sum_reorder;    /* ... reordered into the primitive's dst */
    int bin_index[GIR_MAX_POST];     /* a binary post-op's position in the chain */
    dnnl_memory_t bin[GIR_MAX_POST];
    /* or the epilogue apart: eltwise and binary-add primitives run in place on the plain output
     * after the op (oneDNN's GEMM convolution applies post-ops in a slow pass of its own) */
    int n_sep;
    dnnl_primitive_t sep[GIR_MAX_POST];
    int sep_res[GIR_MAX_POST];       /* the residual's index among the run's inputs, -1: eltwise */
    dnnl_memory_t out_plain, sep_src1[GIR_MAX_POST];
    /* a buffer in the primitive's own layout that the previous op left its output in (src) or
     * that the next op reads this op's output from (dst): no reorder (gir_dnnl_handoff) */
    void *src_handoff, *dst_handoff;
    /* a bias per row of a matmul (a 1x1 conv as W @ X): a binary add, first in the chain */
    dnnl_memory_t row_bias;
} gir_op;

#define CHECK(x) do { dnnl_status_t s_ = (x); if (s_ != dnnl_success) return (int)s_; } while (0)

int gir_dnnl_init(void) {
    if (engine) return 0;
    CHECK(dnnl_engine_create(&engine, dnnl_cpu, 0));
    CHECK(dnnl_stream_create(&stream, engine, dnnl_stream_default_flags));
    return 0;
}

static dnnl_format_tag_t plain_tag(int ndims) {
    static const dnnl_format_tag_t tags[] = {dnnl_format_tag_undef, dnnl_a, dnnl_ab, dnnl_abc, dnnl_abcd,
                                             dnnl_abcde, dnnl_abcdef};
    return ndims >= 1 && ndims <= 6 ? tags[ndims] : dnnl_format_tag_undef;
}

static int plain_md(dnnl_memory_desc_t *md, int ndims, const int64_t *dims) {
    dnnl_dims_t d;
    for (int i = 0; i < ndims; i++) d[i] = dims[i];
    CHECK(dnnl_memory_desc_create_with_tag(md, ndims, d, dnnl_f32, plain_tag(ndims)));
    return 0;
}

static int any_md(dnnl_memory_desc_t *md, int ndims, const int64_t *dims) {
    dnnl_dims_t d;
    for (int i = 0; i < ndims; i++) d[i] = dims[i];
    CHECK(dnnl_memory_desc_create_with_tag(md, ndims, d, dnnl_f32, dnnl_format_tag_any));
    return 0;
}

/* An epilogue step: kind >= 0 is an eltwise post-op of the table below (alpha, beta as oneDNN
 * takes them), GIR_POST_RESIDUAL the add of a tensor of the output's (plain) dims: the first as
 * a sum post-op (every jit convolution and matmul takes one; a binary add of a plain tensor to a
 * blocked output left only oneDNN's reference convolution, 50x slower on EfficientNet-B0), any
 * further one as a binary add. */
#define GIR_POST_RESIDUAL (-1)
static const dnnl_alg_kind_t eltwise_algs[] = {
    dnnl_eltwise_relu, dnnl_eltwise_logistic, dnnl_eltwise_tanh, dnnl_eltwise_swish, dnnl_eltwise_gelu_erf,
    dnnl_eltwise_gelu_tanh, dnnl_eltwise_clip, dnnl_eltwise_hardsigmoid, dnnl_eltwise_hardswish, dnnl_eltwise_elu};
#define GIR_N_ELTWISE ((int)(sizeof(eltwise_algs) / sizeof(eltwise_algs[0])))

/* The primitive attribute carrying the epilogue (NULL *attr for none); residual memories are
 * created on `op` (no data: a run points them at the operands). */
static int make_post_ops(gir_op *op, int n_post, const int *kinds, const float *alpha, const float *beta,
                         const_dnnl_memory_desc_t dst_plain, const_dnnl_memory_desc_t row_bias,
                         dnnl_primitive_attr_t *attr) {
    *attr = NULL;
    if (n_post <= 0 && !row_bias) return 0;
    if (n_post > GIR_MAX_POST) return (int)dnnl_invalid_arguments;
    dnnl_post_ops_t po;
    CHECK(dnnl_post_ops_create(&po));
    int r = 0, first = 0;
    if (row_bias) {
        r = (int)dnnl_post_ops_append_binary(po, dnnl_binary_add, row_bias);
        if (!r) r = (int)dnnl_memory_create(&op->row_bias, row_bias, engine, DNNL_MEMORY_NONE);
        first = 1;
    }
    for (int i = 0; i < n_post && !r; i++) {
        if (kinds[i] == GIR_POST_RESIDUAL && !op->has_sum) {
            r = (int)dnnl_post_ops_append_sum(po, 1.0f, 0, dnnl_data_type_undef);
            op->has_sum = 1;
            op->n_res++;
        } else if (kinds[i] == GIR_POST_RESIDUAL) {
            r = (int)dnnl_post_ops_append_binary(po, dnnl_binary_add, dst_plain);
            if (!r) r = (int)dnnl_memory_create(&op->bin[op->n_res], dst_plain, engine, DNNL_MEMORY_NONE);
            if (!r) op->bin_index[op->n_res++] = first + i;
        } else if (kinds[i] >= 0 && kinds[i] < GIR_N_ELTWISE) {
            r = (int)dnnl_post_ops_append_eltwise(po, eltwise_algs[kinds[i]], alpha[i], beta[i]);
        } else {
            r = (int)dnnl_invalid_arguments;
        }
    }
    if (!r) r = (int)dnnl_primitive_attr_create(attr);
    if (!r) r = (int)dnnl_primitive_attr_set_post_ops(*attr, po);
    dnnl_post_ops_destroy(po);
    return r;
}

/* The epilogue as primitives of its own, in place on the plain output (see gir_op). */
static int make_separate(gir_op *op, int n_post, const int *kinds, const float *alpha, const float *beta,
                         const_dnnl_memory_desc_t dst_plain) {
    if (n_post > GIR_MAX_POST) return (int)dnnl_invalid_arguments;
    CHECK(dnnl_memory_create(&op->out_plain, dst_plain, engine, DNNL_MEMORY_NONE));
    int res = 0;
    for (int i = 0; i < n_post; i++) {
        dnnl_primitive_desc_t pd;
        if (kinds[i] == GIR_POST_RESIDUAL) {
            CHECK(dnnl_binary_primitive_desc_create(&pd, engine, dnnl_binary_add, dst_plain, dst_plain, dst_plain, NULL));
            dnnl_status_t m = dnnl_memory_create(&op->sep_src1[i], dst_plain, engine, DNNL_MEMORY_NONE);
            if (m != dnnl_success) { dnnl_primitive_desc_destroy(pd); return (int)m; }
            op->sep_res[i] = res++;
        } else if (kinds[i] >= 0 && kinds[i] < GIR_N_ELTWISE) {
            CHECK(dnnl_eltwise_forward_primitive_desc_create(&pd, engine, dnnl_forward_inference, eltwise_algs[kinds[i]],
                                                             dst_plain, dst_plain, alpha[i], beta[i], NULL));
            op->sep_res[i] = -1;
        } else {
            return (int)dnnl_invalid_arguments;
        }
        dnnl_status_t s = dnnl_primitive_create(&op->sep[i], pd);
        dnnl_primitive_desc_destroy(pd);
        if (s != dnnl_success) return (int)s;
        op->n_sep = i + 1;
    }
    return 0;
}

static int run_reorder(dnnl_memory_t from, dnnl_memory_t to) {
    dnnl_primitive_desc_t pd;
    dnnl_primitive_t r;
    const_dnnl_memory_desc_t a, b;
    CHECK(dnnl_memory_get_memory_desc(from, &a));
    CHECK(dnnl_memory_get_memory_desc(to, &b));
    CHECK(dnnl_reorder_primitive_desc_create(&pd, a, engine, b, engine, NULL));
    dnnl_status_t s = dnnl_primitive_create(&r, pd);
    dnnl_primitive_desc_destroy(pd);
    if (s != dnnl_success) return (int)s;
    dnnl_exec_arg_t args[2] = {{DNNL_ARG_FROM, from}, {DNNL_ARG_TO, to}};
    s = dnnl_primitive_execute(r, stream, 2, args);
    if (s == dnnl_success) s = dnnl_stream_wait(stream);
    dnnl_primitive_destroy(r);
    return (int)s;
}

/* A reorder primitive between the user's plain memory and the primitive's (both own no data). */
static int make_reorder(dnnl_memory_t from, dnnl_memory_t to, dnnl_primitive_t *r) {
    dnnl_primitive_desc_t pd;
    const_dnnl_memory_desc_t a, b;
    CHECK(dnnl_memory_get_memory_desc(from, &a));
    CHECK(dnnl_memory_get_memory_desc(to, &b));
    CHECK(dnnl_reorder_primitive_desc_create(&pd, a, engine, b, engine, NULL));
    dnnl_status_t s = dnnl_primitive_create(r, pd);
    dnnl_primitive_desc_destroy(pd);
    return (int)s;
}

/* The primitive's memory for `what`; when its layout is not the plain `user` one, also the plain
 * memory (`user_out`) and a reorder in the direction `to_prim` (src) or back (dst). */
static int bind_activation(dnnl_primitive_desc_t pd, dnnl_query_t what, const_dnnl_memory_desc_t user,
                           dnnl_memory_t *mem, dnnl_memory_t *user_out, dnnl_primitive_t *reorder, int to_prim) {
    const_dnnl_memory_desc_t md = dnnl_primitive_desc_query_md(pd, what, 0);
    if (dnnl_memory_desc_equal(md, user)) {
        CHECK(dnnl_memory_create(mem, md, engine, DNNL_MEMORY_NONE));
        return 0;
    }
    CHECK(dnnl_memory_create(mem, md, engine, DNNL_MEMORY_NONE));  /* a shared buffer at each run */
    CHECK(dnnl_memory_create(user_out, user, engine, DNNL_MEMORY_NONE));
    return to_prim ? make_reorder(*user_out, *mem, reorder) : make_reorder(*mem, *user_out, reorder);
}

/* The weights: a constant is copied once into the primitive's layout; else used in place. */
static int bind_weights(gir_op *op, dnnl_primitive_desc_t pd, const_dnnl_memory_desc_t user, const float *w) {
    const_dnnl_memory_desc_t md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 0);
    if (!op->wei_const) {
        CHECK(dnnl_memory_create(&op->wei, md, engine, DNNL_MEMORY_NONE));
        return 0;
    }
    dnnl_memory_t plain;
    CHECK(dnnl_memory_create(&op->wei, md, engine, DNNL_MEMORY_ALLOCATE));
    CHECK(dnnl_memory_create(&plain, user, engine, (void *)w));
    int s = run_reorder(plain, op->wei);
    dnnl_memory_destroy(plain);
    return s;
}

static int finish(gir_op *op, dnnl_primitive_desc_t pd, const_dnnl_memory_desc_t src_user,
                  const_dnnl_memory_desc_t wei_user, const_dnnl_memory_desc_t dst_user, const float *w,
                  char *impl, int impl_len) {
    const char *name = NULL;
    dnnl_primitive_desc_query(pd, dnnl_query_impl_info_str, 0, &name);
    if (impl && impl_len > 0) {
        strncpy(impl, name ? name : "?", impl_len - 1);
        impl[impl_len - 1] = 0;
    }
    CHECK(dnnl_primitive_create(&op->prim, pd));
    CHECK(bind_activation(pd, dnnl_query_src_md, src_user, &op->src, &op->src_user, &op->src_reorder, 1));
    CHECK(bind_activation(pd, dnnl_query_dst_md, dst_user, &op->dst, &op->dst_user, &op->dst_reorder, 0));
    op->res_bytes = dnnl_memory_desc_get_size(dst_user);
    if (op->has_sum && op->dst_reorder) {
        CHECK(dnnl_memory_create(&op->sum_user, dst_user, engine, DNNL_MEMORY_NONE));
        CHECK(make_reorder(op->sum_user, op->dst, &op->sum_reorder));
    }
    CHECK(bind_weights(op, pd, wei_user, w));
    if (op->has_bias) {
        const_dnnl_memory_desc_t md = dnnl_primitive_desc_query_md(pd, dnnl_query_weights_md, 1);
        CHECK(dnnl_memory_create(&op->bias, md, engine, DNNL_MEMORY_NONE));
    }
    return 0;
}

/* ONNX Conv over float32 NC[D]HW[W] with N-d spatial dims (nsp 1..3). w: the constant weights
 * (M, C/group, k...), or NULL when they are computed (read in place at each run). blocked: let
 * the primitive pick its activation layout (reordered in and out at each run) instead of the
 * plain one. Returns 0 or a dnnl_status_t; *out is the op. */
int gir_dnnl_conv(gir_op **out, int nsp, const int64_t *x_dims, const int64_t *w_dims, const int64_t *y_dims,
                  int64_t group, const int64_t *strides, const int64_t *dilations, const int64_t *pads_l,
                  const int64_t *pads_r, const float *w, int has_bias, int blocked, int n_post, const int *post_kinds,
                  const float *post_alpha, const float *post_beta, int separate, char *impl, int impl_len) {
    CHECK(gir_dnnl_init());
    int nd = nsp + 2;
    gir_op *op = calloc(1, sizeof(gir_op));
    *out = op;
    op->wei_const = w != NULL;
    op->has_bias = has_bias;
    dnnl_memory_desc_t src_user, dst_user, wei_user, src_md, dst_md, wei_md, bias_md = NULL;
    int64_t wd[8];
    int wnd = nd;
    if (group > 1) {
        wd[0] = group;
        wd[1] = w_dims[0] / group;
        for (int i = 1; i < nd; i++) wd[i + 1] = w_dims[i];
        wnd = nd + 1;
    } else {
        for (int i = 0; i < nd; i++) wd[i] = w_dims[i];
    }
    CHECK(plain_md(&src_user, nd, x_dims));
    CHECK(plain_md(&dst_user, nd, y_dims));
    CHECK(plain_md(&wei_user, wnd, wd));
    if (blocked) {
        CHECK(any_md(&src_md, nd, x_dims));
        CHECK(any_md(&dst_md, nd, y_dims));
    } else {
        CHECK(plain_md(&src_md, nd, x_dims));
        CHECK(plain_md(&dst_md, nd, y_dims));
    }
    if (op->wei_const) CHECK(any_md(&wei_md, wnd, wd));
    else CHECK(plain_md(&wei_md, wnd, wd));
    if (has_bias) CHECK(plain_md(&bias_md, 1, w_dims));
    dnnl_dims_t st, di, pl, pr;
    for (int i = 0; i < nsp; i++) {
        st[i] = strides[i];
        di[i] = dilations[i] - 1;  /* oneDNN counts the gaps between taps */
        pl[i] = pads_l[i];
        pr[i] = pads_r[i];
    }
    dnnl_primitive_desc_t pd;
    dnnl_primitive_attr_t attr;
    CHECK(make_post_ops(op, separate ? 0 : n_post, post_kinds, post_alpha, post_beta, dst_user, NULL, &attr));
    dnnl_status_t s = dnnl_convolution_forward_primitive_desc_create(
        &pd, engine, dnnl_forward_inference, dnnl_convolution_direct, src_md, wei_md, bias_md, dst_md, st, di, pl,
        pr, attr);
    if (attr) dnnl_primitive_attr_destroy(attr);
    int r = (int)s;
    if (s == dnnl_success) {
        r = finish(op, pd, src_user, wei_user, dst_user, w, impl, impl_len);
        if (!r && separate) r = make_separate(op, n_post, post_kinds, post_alpha, post_beta, dst_user);
        dnnl_primitive_desc_destroy(pd);
    }
    dnnl_memory_desc_destroy(src_user); dnnl_memory_desc_destroy(dst_user); dnnl_memory_desc_destroy(wei_user);
    dnnl_memory_desc_destroy(src_md); dnnl_memory_desc_destroy(dst_md); dnnl_memory_desc_destroy(wei_md);
    if (bias_md) dnnl_memory_desc_destroy(bias_md);
    return r;
}

/* numpy matmul over float32 operands of `nd` dims (batch dims broadcast where one side has 1).
 * b: the constant right operand, or NULL when it is computed. has_bias: 1, a bias of the last
 * dim's length, added along it; 2, one of the second-to-last dim's, one per row. The epilogue
 * as for gir_dnnl_conv. */
int gir_dnnl_matmul(gir_op **out, int nd, const int64_t *a_dims, const int64_t *b_dims, const int64_t *c_dims,
                    const float *b, int has_bias, int n_post, const int *post_kinds, const float *post_alpha,
                    const float *post_beta, int separate, char *impl, int impl_len) {
    CHECK(gir_dnnl_init());
    gir_op *op = calloc(1, sizeof(gir_op));
    *out = op;
    op->wei_const = b != NULL;
    op->has_bias = has_bias;
    dnnl_memory_desc_t a_md, b_user, b_md, c_md, bias_md = NULL;
    CHECK(plain_md(&a_md, nd, a_dims));
    CHECK(plain_md(&c_md, nd, c_dims));
    CHECK(plain_md(&b_user, nd, b_dims));
    if (op->wei_const) CHECK(any_md(&b_md, nd, b_dims));
    else CHECK(plain_md(&b_md, nd, b_dims));
    dnnl_memory_desc_t row_md = NULL;
    if (has_bias) {
        /* 1: along the last dim, the primitive's own bias; 2: one per row (a 1x1 conv as W @ X),
         * a binary add post-op (oneDNN's GEMM matmul takes no row bias: ref:any, 600x slower) */
        int64_t bd[8];
        int along = has_bias == 2 ? nd - 2 : nd - 1;
        for (int i = 0; i < nd; i++) bd[i] = i == along ? c_dims[i] : 1;
        CHECK(plain_md(has_bias == 2 ? &row_md : &bias_md, nd, bd));
        op->has_bias = has_bias == 1;
    }
    dnnl_primitive_desc_t pd;
    dnnl_primitive_attr_t attr;
    CHECK(make_post_ops(op, separate ? 0 : n_post, post_kinds, post_alpha, post_beta, c_md, row_md, &attr));
    if (row_md) dnnl_memory_desc_destroy(row_md);
    dnnl_status_t s = dnnl_matmul_primitive_desc_create(&pd, engine, a_md, b_md, bias_md, c_md, attr);
    if (attr) dnnl_primitive_attr_destroy(attr);
    if (bias_md) dnnl_memory_desc_destroy(bias_md);
    int r = (int)s;
    if (s == dnnl_success) {
        r = finish(op, pd, a_md, b_user, c_md, b, impl, impl_len);
        if (!r && separate) r = make_separate(op, n_post, post_kinds, post_alpha, post_beta, c_md);
        dnnl_primitive_desc_destroy(pd);
    }
    dnnl_memory_desc_destroy(a_md); dnnl_memory_desc_destroy(b_user);
    dnnl_memory_desc_destroy(b_md); dnnl_memory_desc_destroy(c_md);
    return r;
}

/* Bytes of the primitive's own copy of src (which 0) or dst (1) a run needs, 0 for none. */
int64_t gir_dnnl_staging_bytes(gir_op *op, int which) {
    dnnl_memory_t m = which ? (op->dst_reorder ? op->dst : NULL) : (op->src_reorder ? op->src : NULL);
    const_dnnl_memory_desc_t md;
    if (!m || dnnl_memory_get_memory_desc(m, &md) != dnnl_success) return 0;
    return (int64_t)dnnl_memory_desc_get_size(md);
}

static int run_op(gir_op *op, void *src, void *wei, void *bias, void *dst, void *src_stage, void *dst_stage,
                  void **post);

/* One run: src, the weights (ignored when constant), the bias (or NULL), the output slot,
 * staging buffers for src and dst in the primitive's layout (of gir_dnnl_staging_bytes; shared
 * by every op of a session, which run one at a time) and the epilogue's residual inputs in
 * order (NULL for none), on the op's own thread count if it has one. */
int gir_dnnl_run(gir_op *op, void *src, void *wei, void *bias, void *dst, void *src_stage, void *dst_stage,
                 void **post) {
    if (!op->threads) return run_op(op, src, wei, bias, dst, src_stage, dst_stage, post);
    int pool = omp_get_max_threads();
    omp_set_num_threads(op->threads);
    int status = run_op(op, src, wei, bias, dst, src_stage, dst_stage, post);
    omp_set_num_threads(pool);
    return status;
}

/* Bytes of op a's output in its primitive's own layout where that is exactly the layout op b's
 * primitive reads its source in (both reorder from and to the plain layout, a has no epilogue
 * apart, which works on the plain output), else 0: a can then leave its output there and b read
 * it from there, with no reorder to the plain layout and back (gir_dnnl_handoff). */
int64_t gir_dnnl_handoff_bytes(gir_op *a, gir_op *b) {
    const_dnnl_memory_desc_t x, y;
    if (!a->dst_reorder || !b->src_reorder || a->n_sep) return 0;
    if (dnnl_memory_get_memory_desc(a->dst, &x) != dnnl_success ||
        dnnl_memory_get_memory_desc(b->src, &y) != dnnl_success || !dnnl_memory_desc_equal(x, y)) return 0;
    return (int64_t)dnnl_memory_desc_get_size(x);
}

/* The buffers op reads its source from and leaves its output in, in its own layout (NULL: the
 * plain operand through the staging buffers, as before). */
void gir_dnnl_handoff(gir_op *op, void *src, void *dst) {
    op->src_handoff = src;
    op->dst_handoff = dst;
}

/* The threads the next primitive is created for and the previous pool size. oneDNN's jit
 * kernels split their work for omp_get_max_threads() when the primitive is made and fork that
 * many at each run, so a small op meant to run on one thread is also created on one. */
int gir_dnnl_threads(int n) {
    int pool = omp_get_max_threads();
    omp_set_num_threads(n);
    return pool;
}

void gir_dnnl_set_op_threads(gir_op *op, int n) { op->threads = n; }

/* The pool's size: what a run of an op with threads = 0 forks. */
int gir_dnnl_pool(void) { return omp_get_max_threads(); }

static int run_op(gir_op *op, void *src, void *wei, void *bias, void *dst, void *src_stage, void *dst_stage,
                  void **post) {
    dnnl_exec_arg_t args[5 + GIR_MAX_POST];
    int n = 0;
    if (op->src_reorder) CHECK(dnnl_memory_set_data_handle(op->src, op->src_handoff ? op->src_handoff : src_stage));
    if (op->dst_reorder) CHECK(dnnl_memory_set_data_handle(op->dst, op->dst_handoff ? op->dst_handoff : dst_stage));
    if (op->src_handoff) {
        /* the previous op left the source in this primitive's layout */
    } else if (op->src_reorder) {
        CHECK(dnnl_memory_set_data_handle(op->src_user, src));
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, op->src_user}, {DNNL_ARG_TO, op->src}};
        CHECK(dnnl_primitive_execute(op->src_reorder, stream, 2, ra));
    } else {
        CHECK(dnnl_memory_set_data_handle(op->src, src));
    }
    if (!op->wei_const) CHECK(dnnl_memory_set_data_handle(op->wei, wei));
    if (op->dst_reorder) CHECK(dnnl_memory_set_data_handle(op->dst_user, dst));
    else CHECK(dnnl_memory_set_data_handle(op->dst, dst));
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_SRC, op->src};
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_WEIGHTS, op->wei};
    if (op->has_bias) {
        CHECK(dnnl_memory_set_data_handle(op->bias, bias));
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_BIAS, op->bias};
    }
    args[n++] = (dnnl_exec_arg_t){DNNL_ARG_DST, op->dst};
    if (op->has_sum) {  /* the output holds the first residual when the primitive adds it */
        if (op->sum_reorder) {
            CHECK(dnnl_memory_set_data_handle(op->sum_user, post[0]));
            dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, op->sum_user}, {DNNL_ARG_TO, op->dst}};
            CHECK(dnnl_primitive_execute(op->sum_reorder, stream, 2, ra));
        } else if (post[0] != dst) {
            memmove(dst, post[0], op->res_bytes);
        }
    }
    if (op->row_bias) {
        CHECK(dnnl_memory_set_data_handle(op->row_bias, bias));
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_MULTIPLE_POST_OP(0) | DNNL_ARG_SRC_1, op->row_bias};
    }
    for (int i = op->has_sum; i < op->n_res; i++) {
        CHECK(dnnl_memory_set_data_handle(op->bin[i], post[i]));
        args[n++] = (dnnl_exec_arg_t){DNNL_ARG_ATTR_MULTIPLE_POST_OP(op->bin_index[i]) | DNNL_ARG_SRC_1, op->bin[i]};
    }
    CHECK(dnnl_primitive_execute(op->prim, stream, n, args));
    if (op->dst_reorder && !op->dst_handoff) {
        dnnl_exec_arg_t ra[2] = {{DNNL_ARG_FROM, op->dst}, {DNNL_ARG_TO, op->dst_user}};
        CHECK(dnnl_primitive_execute(op->dst_reorder, stream, 2, ra));
    }
    if (op->n_sep) CHECK(dnnl_memory_set_data_handle(op->out_plain, dst));
    for (int i = 0; i < op->n_sep; i++) {
        if (op->sep_res[i] >= 0) {
            CHECK(dnnl_memory_set_data_handle(op->sep_src1[i], post[op->sep_res[i]]));
            dnnl_exec_arg_t ba[3] = {{DNNL_ARG_SRC_0, op->out_plain}, {DNNL_ARG_SRC_1, op->sep_src1[i]},
                                     {DNNL_ARG_DST, op->out_plain}};
            CHECK(dnnl_primitive_execute(op->sep[i], stream, 3, ba));
        } else {
            dnnl_exec_arg_t ea[2] = {{DNNL_ARG_SRC, op->out_plain}, {DNNL_ARG_DST, op->out_plain}};
            CHECK(dnnl_primitive_execute(op->sep[i], stream, 2, ea));
        }
    }
    CHECK(dnnl_stream_wait(stream));
    return 0;
}

void gir_dnnl_free(gir_op *op) {
    if (!op) return;
    if (op->prim) dnnl_primitive_destroy(op->prim);
    if (op->src_reorder) dnnl_primitive_destroy(op->src_reorder);
    if (op->dst_reorder) dnnl_primitive_destroy(op->dst_reorder);
    dnnl_memory_t mems[] = {op->src, op->wei, op->bias, op->dst, op->src_user, op->dst_user};
    for (int i = 0; i < 6; i++)
        if (mems[i]) dnnl_memory_destroy(mems[i]);
    for (int i = 0; i < op->n_res; i++)
        if (op->bin[i]) dnnl_memory_destroy(op->bin[i]);
    if (op->row_bias) dnnl_memory_destroy(op->row_bias);
    for (int i = 0; i < op->n_sep; i++) {
        dnnl_primitive_destroy(op->sep[i]);
        if (op->sep_src1[i]) dnnl_memory_destroy(op->sep_src1[i]);
    }
    if (op->out_plain) dnnl_memory_destroy(op->out_plain);
    if (op->sum_reorder) dnnl_primitive_destroy(op->sum_reorder);
    if (op->sum_user) dnnl_memory_destroy(op->sum_user);
    free(op);
}

/* The library's version, for the Session's report. */
void gir_dnnl_version(int *v) {
    const dnnl_version_t *ver = dnnl_version();
    v[0] = ver->major; v[1] = ver->minor; v[2] = ver->patch;
}
