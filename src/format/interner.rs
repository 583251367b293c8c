//! Strings stored once, each with a dense id in the order they were first seen: the name
//! tables of profiles (pprof's string table, the CLI's function and file names).

use super::FastHash;
use std::collections::HashMap;

/// Strings by id and ids by string. Ids are `u32`: every string comes from a profile or a
/// binary, and 2^32 distinct ones would not fit in memory anyway.
#[derive(Default)]
pub struct Interner {
    strings: Vec<String>,
    ids: HashMap<String, u32, FastHash>,
}

impl Interner {
    /// The id of `s`, added if new (an owned `String` is stored without a copy).
    pub fn id(&mut self, s: impl AsRef<str> + Into<String>) -> u32 {
        if let Some(&id) = self.ids.get(s.as_ref()) {
            return id;
        }
        let id = self.strings.len() as u32;
        let s: String = s.into();
        self.strings.push(s.clone());
        self.ids.insert(s, id);
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
}
