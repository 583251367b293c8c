//! Names for the addresses of a report: the in-process symboliser's, demangled, and for code
//! nothing names its object's name in brackets (`[object]`), as the `cpuprof` command
//! spells it.

use super::Frame;
use crate::format::Maps;
use crate::symbolize::Symbolizer;
use std::borrow::Cow;

pub struct Names {
    maps: Maps,
    symbols: Symbolizer,
}

impl Names {
    pub fn new(maps: Maps) -> Names {
        Names {
            symbols: Symbolizer::new(maps.clone()),
            maps,
        }
    }

    pub fn frame(&mut self, address: u64) -> Frame {
        let mapping = self.maps.find(address);
        let object = mapping.filter(|m| !m.path.is_empty()).map(|m| m.path.clone());
        let function = match self.symbols.function(address) {
            Some(name) => demangle(name.as_ref()).into_owned(),
            None => match mapping {
                Some(m) => crate::elf::unknown_code(&m.path),
                None => format!("{address:#x}"),
            },
        };
        Frame {
            address,
            function,
            object,
        }
    }
}

/// A Rust name without its hash, a C++ name with its parameters (as the `cpuprof` command
/// and addr2line print them); anything else as it is.
pub fn demangle(name: &str) -> Cow<'_, str> {
    if let Ok(rust) = rustc_demangle::try_demangle(name) {
        return Cow::Owned(format!("{rust:#}"));
    }
    if name.starts_with("_Z") {
        let options = cpp_demangle::DemangleOptions::default();
        if let Some(cpp) = cpp_demangle::Symbol::new(name)
            .ok()
            .and_then(|s| s.demangle(&options).ok())
        {
            return Cow::Owned(cpp);
        }
    }
    Cow::Borrowed(name)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rust_and_cpp_names_are_demangled_and_others_kept() {
        assert_eq!(demangle("_ZN4core3fmt5write17h0123456789abcdefE"), "core::fmt::write");
        assert_eq!(demangle("_RNvCs1234_7mycrate4work"), "mycrate::work");
        assert_eq!(demangle("_ZN3foo3barEi"), "foo::bar(int)");
        assert_eq!(demangle("memcpy"), "memcpy");
        assert_eq!(demangle("_Zgarbage"), "_Zgarbage");
    }

    #[test]
    fn this_process_functions_are_named() {
        let maps = Maps::parse(&std::fs::read("/proc/self/maps").unwrap());
        let mut names = Names::new(maps);
        let here = rust_and_cpp_names_are_demangled_and_others_kept as *const () as u64;
        let frame = names.frame(here + 1);
        assert!(
            frame
                .function
                .ends_with("rust_and_cpp_names_are_demangled_and_others_kept"),
            "{frame:?}"
        );
        assert!(frame.object.is_some_and(|o| o.starts_with('/')));
        assert_eq!(names.frame(8).function, "0x8");
    }
}
