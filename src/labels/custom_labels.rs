//! Labels a program sets through Polar Signals' custom-labels ABI (version 1: the `custom-labels`
//! crate 0.4, the C library `libcustomlabels.so`), read with no code of cpuprof's in the
//! program, as the OpenTelemetry eBPF profiler reads them.
//!
//! The ABI: the executable, or a `libcustomlabels*.so` loaded at startup, exports
//! `custom_labels_abi_version` (a `u32`, 1) and the thread-local `custom_labels_current_set`, a
//! pointer to `{ storage, count, capacity }`, `storage` an array of `count` labels
//! `{ key: { len, buf }, value: { len, buf } }`. A label whose key's `buf` is NULL is ignored,
//! and so is a label whose key an earlier one has. The library keeps the set consistent at
//! every instruction, so a signal handler on the thread may read it.
//!
//! [`discover`] (when profiling starts) finds the two symbols with `dlsym` and keeps the
//! variable's offset from the thread pointer, the same in every thread because the object's
//! TLS block is static (it was loaded at startup; an object loaded later may get its block
//! lazily, which a handler cannot read: refused, and said). The handler (`current`) reads
//! the pointer, the set and its strings through `/proc/self/mem` (never faulting, whatever the
//! program has done to that memory), and interns the set (`labels::foreign`).
//!
//! A thread with a cpuprof label set installed ([`super::LabelSet`]) is labelled with that
//! one; its custom labels are read when it has none.

use super::foreign::{self, Interned, PairAt};
use crate::unwind::safe_read;
use std::ffi::{c_char, c_void, CStr};
use std::sync::atomic::{AtomicI64, AtomicU64, Ordering};

/// The version of the ABI read.
pub const ABI_VERSION: u32 = 1;
/// Labels looked at per set (the custom-labels library keeps a handful; a set this long is
/// cut, and counted).
const MAX_SCAN: usize = 32;

/// Where `custom_labels_current_set` is, from the thread pointer; 0 when it is not read.
static SLOT_OFFSET: AtomicI64 = AtomicI64::new(0);
/// Samples whose custom labels could not be read (strings changed under the copy, or memory
/// the program unmapped): recorded without labels.
static UNREADABLE: AtomicU64 = AtomicU64::new(0);

/// What [`discover`] found.
#[derive(Debug, PartialEq, Eq)]
pub enum Found {
    /// The program does not use the ABI.
    Absent,
    /// Its labels are read: the object that exports them.
    Reading(String),
    /// It uses the ABI in a way that cannot be read: why.
    Unreadable(String),
}

/// Finds the program's `custom_labels_current_set`, if it has one, and starts reading it in
/// samples. Not for signal context (`dlsym`).
pub fn discover() -> Found {
    // SAFETY: dlsym and dladdr with NUL-terminated names; the version is a u32 the object
    // exports, mapped while the object is loaded (objects loaded at startup stay).
    unsafe {
        let version = libc::dlsym(libc::RTLD_DEFAULT, c"custom_labels_abi_version".as_ptr());
        if version.is_null() {
            return Found::Absent;
        }
        let object = object_of(version);
        let v = *(version as *const u32);
        if v != ABI_VERSION {
            return Found::Unreadable(format!(
                "{object} uses version {v} of the custom-labels ABI; cpuprof reads version {ABI_VERSION}"
            ));
        }
        let slot = libc::dlsym(libc::RTLD_DEFAULT, c"custom_labels_current_set".as_ptr()) as u64;
        if slot == 0 {
            return Found::Unreadable(format!(
                "{object} exports custom_labels_abi_version but not custom_labels_current_set"
            ));
        }
        let tp = crate::arch::thread_pointer();
        match static_tls_size() {
            Some(size) if crate::arch::static_tls(tp, size).contains(&slot) => {
                SLOT_OFFSET.store(slot.wrapping_sub(tp) as i64, Ordering::Relaxed);
                Found::Reading(object)
            }
            Some(_) => Found::Unreadable(format!(
                "{object} keeps custom_labels_current_set in TLS allocated on demand (it was loaded after \
                 startup): a signal handler cannot read it, and the ABI asks for an object loaded at startup"
            )),
            None => Found::Unreadable(
                "the C library does not say where static TLS lies (_dl_get_tls_static_info)".to_string(),
            ),
        }
    }
}

/// The path of the object that holds `addr`.
fn object_of(addr: *const c_void) -> String {
    // SAFETY: dladdr fills a local struct; dli_fname is NUL-terminated when set.
    unsafe {
        let mut info: libc::Dl_info = std::mem::zeroed();
        if libc::dladdr(addr, &mut info) != 0 && !info.dli_fname.is_null() {
            let name = CStr::from_ptr(info.dli_fname).to_string_lossy();
            if !name.is_empty() {
                return name.into_owned();
            }
        }
    }
    "the executable".to_string()
}

/// The size of each thread's static TLS (glibc's `_dl_get_tls_static_info`, which sanitizers
/// use for the same question).
fn static_tls_size() -> Option<u64> {
    type Info = unsafe extern "C" fn(*mut usize, *mut usize);
    // SAFETY: looks up a function of ld.so; called with two local out-parameters.
    unsafe {
        let f = libc::dlsym(libc::RTLD_DEFAULT, c"_dl_get_tls_static_info".as_ptr() as *const c_char);
        if f.is_null() {
            return None;
        }
        let f: Info = std::mem::transmute(f);
        let (mut size, mut align) = (0usize, 0usize);
        f(&mut size, &mut align);
        (size > 0).then_some(size as u64)
    }
}

/// The number of the calling thread's custom-label set, 0 if it has none (or it could not be
/// read). Async-signal-safe: reads through `/proc/self/mem`, interns without lock or
/// allocation.
pub(super) fn current() -> u32 {
    of_thread(crate::arch::thread_pointer())
}

/// [`current`] of the thread whose thread pointer is `tp` (the calling thread, or another that
/// is blocked). Async-signal-safe.
pub(super) fn of_thread(tp: u64) -> u32 {
    let offset = SLOT_OFFSET.load(Ordering::Relaxed);
    if offset == 0 {
        return 0;
    }
    let slot = tp.wrapping_add(offset as u64);
    let mut set = [0u64];
    if safe_read::copy_words(slot, &mut set) != 1 || set[0] == 0 {
        return 0;
    }
    // { storage, count } (capacity is the library's own).
    let mut header = [0u64; 2];
    if safe_read::copy_words(set[0], &mut header) != 2 {
        return unreadable();
    }
    let [storage, count] = header;
    if count == 0 {
        return 0;
    }
    if count as usize > MAX_SCAN {
        super::CUT.fetch_add(1, Ordering::Relaxed);
    }
    let count = (count as usize).min(MAX_SCAN);
    // Each label: key.len, key.buf, value.len, value.buf.
    let mut words = [0u64; 4 * MAX_SCAN];
    if safe_read::copy_words(storage, &mut words[..4 * count]) != 4 * count {
        return unreadable();
    }
    let mut pairs = [PairAt::default(); MAX_SCAN];
    let mut n = 0;
    for label in words[..4 * count].chunks_exact(4) {
        if label[1] == 0 || label[3] == 0 {
            continue;
        }
        pairs[n] = PairAt {
            key: label[1],
            key_len: label[0] as usize,
            value: label[3],
            value_len: label[2] as usize,
        };
        n += 1;
    }
    if n == 0 {
        return 0;
    }
    match foreign::intern(&pairs[..n]) {
        Interned::Id(id) => id,
        Interned::OverCap => super::OVER_CAP_ID,
        Interned::Unreadable => unreadable(),
    }
}

fn unreadable() -> u32 {
    UNREADABLE.fetch_add(1, Ordering::Relaxed);
    0
}

/// Whether custom labels are read ([`discover`] found them).
pub(super) fn reading() -> bool {
    SLOT_OFFSET.load(Ordering::Relaxed) != 0
}

/// Samples recorded without their custom labels, which could not be read.
pub fn unreadable_samples() -> u64 {
    UNREADABLE.load(Ordering::Relaxed)
}
