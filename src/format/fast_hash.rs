//! A fast hash for the keys profile readers intern: addresses and call chains of addresses.
//!
//! std's default (SipHash-1-3) costs about as much per record as all the rest of reading a
//! profile did: a chain of ten addresses is 80 bytes through a cryptographic round function.
//! This hasher takes a word per multiply (the rotate-xor-multiply step of Firefox's and
//! rustc's "Fx" hash), several times faster on such keys.
//!
//! Profiles are input like any other, and a multiplicative hash with a fixed start is easy to
//! collide on purpose: chains that all fall into one bucket would make interning quadratic.
//! So each [`FastHash`] starts from a seed drawn from std's per-process random keys, and
//! `finish` mixes the high bits (which the multiply spreads well) into the low bits the hash
//! table indexes by.

use std::collections::hash_map::RandomState;
use std::hash::{BuildHasher, Hasher};

/// An odd constant with bits spread across the word (2^64 divided by the golden ratio), so
/// a multiply carries every input bit into the high half.
const MULTIPLIER: u64 = 0x9e37_79b9_7f4a_7c15;

/// Builds [`FastHasher`]s with this table's random seed: the `S` of a
/// `HashMap<Vec<u64>, V, FastHash>` keyed by addresses or call chains. Each
/// `FastHash::default()` draws a new seed.
#[derive(Clone, Copy, Debug)]
pub struct FastHash {
    seed: u64,
}

impl Default for FastHash {
    fn default() -> Self {
        FastHash {
            seed: RandomState::new().build_hasher().finish(),
        }
    }
}

impl BuildHasher for FastHash {
    type Hasher = FastHasher;

    fn build_hasher(&self) -> FastHasher {
        FastHasher { state: self.seed }
    }
}

/// The hasher a [`FastHash`] builds: a word-at-a-time multiplicative hash for integer keys
/// (see the module documentation for what it is good for, and what not).
#[derive(Clone, Copy, Debug)]
pub struct FastHasher {
    state: u64,
}

impl FastHasher {
    #[inline]
    fn add(&mut self, word: u64) {
        self.state = (self.state.rotate_left(5) ^ word).wrapping_mul(MULTIPLIER);
    }
}

impl Hasher for FastHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        // A slice of integers arrives here as one byte slice (`Hash for [u64]`).
        let mut words = bytes.chunks_exact(8);
        for w in &mut words {
            self.add(u64::from_le_bytes(w.try_into().unwrap()));
        }
        let rest = words.remainder();
        if !rest.is_empty() {
            let mut last = [0u8; 8];
            last[..rest.len()].copy_from_slice(rest);
            // The length keeps "ab" and "ab\0" apart.
            self.add(u64::from_le_bytes(last) ^ ((rest.len() as u64) << 59));
        }
    }

    #[inline]
    fn write_u8(&mut self, n: u8) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u32(&mut self, n: u32) {
        self.add(u64::from(n));
    }

    #[inline]
    fn write_u64(&mut self, n: u64) {
        self.add(n);
    }

    #[inline]
    fn write_usize(&mut self, n: usize) {
        self.add(n as u64);
    }

    #[inline]
    fn finish(&self) -> u64 {
        // Hash tables take their bucket from the low bits, which a multiply mixes least.
        (self.state ^ (self.state >> 32))
            .wrapping_mul(MULTIPLIER)
            .rotate_left(26)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::{HashMap, HashSet};
    use std::hash::Hash;

    fn hash<T: Hash + ?Sized>(build: &FastHash, value: &T) -> u64 {
        build.hash_one(value)
    }

    #[test]
    fn equal_keys_hash_equal_and_near_keys_differ() {
        let build = FastHash::default();
        let chain: Vec<u64> = vec![0x4011d6, 0x401234, 0x7f00_0000_1000];
        assert_eq!(hash(&build, &chain[..]), hash(&build, &chain.clone()[..]));
        let mut seen = HashSet::new();
        for i in 0..10_000u64 {
            assert!(seen.insert(hash(&build, &[0x400000 + i, 0x401000][..])), "{i}");
            assert!(seen.insert(hash(&build, &[0x7f00_0000_1000, 0x400000 + i][..])), "{i}");
        }
        assert_ne!(hash(&build, &b"ab"[..]), hash(&build, &b"ab\0"[..]));
    }

    #[test]
    fn addresses_a_page_apart_spread_over_the_low_bits() {
        // Return addresses often share their low bits; the table indexes by the low bits.
        let build = FastHash::default();
        let buckets: HashSet<u64> = (0..4096u64)
            .map(|i| hash(&build, &(0x5555_0000_0000 + i * 4096)) & 0xfff)
            .collect();
        assert!(buckets.len() > 2000, "{} of 4096 buckets used", buckets.len());
    }

    #[test]
    fn each_table_draws_its_own_seed() {
        let (a, b) = (FastHash::default(), FastHash::default());
        assert_ne!(hash(&a, &42u64), hash(&b, &42u64));
        let mut map: HashMap<Vec<u64>, u32, FastHash> = HashMap::default();
        map.insert(vec![1, 2, 3], 7);
        assert_eq!(map.get(&[1u64, 2, 3][..]), Some(&7));
    }
}
