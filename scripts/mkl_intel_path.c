/* Makes MKL take the code path it takes on an Intel CPU, on any x86 CPU (LD_PRELOAD=the built .so).
 *
 * MKL (linked into torch's CPU build) asks these two functions whether the CPU is Intel's, and on any other vendor
 * takes other kernels. Float32 results then round differently on an Intel CPU than on an AMD one: a parity case can
 * pass on one and fail on the other. scripts/test_mkl_paths.sh preloads this
 * library so a machine of either vendor runs the parity tests on both paths. It changes which kernels MKL picks,
 * never what they compute: every path computes the same float32 products in another order.
 */
int mkl_serv_intel_cpu_true(void) { return 1; }
int mkl_serv_intel_cpu(void) { return 1; }
