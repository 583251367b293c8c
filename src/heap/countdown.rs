//! Which allocations are sampled: a per-thread countdown of bytes, drawn from an exponential
//! distribution of mean `period`, as tcmalloc and Go do. An allocation that takes the
//! countdown below zero is sampled and a new countdown is drawn, so the bytes between samples
//! form a Poisson process: an allocation of `s` bytes is sampled with probability
//! `1 - exp(-s/period)` whatever came before it, which is what readers scale back by
//! (`format::heap::unsample`). Not periodic: a loop allocating the same sizes is not sampled
//! at the same place every time.

/// One thread's countdown. Plain data, zero-initialised: it lives in the thread's TLS (an
/// initial-exec C variable in the preloaded library, a `const` thread-local for the Rust
/// wrapper), where nothing is allocated or registered on first use.
#[repr(C)]
#[derive(Clone, Copy, Debug, Default)]
pub struct Countdown {
    /// Bytes left before the next sample; at or below zero, the next allocation is sampled
    /// (or the countdown is drawn for the first time, see `seeded`).
    pub left: i64,
    /// xorshift state; 0 until the thread's first draw.
    pub rng: u64,
    /// Non-zero while this thread is inside the recorder: an allocation it makes meanwhile
    /// (none is expected, but a program's hook might) is passed through unsampled.
    pub busy: u32,
}

impl Countdown {
    /// Counts an allocation of `size` bytes: whether it is the one to sample. The common
    /// answer is a subtraction and a compare.
    #[inline(always)]
    pub fn take(&mut self, size: usize) -> bool {
        self.left -= size as i64;
        self.left < 0
    }

    /// After [`Countdown::take`] said yes: whether to record it (not on the thread's first
    /// allocation, which only draws the first countdown — it is not yet part of the process),
    /// and the next countdown drawn.
    pub fn rearm(&mut self, period: u64, seed: u64) -> bool {
        let first = self.rng == 0;
        if first {
            self.rng = seed | 1;
        }
        self.left = self.draw(period);
        !first
    }

    /// A draw from the exponential distribution of mean `period` (at least 1).
    fn draw(&mut self, period: u64) -> i64 {
        // xorshift64*: the state never becomes 0.
        self.rng ^= self.rng >> 12;
        self.rng ^= self.rng << 25;
        self.rng ^= self.rng >> 27;
        let bits = self.rng.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 11;
        // Uniform in (0, 1]: never log(0).
        let u = (bits + 1) as f64 / (1u64 << 53) as f64;
        let bytes = -u.ln() * period.max(1) as f64;
        bytes.min(i64::MAX as f64 / 2.0) as i64 + 1
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Sampled sizes follow 1 - exp(-s/N): for N = 1000, a stream of 100-byte allocations is
    /// sampled once per ~10.5 allocations, and 5000-byte ones nearly always.
    #[test]
    fn samples_as_a_poisson_process() {
        for (size, expect) in [(100usize, 1.0 - (-0.1f64).exp()), (5000, 1.0 - (-5.0f64).exp())] {
            let mut c = Countdown::default();
            let (mut sampled, n) = (0u32, 200_000u32);
            for _ in 0..n {
                if c.take(size) && c.rearm(1000, 0x1234_5678) {
                    sampled += 1;
                }
            }
            let share = f64::from(sampled) / f64::from(n);
            assert!(
                (share - expect).abs() < 0.01 * expect.max(0.1),
                "{size}: {share} vs {expect}"
            );
        }
    }

    #[test]
    fn first_allocation_only_draws() {
        let mut c = Countdown::default();
        assert!(c.take(1));
        assert!(!c.rearm(512 * 1024, 7));
        assert!(c.left > 0);
    }
}
