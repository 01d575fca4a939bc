// gpu_on_cpu.h: run unchanged CUDA/HIP kernel source on the CPU, for tests only.
//
// Why: CI has no GPU, yet every emitted kernel's numbers must be checked. Each GPU thread is a
// fiber on its own small stack (GPUCPU_STACK_BYTES, guard page below): started by a two-instruction
// stack switch on x86-64 (makecontext/setcontext elsewhere), switched with _setjmp/_longjmp, so no
// switch costs a signal-mask syscall as swapcontext would. __syncthreads and warp operations are
// cooperative barriers resolved by a per-block scheduler; blocks run in parallel on OpenMP threads.
// __shared__ becomes thread_local: all fibers of a block run on one OS thread, which runs one block
// at a time, so that storage is per block. Barrier misuse (a thread exited or waits elsewhere) is
// an error, never a hang.
#pragma once
#ifndef GPUCPU_WARP_SIZE
#define GPUCPU_WARP_SIZE 32
#endif
#ifndef GPUCPU_STACK_BYTES
#define GPUCPU_STACK_BYTES (64 * 1024)
#endif
#ifndef GPUCPU_DYN_SMEM_MAX
#define GPUCPU_DYN_SMEM_MAX (228 * 1024)
#endif
#define GPUCPU_API __attribute__((visibility("default")))
#include <math.h>
#include <setjmp.h>
#include <stdint.h>
#include <stdio.h>
#include <string.h>
#include <sys/mman.h>
#include <ucontext.h>
#include <unistd.h>
#include <atomic>
#include <cfloat>
#include <cmath>
#include <limits>
#include <mutex>
#include <string>
#include <type_traits>
#include <utility>

// ---- qualifiers and built-in variables (std headers come first: __noinline__ would break them) --
#define __global__
#define __device__
#define __host__
#define __constant__
#define __managed__
#define __forceinline__ inline
#define __noinline__ __attribute__((noinline))
#define __align__(n) __attribute__((aligned(n)))
#define __launch_bounds__(...)
#define __shared__ thread_local  // block scope implies static; `extern __shared__` works too
#define HIP_DYNAMIC_SHARED(type, var) extern __shared__ type var[];

struct uint3 { unsigned x, y, z; };
struct dim3 {
  unsigned x, y, z;
  constexpr dim3(unsigned x_ = 1, unsigned y_ = 1, unsigned z_ = 1) : x(x_), y(y_), z(z_) {}
};
static constexpr int warpSize = GPUCPU_WARP_SIZE;
static_assert(warpSize == 32 || warpSize == 64, "warp size must be 32 or 64");

namespace gpucpu {
typedef void (*Body)(void**);
enum { RUN, WAIT_BLOCK, WAIT_WARP, DONE };
enum { OP_SHFL, OP_SYNCWARP, OP_VOTE };
static const char* const kOpNames[] = {"a warp shuffle", "__syncwarp", "a warp vote"};

struct Fiber {
  jmp_buf jb;
  uint3 tid;
  int lane, warp, state, line, op, started;
};
struct Warp {
  unsigned long long arrived, mask, exists, ballot;
  int op, line;
  uint64_t in[64], out[64];
  int src[64];
};
struct Block {  // one per OS thread, reused for every block that thread runs; zero-initialised
  Fiber* f;      // (no constructor, so thread_local access needs no init wrapper)
  Warp* w;
  int n, nw, cap, n_done, n_wait, line;
  char* stacks;
  size_t stack_sz;
  bool aborted, have_tmpl;
  jmp_buf sched;
  ucontext_t tmpl, boot;
};

inline dim3 g_grid, g_block;
inline Body g_body;
inline void** g_args;
inline std::atomic<int> g_failed{0};
inline std::mutex g_err_mu;
inline std::string g_err;
inline thread_local Block T;
inline thread_local Fiber* cur;
inline thread_local uint3 t_block;

inline void set_error(const std::string& msg) {
  std::lock_guard<std::mutex> lk(g_err_mu);
  if (g_failed.exchange(1) == 0) g_err = msg;
}
inline std::string tid_str(const uint3& t) {
  char b[64];
  snprintf(b, sizeof b, "(%u,%u,%u)", t.x, t.y, t.z);
  return b;
}
// noinline keeps _setjmp's returns-twice effects out of kernel code; the asm is a compiler
// barrier so values in shared memory are reloaded after every switch.
__attribute__((noinline)) inline void yield() {
  asm volatile("" ::: "memory");
  if (_setjmp(cur->jb) == 0) _longjmp(T.sched, 1);
  asm volatile("" ::: "memory");
}
[[noreturn]] inline void fail(const std::string& msg) {  // inside a fiber: report, never resume
  set_error("block " + tid_str(t_block) + " thread " + tid_str(cur->tid) + ": " + msg);
  T.aborted = true;
  for (;;) yield();
}
inline void entry() {
  g_body(g_args);
  cur->state = DONE;
  T.n_done++;
  _longjmp(T.sched, 1);
}
__attribute__((noinline)) inline void resume(Fiber* f) {
  cur = f;
  if (_setjmp(T.sched) != 0) return;
  if (f->started) _longjmp(f->jb, 1);
  f->started = 1;
#if defined(__x86_64__) && !defined(GPUCPU_UCONTEXT_ONLY)
  {  // start on the fiber's stack directly: setcontext would cost a syscall per thread
    long i = f - T.f;  // staggered tops: equal offsets would all map to one cache set
    char* top = T.stacks + (i + 1) * T.stack_sz - (i * 64 % 4096);
    asm volatile("mov %0, %%rsp\n\tcall *%1" : : "r"(top), "r"(entry) : "memory");
    __builtin_unreachable();
  }
#endif
  T.boot = T.tmpl;  // copying a getcontext template saves a syscall per fiber
  T.boot.uc_stack.ss_sp = T.stacks + (f - T.f) * T.stack_sz;
  T.boot.uc_stack.ss_size = T.stack_sz;
  T.boot.uc_link = nullptr;
  makecontext(&T.boot, entry, 0);
  setcontext(&T.boot);
}

// Each guard page splits the stacks' mapping, so a thread holding n fibers holds 2n kernel
// mappings; kept after a launch, they added up across the loaded libraries (one copy of T per
// library and OS thread) to Linux's 65,530-mapping limit within one test file. A launch frees
// them at its end.
inline void release_capacity() {
  if (T.stacks) munmap(T.stacks, T.stack_sz * T.cap);
  delete[] T.f;
  delete[] T.w;
  T.stacks = nullptr, T.f = nullptr, T.w = nullptr, T.cap = 0;
}

inline bool ensure_capacity(int n) {
  if (!T.have_tmpl) getcontext(&T.tmpl), T.have_tmpl = true;
  if (n <= T.cap) return true;
  size_t page = (size_t)sysconf(_SC_PAGESIZE);
  size_t sz = ((GPUCPU_STACK_BYTES + page - 1) / page + 1) * page;  // + a guard page
  release_capacity();
  void* m = mmap(nullptr, sz * n, PROT_READ | PROT_WRITE,
                 MAP_PRIVATE | MAP_ANONYMOUS | MAP_NORESERVE, -1, 0);
  if (m == MAP_FAILED) return false;  // release_capacity left T empty
  T.stacks = (char*)m;
  for (int i = 0; i < n; ++i) mprotect(T.stacks + i * sz, page, PROT_NONE);  // overflow faults
  T.stack_sz = sz;
  T.f = new Fiber[n];
  T.w = new Warp[(n + warpSize - 1) / warpSize];
  T.cap = n;
  return true;
}

// ---- barriers (called from fibers) -------------------------------------------------------------
inline void syncthreads(int line) {
  if (T.n_wait == 0) T.line = line;
  else if (T.line != line)
    fail("__syncthreads() on line " + std::to_string(line) + " while other threads wait at the one on line " +
         std::to_string(T.line) + " (divergent barrier)");
  T.n_wait++;
  cur->state = WAIT_BLOCK;
  cur->line = line;
  yield();
}
inline uint64_t warp_op(int op, unsigned long long mask, uint64_t v, int src, int line) {
  Warp& W = T.w[cur->warp];
  int l = cur->lane;
  if (!W.arrived) W.op = op, W.line = line, W.mask = mask;
  else if (W.op != op || W.mask != mask || (op != OP_SYNCWARP && W.line != line))
    fail(std::string(kOpNames[op]) + " on line " + std::to_string(line) + " while other lanes of its warp wait at " +
         kOpNames[W.op] + " on line " + std::to_string(W.line) + " (divergent warp operation or mask)");
  W.arrived |= 1ull << l;
  W.in[l] = v;
  W.src[l] = src;
  cur->state = WAIT_WARP;
  cur->op = op;
  cur->line = line;
  yield();
  return W.out[l];
}
template <class V>
inline V shfl(unsigned long long mask, V v, int src, int line) {
  static_assert(sizeof(V) <= 8 && std::is_trivially_copyable<V>::value, "shuffle of an unsupported type");
  uint64_t raw = 0;
  memcpy(&raw, &v, sizeof(V));
  raw = warp_op(OP_SHFL, mask, raw, src, line);
  memcpy(&v, &raw, sizeof(V));
  return v;
}
inline int src_idx(int l, int s, int w) { return (l & ~(w - 1)) + (s & (w - 1)); }
inline int src_xor(int l, int m, int w) { int s = l ^ m; return s >= ((l + w) & ~(w - 1)) ? l : s; }
inline int src_down(int l, int d, int w) { return (l & (w - 1)) + d >= w ? l : l + d; }
inline int src_up(int l, int d, int w) { return l - d < (l & ~(w - 1)) ? l : l - d; }
inline unsigned long long ballot(unsigned long long mask, int pred, int line) {
  warp_op(OP_VOTE, mask, pred != 0, -1, line);
  return T.w[cur->warp].ballot;
}

// ---- the per-block scheduler --------------------------------------------------------------------
inline bool release() {  // every live fiber waits: complete whichever barriers are full
  bool any = false;
  for (int w = 0; w < T.nw; ++w) {
    Warp& W = T.w[w];
    unsigned long long need = W.mask & W.exists;
    if (!W.arrived || (W.arrived & need) != need) continue;
    W.ballot = 0;
    for (int l = 0; l < warpSize; ++l)
      if ((W.arrived >> l) & 1 && W.in[l]) W.ballot |= 1ull << l;
    for (int l = 0; l < warpSize; ++l) {
      if (!((W.arrived >> l) & 1)) continue;
      int s = W.src[l];
      W.out[l] = (s >= 0 && s < warpSize && ((W.arrived >> s) & 1)) ? W.in[s] : W.in[l];
      T.f[w * warpSize + l].state = RUN;
    }
    W.arrived = 0;
    any = true;
  }
  if (T.n_wait == T.n) {  // then no lane waits at a warp operation
    for (int i = 0; i < T.n; ++i) T.f[i].state = RUN;
    T.n_wait = 0;
    any = true;
  }
  return any;
}
inline void diagnose() {
  std::string msg = "deadlock in block " + tid_str(t_block) + ":";
  const char* sep = " ";
  for (int i = 0; i < T.n; ++i) {  // group threads by where they are stuck
    const Fiber& a = T.f[i];
    bool seen = false;
    for (int j = 0; j < i && !seen; ++j)
      seen = T.f[j].state == a.state && (a.state == DONE || (T.f[j].line == a.line && T.f[j].op == a.op));
    if (seen) continue;
    int count = 0;
    for (int j = i; j < T.n; ++j)
      count += T.f[j].state == a.state && (a.state == DONE || (T.f[j].line == a.line && T.f[j].op == a.op));
    std::string what = a.state == DONE ? "have exited"
                       : a.state == WAIT_BLOCK ? "wait at __syncthreads() on line " + std::to_string(a.line)
                                               : std::string("wait at ") + kOpNames[a.op] + " on line " + std::to_string(a.line);
    msg += sep + std::to_string(count) + " thread(s) " + what + " (first: thread " + tid_str(a.tid) + ")";
    sep = "; ";
  }
  set_error(msg + ". Every thread of the block (or every lane in the mask) must reach the same barrier.");
}
inline void run_block(long b) {
  t_block = {unsigned(b % g_grid.x), unsigned(b / g_grid.x % g_grid.y), unsigned(b / g_grid.x / g_grid.y)};
  int n = int(g_block.x * g_block.y * g_block.z);
  if (!ensure_capacity(n)) return set_error("cannot allocate fiber stacks");
  T.n = n, T.nw = (n + warpSize - 1) / warpSize, T.n_done = 0, T.n_wait = 0, T.aborted = false;
  for (int i = 0; i < n; ++i) {
    Fiber& f = T.f[i];
    f.tid = {unsigned(i % g_block.x), unsigned(i / g_block.x % g_block.y), unsigned(i / g_block.x / g_block.y)};
    f.lane = i % warpSize, f.warp = i / warpSize, f.state = RUN, f.started = 0, f.line = 0, f.op = 0;
  }
  for (int w = 0; w < T.nw; ++w) {
    int lanes = n - w * warpSize < warpSize ? n - w * warpSize : warpSize;
    T.w[w].arrived = 0;
    T.w[w].exists = lanes == 64 ? ~0ull : (1ull << lanes) - 1;
  }
  for (;;) {
    for (int i = 0; i < n; ++i) {
      if (T.f[i].state != RUN) continue;
      resume(&T.f[i]);
      if (T.aborted) return;
    }
    if (T.n_done == n) return;
    if (!release()) return diagnose();
  }
}
inline int launch(Body body, void** args, const unsigned* d, unsigned long long shmem) {
  g_grid = dim3(d[0], d[1], d[2]), g_block = dim3(d[3], d[4], d[5]);
  g_body = body, g_args = args, g_failed = 0, g_err.clear();
  if (shmem > GPUCPU_DYN_SMEM_MAX) set_error("dynamic shared memory request exceeds GPUCPU_DYN_SMEM_MAX");
  long nb = long(g_grid.x) * g_grid.y * g_grid.z;
#pragma omp parallel
  {
#pragma omp for schedule(dynamic, 1)
    for (long b = 0; b < nb; ++b)
      if (!g_failed.load(std::memory_order_relaxed)) run_block(b);
    release_capacity();
  }
  return g_failed.load();
}

// Kernel parameter types are deduced, so the runner needs no C signature; it checks its
// arguments against the (kind, size) pairs reported here. Kinds: 1 pointer, 2 signed integer,
// 3 unsigned integer, 4 floating point, 5 anything else.
template <class P>
constexpr int kind() {
  return std::is_pointer<P>::value ? 1 : std::is_floating_point<P>::value ? 4
       : std::is_integral<P>::value ? (std::is_signed<P>::value ? 2 : 3) : 5;
}
template <class... P>
int signature(void (*)(P...), int* out, int max) {
  int kinds[] = {0, kind<std::decay_t<P>>()...}, sizes[] = {0, int(sizeof(std::decay_t<P>))...};
  for (int i = 0; i < int(sizeof...(P)) && 2 * i + 1 < max; ++i) out[2 * i] = kinds[i + 1], out[2 * i + 1] = sizes[i + 1];
  return int(sizeof...(P));
}
template <class... P, size_t... I>
void invoke_(void (*k)(P...), void** a, std::index_sequence<I...>) { k(*static_cast<std::decay_t<P>*>(a[I])...); }
template <class... P>
void invoke(void (*k)(P...), void** a) { invoke_(k, a, std::index_sequence_for<P...>{}); }
}  // namespace gpucpu

#define threadIdx (::gpucpu::cur->tid)
#define blockIdx (::gpucpu::t_block)
#define blockDim (::gpucpu::g_block)
#define gridDim (::gpucpu::g_grid)
#define hipThreadIdx_x (threadIdx.x)
#define hipThreadIdx_y (threadIdx.y)
#define hipThreadIdx_z (threadIdx.z)
#define hipBlockIdx_x (blockIdx.x)
#define hipBlockIdx_y (blockIdx.y)
#define hipBlockIdx_z (blockIdx.z)
#define hipBlockDim_x (blockDim.x)
#define hipBlockDim_y (blockDim.y)
#define hipBlockDim_z (blockDim.z)
#define hipGridDim_x (gridDim.x)
#define hipGridDim_y (gridDim.y)
#define hipGridDim_z (gridDim.z)

// ---- synchronisation and warp operations: CUDA *_sync forms and HIP mask-less forms ----------
// Functions, not macros, so arguments with braces or commas are fine; __builtin_LINE() names the
// call site in deadlock reports.
#define GPUCPU_LINE int line_ = __builtin_LINE()
#define GPUCPU_ALL (~0ull)
inline void __syncthreads(GPUCPU_LINE) { ::gpucpu::syncthreads(line_); }
inline void __syncwarp(unsigned long long m = GPUCPU_ALL, GPUCPU_LINE) { ::gpucpu::warp_op(::gpucpu::OP_SYNCWARP, m, 0, -1, line_); }
#define GPUCPU_SHFL(name, srcfn)                                                                   \
  template <class V> inline V name##_sync(unsigned long long m, V v, int s, int w = warpSize, GPUCPU_LINE) { \
    return ::gpucpu::shfl(m, v, ::gpucpu::srcfn(::gpucpu::cur->lane, s, w), line_);               \
  }                                                                                                \
  template <class V> inline V name(V v, int s, int w = warpSize, GPUCPU_LINE) {                     \
    return ::gpucpu::shfl(GPUCPU_ALL, v, ::gpucpu::srcfn(::gpucpu::cur->lane, s, w), line_);      \
  }
GPUCPU_SHFL(__shfl, src_idx)
GPUCPU_SHFL(__shfl_xor, src_xor)
GPUCPU_SHFL(__shfl_down, src_down)
GPUCPU_SHFL(__shfl_up, src_up)
inline unsigned __ballot_sync(unsigned long long m, int p, GPUCPU_LINE) { return unsigned(::gpucpu::ballot(m, p, line_)); }
inline int __any_sync(unsigned long long m, int p, GPUCPU_LINE) { return ::gpucpu::ballot(m, p, line_) != 0; }
inline int __all_sync(unsigned long long m, int p, GPUCPU_LINE) {
  return ::gpucpu::ballot(m, p, line_) == (m & ::gpucpu::T.w[::gpucpu::cur->warp].exists);
}
inline unsigned long long __ballot(int p, GPUCPU_LINE) { return ::gpucpu::ballot(GPUCPU_ALL, p, line_); }
inline int __any(int p, GPUCPU_LINE) { return __any_sync(GPUCPU_ALL, p, line_); }
inline int __all(int p, GPUCPU_LINE) { return __all_sync(GPUCPU_ALL, p, line_); }
inline unsigned long long __activemask() { return ::gpucpu::T.w[::gpucpu::cur->warp].exists; }
inline int __lane_id() { return ::gpucpu::cur->lane; }
inline void __threadfence() { __atomic_thread_fence(__ATOMIC_SEQ_CST); }
inline void __threadfence_block() { asm volatile("" ::: "memory"); }
[[noreturn]] inline void __trap() { ::gpucpu::fail("__trap() called"); }
template <class V> inline V __ldg(const V* p) { return *p; }
template <class V> inline V __ldca(const V* p) { return *p; }
template <class V> inline V __ldcs(const V* p) { return *p; }
template <class V> inline void __stcs(V* p, V v) { *p = v; }

// ---- atomics: blocks run on different OS threads ------------------------------------------------
#define GPUCPU_SC __ATOMIC_SEQ_CST
template <class V> inline V atomicAdd(V* p, V v) {
  if constexpr (std::is_integral<V>::value) {
    return __atomic_fetch_add(p, v, GPUCPU_SC);
  } else {
    V old, nv;
    __atomic_load(p, &old, __ATOMIC_RELAXED);
    do nv = old + v; while (!__atomic_compare_exchange(p, &old, &nv, false, GPUCPU_SC, __ATOMIC_RELAXED));
    return old;
  }
}
template <class V> inline V atomicSub(V* p, V v) { return __atomic_fetch_sub(p, v, GPUCPU_SC); }
template <class V> inline V atomicAnd(V* p, V v) { return __atomic_fetch_and(p, v, GPUCPU_SC); }
template <class V> inline V atomicOr(V* p, V v) { return __atomic_fetch_or(p, v, GPUCPU_SC); }
template <class V> inline V atomicXor(V* p, V v) { return __atomic_fetch_xor(p, v, GPUCPU_SC); }
template <class V> inline V atomicExch(V* p, V v) { V old; __atomic_exchange(p, &v, &old, GPUCPU_SC); return old; }
template <class V> inline V atomicCAS(V* p, V cmp, V v) {
  __atomic_compare_exchange(p, &cmp, &v, false, GPUCPU_SC, GPUCPU_SC);
  return cmp;
}
template <class V> inline V atomicMax(V* p, V v) {
  V old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (old < v && !__atomic_compare_exchange(p, &old, &v, false, GPUCPU_SC, __ATOMIC_RELAXED)) {}
  return old;
}
template <class V> inline V atomicMin(V* p, V v) {
  V old = __atomic_load_n(p, __ATOMIC_RELAXED);
  while (v < old && !__atomic_compare_exchange(p, &old, &v, false, GPUCPU_SC, __ATOMIC_RELAXED)) {}
  return old;
}

// ---- math: <math.h> has the standard float functions; these are the CUDA extras ---------------
template <class A, class B, class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> min(A a, B b) { return b < a ? b : a; }
template <class A, class B, class = std::enable_if_t<std::is_arithmetic<A>::value && std::is_arithmetic<B>::value>>
inline std::common_type_t<A, B> max(A a, B b) { return a < b ? b : a; }
inline float rsqrtf(float x) { return 1.0f / sqrtf(x); }
inline double rsqrt(double x) { return 1.0 / sqrt(x); }
inline float rcbrtf(float x) { return 1.0f / cbrtf(x); }
inline float __expf(float x) { return expf(x); }
inline float __exp10f(float x) { return exp10f(x); }
inline float __logf(float x) { return logf(x); }
inline float __log2f(float x) { return log2f(x); }
inline float __log10f(float x) { return log10f(x); }
inline float __powf(float x, float y) { return powf(x, y); }
inline float __sinf(float x) { return sinf(x); }
inline float __cosf(float x) { return cosf(x); }
inline float __tanf(float x) { return tanf(x); }
inline void __sincosf(float x, float* s, float* c) { sincosf(x, s, c); }
inline float __fdividef(float x, float y) { return x / y; }
inline float fdividef(float x, float y) { return x / y; }
inline float __frcp_rn(float x) { return 1.0f / x; }
inline float __fsqrt_rn(float x) { return sqrtf(x); }
inline float __fadd_rn(float x, float y) { return x + y; }
inline float __fsub_rn(float x, float y) { return x - y; }
inline float __fmul_rn(float x, float y) { return x * y; }
inline float __fdiv_rn(float x, float y) { return x / y; }
inline float __fmaf_rn(float x, float y, float z) { return fmaf(x, y, z); }
inline float __saturatef(float x) { return x < 0.0f ? 0.0f : x > 1.0f ? 1.0f : x; }
inline float normcdff(float x) { return 0.5f * erfcf(-x * 0.70710678118654752f); }
namespace gpucpu {
template <class To, class From> inline To bits(From v) { static_assert(sizeof(To) == sizeof(From)); To t; memcpy(&t, &v, sizeof t); return t; }
}
inline float __int_as_float(int v) { return ::gpucpu::bits<float>(v); }
inline float __uint_as_float(unsigned v) { return ::gpucpu::bits<float>(v); }
inline int __float_as_int(float v) { return ::gpucpu::bits<int>(v); }
inline unsigned __float_as_uint(float v) { return ::gpucpu::bits<unsigned>(v); }
inline double __longlong_as_double(long long v) { return ::gpucpu::bits<double>(v); }
inline long long __double_as_longlong(double v) { return ::gpucpu::bits<long long>(v); }
inline int __float2int_rn(float x) { return int(nearbyintf(x)); }
inline int __float2int_rz(float x) { return int(x); }
inline int __float2int_rd(float x) { return int(floorf(x)); }
inline int __float2int_ru(float x) { return int(ceilf(x)); }
inline unsigned __float2uint_rn(float x) { return unsigned(nearbyintf(x)); }
inline float __int2float_rn(int x) { return float(x); }
inline int __popc(unsigned x) { return __builtin_popcount(x); }
inline int __popcll(unsigned long long x) { return __builtin_popcountll(x); }
inline int __clz(int x) { return x ? __builtin_clz(unsigned(x)) : 32; }
inline int __clzll(long long x) { return x ? __builtin_clzll((unsigned long long)x) : 64; }
inline int __ffs(int x) { return __builtin_ffs(x); }
inline int __ffsll(long long x) { return __builtin_ffsll(x); }
inline int __mul24(int x, int y) { return x * y; }
inline unsigned __umul24(unsigned x, unsigned y) { return x * y; }
inline int __mulhi(int x, int y) { return int((long long)x * y >> 32); }
inline unsigned __umulhi(unsigned x, unsigned y) { return unsigned((unsigned long long)x * y >> 32); }

// ---- vector types (CUDA alignment: 2- and 4-vectors up to 16 bytes, 3-vectors unaligned) -------
#define GPUCPU_VA(T, n) __attribute__((aligned(n * sizeof(T) > 16 ? 16 : n * sizeof(T))))
#define GPUCPU_VEC24(T, N)                                                                           \
  struct GPUCPU_VA(T, 2) N##2 { T x, y; };                                                          \
  struct GPUCPU_VA(T, 4) N##4 { T x, y, z, w; };                                                    \
  inline N##2 make_##N##2(T x, T y) { return {x, y}; }                                              \
  inline N##4 make_##N##4(T x, T y, T z, T w) { return {x, y, z, w}; }
#define GPUCPU_VEC3(T, N)               \
  struct N##3 { T x, y, z; };           \
  inline N##3 make_##N##3(T x, T y, T z) { return {x, y, z}; }
#define GPUCPU_VEC(T, N) GPUCPU_VEC24(T, N) GPUCPU_VEC3(T, N)
GPUCPU_VEC(float, float) GPUCPU_VEC(double, double) GPUCPU_VEC(int, int) GPUCPU_VEC(signed char, char)
GPUCPU_VEC(unsigned char, uchar) GPUCPU_VEC(short, short) GPUCPU_VEC(unsigned short, ushort)
GPUCPU_VEC(long long, longlong) GPUCPU_VEC(unsigned long long, ulonglong) GPUCPU_VEC24(unsigned, uint)
inline uint3 make_uint3(unsigned x, unsigned y, unsigned z) { return {x, y, z}; }

// ---- fp16 storage: conversions round to nearest even (F. Giesen's public-domain routines) ------
namespace gpucpu {
inline unsigned short f2h(float f) {
  uint32_t u = bits<uint32_t>(f), sign = u & 0x80000000u, o;
  u ^= sign;
  if (u >= 0x47800000u) {  // >= 65536: inf, or nan (kept quiet)
    o = u > 0x7f800000u ? 0x7e00u : 0x7c00u;
  } else if (u < 0x38800000u) {  // subnormal half or zero: let float addition round
    float magic = bits<float>(uint32_t(126u << 23)), g = bits<float>(u) + magic;
    o = bits<uint32_t>(g) - bits<uint32_t>(magic);
  } else {
    uint32_t odd = (u >> 13) & 1u;
    u += (uint32_t(15 - 127) << 23) + 0xfffu + odd;
    o = u >> 13;
  }
  return (unsigned short)(o | (sign >> 16));
}
inline float h2f(unsigned short h) {
  uint32_t o = (uint32_t(h) & 0x7fffu) << 13, exp = o & (0x7c00u << 13);
  o += uint32_t(127 - 15) << 23;
  if (exp == 0x7c00u << 13) o += uint32_t(128 - 16) << 23;  // inf, nan
  else if (exp == 0) o = bits<uint32_t>(bits<float>(o + (1u << 23)) - bits<float>(uint32_t(113u << 23)));
  return bits<float>(o | (uint32_t(h) & 0x8000u) << 16);
}
}  // namespace gpucpu
struct __half {
  unsigned short __x;
  __half() = default;
  __half(float f) : __x(::gpucpu::f2h(f)) {}
  __half(double f) : __x(::gpucpu::f2h(float(f))) {}
  __half(int i) : __x(::gpucpu::f2h(float(i))) {}
  __half(unsigned i) : __x(::gpucpu::f2h(float(i))) {}
  __half(long long i) : __x(::gpucpu::f2h(float(i))) {}
  operator float() const { return ::gpucpu::h2f(__x); }
};
struct __align__(4) __half2 { __half x, y; };
typedef __half half;
typedef __half2 half2;
inline float __half2float(__half h) { return float(h); }
inline __half __float2half(float f) { return __half(f); }
inline __half __float2half_rn(float f) { return __half(f); }
inline __half __int2half_rn(int i) { return __half(i); }
inline int __half2int_rn(__half h) { return int(nearbyintf(float(h))); }
inline unsigned short __half_as_ushort(__half h) { return h.__x; }
inline short __half_as_short(__half h) { return short(h.__x); }
inline __half __ushort_as_half(unsigned short u) { __half h; h.__x = u; return h; }
inline __half __short_as_half(short u) { return __ushort_as_half((unsigned short)u); }
#define GPUCPU_HOP(op)                                                                          \
  inline __half operator op(__half a, __half b) { return __half(float(a) op float(b)); }        \
  inline __half& operator op##=(__half& a, __half b) { return a = a op b; }
GPUCPU_HOP(+) GPUCPU_HOP(-) GPUCPU_HOP(*) GPUCPU_HOP(/)
#define GPUCPU_HCMP(op) inline bool operator op(__half a, __half b) { return float(a) op float(b); }
GPUCPU_HCMP(==) GPUCPU_HCMP(!=) GPUCPU_HCMP(<) GPUCPU_HCMP(>) GPUCPU_HCMP(<=) GPUCPU_HCMP(>=)
inline __half operator-(__half a) { a.__x ^= 0x8000; return a; }
inline __half operator+(__half a) { return a; }
inline __half __hadd(__half a, __half b) { return a + b; }
inline __half __hsub(__half a, __half b) { return a - b; }
inline __half __hmul(__half a, __half b) { return a * b; }
inline __half __hdiv(__half a, __half b) { return a / b; }
inline __half __hfma(__half a, __half b, __half c) { return __half(fmaf(float(a), float(b), float(c))); }
inline __half __hneg(__half a) { return -a; }
inline __half __habs(__half a) { a.__x &= 0x7fff; return a; }
inline __half __hmax(__half a, __half b) { return __half(fmaxf(float(a), float(b))); }
inline __half __hmin(__half a, __half b) { return __half(fminf(float(a), float(b))); }
inline bool __heq(__half a, __half b) { return a == b; }
inline bool __hlt(__half a, __half b) { return a < b; }
inline bool __hgt(__half a, __half b) { return a > b; }
inline bool __hisnan(__half a) { return (a.__x & 0x7fff) > 0x7c00; }
inline bool __hisinf(__half a) { return (a.__x & 0x7fff) == 0x7c00; }
inline __half hexp(__half a) { return __half(expf(float(a))); }
inline __half hlog(__half a) { return __half(logf(float(a))); }
inline __half hsqrt(__half a) { return __half(sqrtf(float(a))); }
inline __half hrsqrt(__half a) { return __half(rsqrtf(float(a))); }
inline __half2 __halves2half2(__half a, __half b) { return {a, b}; }
inline __half2 __floats2half2_rn(float a, float b) { return {__half(a), __half(b)}; }
inline __half2 __float2half2_rn(float a) { return {__half(a), __half(a)}; }
inline __half2 __float22half2_rn(float2 f) { return {__half(f.x), __half(f.y)}; }
inline float2 __half22float2(__half2 h) { return {float(h.x), float(h.y)}; }
inline float __low2float(__half2 h) { return float(h.x); }
inline float __high2float(__half2 h) { return float(h.y); }
inline __half __low2half(__half2 h) { return h.x; }
inline __half __high2half(__half2 h) { return h.y; }
inline __half2 __hadd2(__half2 a, __half2 b) { return {a.x + b.x, a.y + b.y}; }
inline __half2 __hmul2(__half2 a, __half2 b) { return {a.x * b.x, a.y * b.y}; }
inline __half2 __hfma2(__half2 a, __half2 b, __half2 c) { return {__hfma(a.x, b.x, c.x), __hfma(a.y, b.y, c.y)}; }

// ---- bf16 storage (cuda_bf16.h's __nv_bfloat16): the top 16 bits of a float, rounded to nearest
// even, NaN kept quiet with its sign --------------------------------------------------------------
namespace gpucpu {
inline unsigned short f2bf(float f) {
  uint32_t u = bits<uint32_t>(f);
  if ((u & 0x7fffffffu) > 0x7f800000u) return (unsigned short)((u >> 16) | 0x40u);
  return (unsigned short)((u + 0x7fffu + ((u >> 16) & 1u)) >> 16);
}
inline float bf2f(unsigned short h) { return bits<float>(uint32_t(h) << 16); }
}  // namespace gpucpu
struct __nv_bfloat16 {
  unsigned short __x;
  __nv_bfloat16() = default;
  __nv_bfloat16(float f) : __x(::gpucpu::f2bf(f)) {}
  __nv_bfloat16(double f) : __x(::gpucpu::f2bf(float(f))) {}
  __nv_bfloat16(int i) : __x(::gpucpu::f2bf(float(i))) {}
  operator float() const { return ::gpucpu::bf2f(__x); }
};
typedef __nv_bfloat16 nv_bfloat16;
inline float __bfloat162float(__nv_bfloat16 h) { return float(h); }
inline __nv_bfloat16 __float2bfloat16(float f) { return __nv_bfloat16(f); }
inline __nv_bfloat16 __float2bfloat16_rn(float f) { return __nv_bfloat16(f); }
inline unsigned short __bfloat16_as_ushort(__nv_bfloat16 h) { return h.__x; }
inline __nv_bfloat16 __ushort_as_bfloat16(unsigned short u) { __nv_bfloat16 h; h.__x = u; return h; }
