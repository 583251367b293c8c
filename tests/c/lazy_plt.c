/* Calls many distinct libm functions through the PLT in a hot loop. Run with LD_BIND_NOT=1
 * (and linked -z lazy) every call goes through ld.so's lazy-binding stub and symbol lookup,
 * so most samples land in the loader, below its stub: a stack walk that cannot get through
 * the stub (its CFA is defined from rbx) loses main.
 * Usage: lazy_plt PASSES. Prints "sum S" (fixed by PASSES) and "ok". */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

/* One pass over 24 libm functions; the result depends only on the pass number. */
static double __attribute__((noinline)) pass(volatile double x) {
    double s = 0;
    s += sin(x) + cos(x) + tan(x) + asin(x) + acos(x) + atan(x);
    s += sinh(x) + cosh(x) + tanh(x) + asinh(x) + exp(x) + log1p(x);
    s += exp2(x) + expm1(x) + log(x + 1) + log2(x + 1) + log10(x + 1) + cbrt(x);
    s += sqrt(x) + erf(x) + erfc(x) + tgamma(x + 1) + lgamma(x + 1) + atan2(x, 1);
    return s;
}

int main(int argc, char **argv) {
    long passes = argc > 1 ? atol(argv[1]) : 100000;
    double sum = 0;
    for (long p = 0; p < passes; p++)
        sum += pass((p % 1000) / 1000.0);
    printf("sum %.6f\nok\n", sum);
    return 0;
}
