//! The distributions behind `diff`'s intervals and tests: Wilson's score interval, the normal
//! and Student's t tails and quantiles (from glibc's libm `erfc` and `lgamma_r`, which std
//! already links, and a continued fraction for the incomplete beta function).

/// `x` of `n` as a proportion in [0, 1]; 0 of nothing.
pub fn ratio(x: f64, n: f64) -> f64 {
    if n > 0.0 {
        (x / n).clamp(0.0, 1.0)
    } else {
        0.0
    }
}

/// Wilson's score interval for a proportion `p` of `n` observations, `z` standard errors wide.
pub fn wilson(p: f64, n: f64, z: f64) -> (f64, f64) {
    if n <= 0.0 {
        return (0.0, 1.0);
    }
    let z2n = z * z / n;
    let centre = (p + z2n / 2.0) / (1.0 + z2n);
    let half = z / (1.0 + z2n) * (p * (1.0 - p) / n + z2n / (4.0 * n)).sqrt();
    ((centre - half).max(0.0), (centre + half).min(1.0))
}

mod libm {
    extern "C" {
        pub fn erfc(x: f64) -> f64;
        pub fn lgamma_r(x: f64, sign: *mut i32) -> f64;
    }
}

/// P(|Z| >= |z|) for a standard normal Z.
pub fn two_sided_normal(z: f64) -> f64 {
    // SAFETY: a pure function of its argument (glibc's libm, which std links).
    unsafe { libm::erfc(z.abs() / std::f64::consts::SQRT_2) }
}

/// P(|T| >= |t|) for Student's t with `df` degrees of freedom.
pub fn two_sided_t(t: f64, df: f64) -> f64 {
    incomplete_beta(df / (df + t * t), df / 2.0, 0.5)
}

/// The z with `two_sided_normal(z) == p`.
pub fn normal_quantile(p: f64) -> f64 {
    invert(two_sided_normal, p)
}

pub fn t_quantile(p: f64, df: f64) -> f64 {
    invert(|t| two_sided_t(t, df), p)
}

/// The x >= 0 where the decreasing `tail` falls to `p`, by bisection.
fn invert(tail: impl Fn(f64) -> f64, p: f64) -> f64 {
    let (mut low, mut high) = (0.0, 1.0);
    while tail(high) > p && high < 1e6 {
        high *= 2.0;
    }
    for _ in 0..200 {
        let mid = (low + high) / 2.0;
        if tail(mid) > p {
            low = mid;
        } else {
            high = mid;
        }
    }
    (low + high) / 2.0
}

fn ln_gamma(x: f64) -> f64 {
    let mut sign = 0;
    // SAFETY: a pure function; the sign goes to a local instead of the global `signgam`.
    unsafe { libm::lgamma_r(x, &mut sign) }
}

/// The regularised incomplete beta function I_x(a, b), by its continued fraction (evaluated with
/// Lentz's method), on the side of the mean where it converges fast.
fn incomplete_beta(x: f64, a: f64, b: f64) -> f64 {
    if x <= 0.0 {
        return 0.0;
    }
    if x >= 1.0 {
        return 1.0;
    }
    let log_front = a * x.ln() + b * (1.0 - x).ln() + ln_gamma(a + b) - ln_gamma(a) - ln_gamma(b);
    if x < (a + 1.0) / (a + b + 2.0) {
        log_front.exp() * beta_fraction(x, a, b) / a
    } else {
        1.0 - log_front.exp() * beta_fraction(1.0 - x, b, a) / b
    }
}

fn beta_fraction(x: f64, a: f64, b: f64) -> f64 {
    const TINY: f64 = 1e-300;
    let guard = |v: f64| if v.abs() < TINY { TINY } else { v };
    let mut c = 1.0;
    let mut d = 1.0 / guard(1.0 - (a + b) * x / (a + 1.0));
    let mut h = d;
    for m in 1..1000 {
        let m = m as f64;
        let even = m * (b - m) * x / ((a + 2.0 * m - 1.0) * (a + 2.0 * m));
        d = 1.0 / guard(1.0 + even * d);
        c = guard(1.0 + even / c);
        h *= d * c;
        let odd = -(a + m) * (a + b + m) * x / ((a + 2.0 * m) * (a + 2.0 * m + 1.0));
        d = 1.0 / guard(1.0 + odd * d);
        c = guard(1.0 + odd / c);
        let step = d * c;
        h *= step;
        if (step - 1.0).abs() < 1e-15 {
            break;
        }
    }
    h
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_distributions_match_known_values() {
        assert!((two_sided_normal(1.959964) - 0.05).abs() < 1e-6);
        assert!((two_sided_normal(4.0) - 6.334e-5).abs() < 1e-8);
        assert!((normal_quantile(0.05) - 1.959964).abs() < 1e-5);
        // t with 4 degrees of freedom: 2.776445 at 5 %; with 1 (Cauchy): P(|T| >= 1) = 1/2.
        assert!((two_sided_t(2.776445, 4.0) - 0.05).abs() < 1e-6);
        assert!((two_sided_t(1.0, 1.0) - 0.5).abs() < 1e-9);
        assert!((t_quantile(0.05, 4.0) - 2.776445).abs() < 1e-5);
        // Wilson for 0 of 10 at 95 %: [0, 0.2775].
        let (low, high) = wilson(0.0, 10.0, 1.959964);
        assert!(low == 0.0 && (high - 0.27753).abs() < 1e-4, "{high}");
    }
}
