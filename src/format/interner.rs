//! Strings stored once, each with a dense id in the order they were first seen: the name
//! tables of profiles (pprof's string table, the CLI's function and file names).

use super::FastHash;
use std::collections::HashMap;
use std::hash::BuildHasher;

/// No further string with the same hash.
const END: u32 = u32::MAX;

/// Strings by id and ids by string, each string held once (a profile of millions of distinct
/// names keeps one copy of each, not one in a list and another as a map's key): the map goes
/// from a string's hash to the first id with that hash, `next` chains the others. Ids are
/// `u32`: every string comes from a profile or a binary, and 2^32 distinct ones would not fit
/// in memory anyway.
#[derive(Clone, Default)]
pub struct Interner {
    strings: Vec<String>,
    first: HashMap<u64, u32, FastHash>,
    next: Vec<u32>,
    hash: FastHash,
}

impl Interner {
    /// The id of `s`, added if new (an owned `String` is stored without a copy).
    pub fn id(&mut self, s: impl AsRef<str> + Into<String>) -> u32 {
        let hash = self.hash.hash_one(s.as_ref());
        let head = self.first.get(&hash).copied().unwrap_or(END);
        let mut at = head;
        while at != END {
            if self.strings[at as usize] == s.as_ref() {
                return at;
            }
            at = self.next[at as usize];
        }
        let id = self.strings.len() as u32;
        self.strings.push(s.into());
        self.next.push(head);
        self.first.insert(hash, id);
        id
    }

    /// The strings, indexed by id.
    pub fn strings(&self) -> &[String] {
        &self.strings
    }

    /// Gives the strings up, indexed by id.
    pub fn into_strings(self) -> Vec<String> {
        self.strings
    }

    /// How many strings there are.
    pub fn len(&self) -> usize {
        self.strings.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.strings.is_empty()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_dense_in_order_of_first_sight() {
        let mut names = Interner::default();
        assert_eq!((names.id("a"), names.id(String::from("b")), names.id("a")), (0, 1, 0));
        assert_eq!(names.strings(), ["a", "b"]);
    }

    #[test]
    fn many_strings_keep_their_ids() {
        let mut names = Interner::default();
        for i in 0..10_000 {
            assert_eq!(names.id(format!("f{i}")), i);
        }
        for i in (0..10_000).rev() {
            assert_eq!(names.id(format!("f{i}")), i);
        }
        assert_eq!(names.len(), 10_000);
    }
}
