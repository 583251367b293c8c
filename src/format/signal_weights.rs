//! How many independent looks at the stacks a profile's samples stand for, recorded after the
//! maps text:
//!
//! ```text
//! # signal-weights 4213 16850 70114
//! ```
//!
//! (signals, the sum of their weights, the sum of their weights' squares). A sample is one look
//! at a stack, but it may count for several periods: the default timer fires on the kernel tick
//! and weighs each signal by the periods it covers (`1 + si_overrun`), and a thread that exits
//! settles what it was owed as one weighted sample. So 1,000 samples at 1000 Hz are ~250 looks
//! on a quiet machine and fewer on a busy one, where a thread sees fewer ticks than its CPU time
//! spans. What statistics on shares need is the effective number of observations of a weighted
//! sample, `(sum w)^2 / sum w^2` (Kish's), which this line gives exactly, whatever the timer and
//! the load. `diff` uses it; files without it (gperftools', cut short) fall back to a model.
//!
//! The spelling follows the build-id lines' rules (see [`super::build_id`]): it starts with `#`
//! and holds no `=` or `]`, so google-pprof and go tool pprof skip it.
//!
//! This module is pure code.

const PREFIX: &str = "# signal-weights ";

/// The longest line: the prefix, three 20-digit numbers, two spaces and the newline.
pub const LINE_BYTES: usize = PREFIX.len() + 3 * 20 + 3;

/// The signals behind a profile's samples and their weights.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct SignalWeights {
    /// Signals that took a sample: the looks at the stacks.
    pub signals: u64,
    /// Sum of the weights: the samples the signals stand for.
    pub sum: u64,
    /// Sum of the weights' squares.
    pub sum_of_squares: u64,
}

impl SignalWeights {
    /// The effective number of independent observations, `(sum w)^2 / sum w^2`: the number of
    /// equally weighted looks that would give shares the same sampling error. `None` without
    /// signals.
    pub fn effective_observations(&self) -> Option<f64> {
        (self.sum_of_squares > 0).then(|| (self.sum as f64).powi(2) / self.sum_of_squares as f64)
    }

    /// The weights of two profiles read as one (`merge`).
    pub fn combined(self, other: SignalWeights) -> SignalWeights {
        SignalWeights {
            signals: self.signals.saturating_add(other.signals),
            sum: self.sum.saturating_add(other.sum),
            sum_of_squares: self.sum_of_squares.saturating_add(other.sum_of_squares),
        }
    }

    /// The line recording these weights (newline included), to append to a profile's maps
    /// text.
    pub fn line(&self) -> String {
        let mut line = [0; LINE_BYTES];
        let n = self.write_line(&mut line);
        String::from_utf8_lossy(&line[..n]).into_owned()
    }

    /// [`line`](Self::line) into `out` without allocating, for a profile completed in a signal
    /// handler; returns its length. Async-signal-safe.
    pub fn write_line(&self, out: &mut [u8; LINE_BYTES]) -> usize {
        let mut n = 0;
        let mut put = |bytes: &[u8]| {
            out[n..n + bytes.len()].copy_from_slice(bytes);
            n += bytes.len();
        };
        put(PREFIX.as_bytes());
        for (i, value) in [self.signals, self.sum, self.sum_of_squares].into_iter().enumerate() {
            if i > 0 {
                put(b" ");
            }
            let mut digits = [0u8; 20];
            let mut at = digits.len();
            let mut v = value;
            loop {
                at -= 1;
                digits[at] = b'0' + (v % 10) as u8;
                v /= 10;
                if v == 0 {
                    break;
                }
            }
            put(&digits[at..]);
        }
        put(b"\n");
        n
    }

    /// The weights a `# signal-weights` line records; `None` for any other line or one whose
    /// numbers cannot be weights (a sum of squares below the sum, more signals than weight).
    pub fn parse_line(line: &str) -> Option<SignalWeights> {
        let mut fields = line.trim_start().strip_prefix(PREFIX)?.split_whitespace();
        let mut number = || fields.next()?.parse::<u64>().ok();
        let weights = SignalWeights {
            signals: number()?,
            sum: number()?,
            sum_of_squares: number()?,
        };
        let possible = weights.signals <= weights.sum && weights.sum <= weights.sum_of_squares;
        (possible && fields.next().is_none()).then_some(weights)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_round_trips_and_nonsense_is_refused() {
        let w = SignalWeights {
            signals: 250,
            sum: 1000,
            sum_of_squares: 4000,
        };
        assert_eq!(SignalWeights::parse_line(&w.line()), Some(w));
        assert_eq!(w.line(), "# signal-weights 250 1000 4000\n");
        let widest = SignalWeights {
            signals: u64::MAX,
            sum: u64::MAX,
            sum_of_squares: u64::MAX,
        };
        assert_eq!(widest.line().len(), LINE_BYTES);
        assert_eq!(w.effective_observations(), Some(250.0));
        for bad in [
            "# signal-weights 1 2",
            "# signal-weights 1 2 3 4",
            "# signal-weights 5 2 9",
            "# signal-weights 1 9 3",
            "# signal-weights -1 2 3",
            "# build-id 1000-2000 abcd",
        ] {
            assert_eq!(SignalWeights::parse_line(bad), None, "{bad}");
        }
    }

    #[test]
    fn uneven_weights_are_fewer_observations() {
        // Four signals of weight 1 and one of weight 96: 100 samples, barely two looks' worth.
        let w = SignalWeights {
            signals: 5,
            sum: 100,
            sum_of_squares: 4 + 96 * 96,
        };
        let n = w.effective_observations().unwrap();
        assert!((1.0..1.1).contains(&n), "{n}");
        // Equal weights: as many observations as signals.
        let even = SignalWeights {
            signals: 300,
            sum: 1200,
            sum_of_squares: 4800,
        };
        assert_eq!(even.effective_observations(), Some(300.0));
        assert_eq!(SignalWeights::default().effective_observations(), None);
    }
}
