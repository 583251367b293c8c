//! The C API of labels on samples (`include/cpuprof.h`): `CpuprofLabelsIntern` and
//! `CpuprofLabelsSwap`, thin adapters over `cpuprof::labels`.

use cpuprof_core::labels::{self, LabelSet};
use std::ffi::{c_char, c_int, CStr};

/// An interned, immutable label set of `pairs` key/value pairs from `keys_and_values`
/// (`key0, value0, key1, value1, ...`), valid for the process's life; NULL (said on stderr)
/// for a negative count or a NULL array with pairs. A NULL key or value reads as "".
///
/// # Safety
/// `keys_and_values` holds `2 * pairs` pointers, each NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn CpuprofLabelsIntern(keys_and_values: *const *const c_char, pairs: c_int) -> *const LabelSet {
    let Ok(pairs) = usize::try_from(pairs) else {
        cpuprof_core::say!("cpuprof: CpuprofLabelsIntern: negative pair count {pairs}");
        return std::ptr::null();
    };
    if pairs > 0 && keys_and_values.is_null() {
        cpuprof_core::say!("cpuprof: CpuprofLabelsIntern: keys_and_values is NULL");
        return std::ptr::null();
    }
    let text = |i: usize| {
        // SAFETY: the caller's contract: 2 * pairs pointers.
        let p = unsafe { *keys_and_values.add(i) };
        if p.is_null() {
            String::new()
        } else {
            // SAFETY: the caller's contract: a NUL-terminated string.
            unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
        }
    };
    let kv: Vec<(String, String)> = (0..pairs).map(|i| (text(2 * i), text(2 * i + 1))).collect();
    LabelSet::new(&kv)
}

/// Installs `set` (NULL: none) for the calling thread and returns the set installed before,
/// so that scopes nest. A load and a store.
///
/// # Safety
/// `set` is NULL or a value `CpuprofLabelsIntern` or `CpuprofLabelsSwap` returned.
#[no_mangle]
pub unsafe extern "C" fn CpuprofLabelsSwap(set: *const LabelSet) -> *const LabelSet {
    // SAFETY: the caller's contract: one of our sets, never freed.
    let set = unsafe { set.as_ref() };
    labels::swap(set).map_or(std::ptr::null(), |previous| previous as *const LabelSet)
}
