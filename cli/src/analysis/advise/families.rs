//! The known-costly families of library functions `advise` looks for (allocation, copying,
//! locking, system calls, ...), and how a function's name and object place it in one.

/// How a family recognises a function. Function names are matched after [`normalise`], which
/// strips glibc's internal spellings (`__GI___libc_free` is matched as `free`).
#[derive(Clone, Copy, Debug)]
enum Pattern {
    /// The whole (normalised) name.
    Exact(&'static str),
    /// The start of the (normalised) name: `memcpy` for `__memcpy_avx_unaligned_erms`.
    Prefix(&'static str),
    /// Anywhere in the name: for demangled C++ and Rust paths (`core::fmt::`).
    Contains(&'static str),
    /// The start of the file name of the object the code is in (`ld-linux` for the loader).
    Object(&'static str),
}

use Pattern::{Contains, Exact, Object, Prefix};

/// A known-costly family of functions: its name and what recognises its members.
pub struct Family {
    pub name: &'static str,
    patterns: &'static [Pattern],
}

/// The families `advise` knows, in the order they are tested. A function belongs to every
/// family one of whose patterns matches it. Functions of the user's own code with such names
/// are claimed too (a `read` of the program's own is counted as the system call): names are
/// all a profile has. Page faults show in a user-space profile only as the faulting
/// instruction's own time, so they are counted only where a call that faults pages in or out
/// (`mmap`, `munmap`, `madvise`, `brk`) is on the stack. `clock_gettime` and `gettimeofday`
/// are left out: they mostly run in the vDSO without entering the kernel.
pub const FAMILIES: &[Family] = &[
    Family {
        name: "allocation and freeing",
        patterns: &[
            Exact("malloc"),
            Exact("free"),
            Exact("cfree"),
            Exact("calloc"),
            Exact("realloc"),
            Exact("reallocarray"),
            Exact("posix_memalign"),
            Exact("aligned_alloc"),
            Exact("memalign"),
            Exact("valloc"),
            Exact("pvalloc"),
            Prefix("int_malloc"),
            Prefix("int_free"),
            Prefix("int_realloc"),
            Prefix("int_memalign"),
            Prefix("malloc_"),
            Prefix("tcache_"),
            Prefix("sysmalloc"),
            Prefix("systrim"),
            Prefix("unlink_chunk"),
            Prefix("je_"),
            Prefix("tc_malloc"),
            Prefix("tc_free"),
            Prefix("tc_calloc"),
            Prefix("tc_realloc"),
            Prefix("tc_new"),
            Prefix("tc_delete"),
            Prefix("mi_malloc"),
            Prefix("mi_free"),
            Prefix("mi_calloc"),
            Prefix("mi_realloc"),
            Prefix("mi_heap_"),
            Prefix("mi_page_"),
            Prefix("mi_segment_"),
            Prefix("operator new"),
            Prefix("operator delete"),
            Prefix("rust_alloc"),
            Prefix("rust_dealloc"),
            Prefix("rust_realloc"),
            Prefix("rdl_"),
            Contains("alloc::alloc::"),
            Contains("alloc::raw_vec::"),
            Contains("tcmalloc::"),
            Object("libjemalloc"),
            Object("libtcmalloc"),
            Object("libmimalloc"),
        ],
    },
    Family {
        name: "copying and zeroing",
        patterns: &[
            Prefix("memcpy"),
            Prefix("memmove"),
            Prefix("memset"),
            Prefix("mempcpy"),
            Prefix("wmemcpy"),
            Prefix("wmemset"),
            Prefix("bzero"),
            Prefix("explicit_bzero"),
            Prefix("strcpy"),
            Prefix("stpcpy"),
            Prefix("strncpy"),
            Contains("core::intrinsics::copy"),
            Contains("core::ptr::copy"),
        ],
    },
    Family {
        name: "locking and futex waits",
        patterns: &[
            Prefix("pthread_mutex_"),
            Prefix("pthread_rwlock_"),
            Prefix("pthread_spin_"),
            Prefix("pthread_cond_"),
            Prefix("pthread_once"),
            Prefix("futex"),
            Prefix("lll_lock"),
            Prefix("lll_unlock"),
            Prefix("sem_wait"),
            Prefix("sem_timedwait"),
            Prefix("sem_post"),
            Contains("std::sync::"),
            Contains("std::sys::sync::"),
            Contains("parking_lot"),
            Contains("std::mutex::"),
            Contains("std::shared_mutex::"),
            Contains("std::condition_variable::"),
        ],
    },
    Family {
        name: "system calls and page faults",
        patterns: &[
            Exact("syscall"),
            Exact("read"),
            Exact("readv"),
            Exact("write"),
            Exact("writev"),
            Prefix("pread"),
            Prefix("pwrite"),
            Exact("readlink"),
            Exact("readlinkat"),
            Prefix("readdir"),
            Exact("open"),
            Exact("open64"),
            Prefix("openat"),
            Exact("close"),
            Prefix("fstat"),
            Exact("stat"),
            Exact("stat64"),
            Exact("lstat"),
            Exact("lstat64"),
            Prefix("statx"),
            Prefix("newfstatat"),
            Prefix("getdents"),
            Prefix("mmap"),
            Prefix("munmap"),
            Prefix("mremap"),
            Prefix("mprotect"),
            Prefix("madvise"),
            Exact("brk"),
            Exact("sbrk"),
            Exact("ioctl"),
            Prefix("fcntl"),
            Exact("poll"),
            Exact("ppoll"),
            Exact("select"),
            Exact("pselect"),
            Prefix("epoll_"),
            Exact("send"),
            Exact("sendto"),
            Exact("sendmsg"),
            Exact("recv"),
            Exact("recvfrom"),
            Exact("recvmsg"),
            Prefix("accept"),
            Exact("connect"),
            Prefix("lseek"),
            Exact("fsync"),
            Exact("fdatasync"),
            Exact("nanosleep"),
            Prefix("clock_nanosleep"),
            Exact("sched_yield"),
            Exact("unlink"),
            Exact("unlinkat"),
            Exact("rename"),
            Exact("renameat"),
            Exact("access"),
            Exact("faccessat"),
        ],
    },
    Family {
        name: "formatting and parsing",
        patterns: &[
            Exact("printf"),
            Exact("fprintf"),
            Exact("dprintf"),
            Prefix("sprintf"),
            Prefix("snprintf"),
            Prefix("asprintf"),
            Prefix("vprintf"),
            Prefix("vfprintf"),
            Prefix("vsprintf"),
            Prefix("vsnprintf"),
            Prefix("vasprintf"),
            Prefix("vdprintf"),
            Prefix("printf_"),
            Prefix("itoa"),
            Prefix("IO_vfprintf"),
            Prefix("IO_vsprintf"),
            Prefix("scanf"),
            Prefix("sscanf"),
            Prefix("fscanf"),
            Prefix("vfscanf"),
            Prefix("vsscanf"),
            Prefix("isoc99_"),
            Prefix("isoc23_"),
            Prefix("strto"),
            Prefix("wcsto"),
            Exact("atoi"),
            Exact("atol"),
            Exact("atoll"),
            Exact("atof"),
            Contains("core::fmt::"),
            Contains("alloc::fmt::"),
            Contains("std::fmt::"),
            Contains("core::num::dec2flt"),
            Contains("core::num::flt2dec"),
            Contains("as core::str::traits::FromStr"),
            Contains("std::basic_ostream"),
            Contains("std::basic_istream"),
            Contains("std::num_put"),
            Contains("std::num_get"),
            Contains("std::__cxx11::to_string"),
            Contains("std::to_chars"),
            Contains("std::from_chars"),
            Contains("std::__cxx11::basic_ostringstream"),
            Contains("std::__cxx11::basic_stringstream"),
            Contains("fmt::v"),
        ],
    },
    Family {
        name: "sorting",
        patterns: &[
            Prefix("qsort"),
            Prefix("msort"),
            Contains("std::sort<"),
            Contains("std::stable_sort"),
            Contains("std::__sort"),
            Contains("std::__stable_sort"),
            Contains("std::__introsort"),
            Contains("std::__insertion_sort"),
            Contains("std::__final_insertion_sort"),
            Contains("std::__merge_adaptive"),
            Contains("std::__heap_select"),
            Contains("std::__adjust_heap"),
            Contains("std::__partial_sort"),
            Contains("core::slice::sort::"),
        ],
    },
    Family {
        name: "hashing",
        patterns: &[
            Contains("SipHasher"),
            Contains("core::hash::sip::"),
            Contains("std::hash::random::"),
            Contains("hashbrown::"),
            Contains("std::_Hash_bytes"),
            Contains("std::hash<"),
            Contains("std::_Hashtable"),
            Prefix("Hash_bytes"),
            Prefix("XXH"),
            Contains("fxhash::"),
            Contains("ahash::"),
            Contains("rustc_hash::"),
            Prefix("g_str_hash"),
            Prefix("g_hash_table_"),
        ],
    },
    Family {
        name: "compression and checksums",
        patterns: &[
            Prefix("deflate"),
            Prefix("inflate"),
            Prefix("crc32"),
            Prefix("adler32"),
            Prefix("ZSTD_"),
            Prefix("lzma_"),
            Prefix("LZ4_"),
            Prefix("BZ2_"),
            Object("libz.so"),
            Object("libzstd"),
            Object("liblzma"),
            Object("libbz2"),
            Object("liblz4"),
            Object("libbrotli"),
            Object("libsnappy"),
        ],
    },
    Family {
        name: "cryptography",
        patterns: &[
            Prefix("EVP_"),
            Prefix("SHA256"),
            Prefix("SHA512"),
            Prefix("AES_"),
            Prefix("aesni_"),
            Prefix("sha256_block"),
            Prefix("sha512_block"),
            Object("libcrypto"),
            Object("libssl"),
            Object("libgcrypt"),
            Object("libnettle"),
        ],
    },
    Family {
        name: "exception unwinding",
        patterns: &[
            Prefix("Unwind_"),
            Prefix("cxa_throw"),
            Prefix("cxa_rethrow"),
            Prefix("cxa_begin_catch"),
            Prefix("cxa_end_catch"),
            Prefix("gxx_personality"),
            Prefix("uw_"),
            Prefix("execute_cfa_program"),
            Prefix("search_object"),
            Prefix("linear_search_fdes"),
            Prefix("rust_start_panic"),
            Contains("std::panicking::"),
            Contains("panic_unwind::"),
            Object("libgcc_s"),
            Object("libunwind"),
        ],
    },
    Family {
        name: "the dynamic loader",
        patterns: &[
            Prefix("dl_"),
            Prefix("do_lookup_x"),
            Prefix("elf_machine_"),
            Prefix("dlopen"),
            Prefix("dlsym"),
            Prefix("dlclose"),
            Object("ld-linux"),
            Object("ld64.so"),
            Object("ld.so"),
        ],
    },
];

/// Objects whose functions are not "the program": the C and C++ runtimes, the loader, the
/// profiler itself and the vDSO. A family's caller is the first frame outside these (and
/// outside the family) on the way from the family to `main`.
pub const SYSTEM_OBJECTS: &[&str] = &[
    "libc.so",
    "libc-",
    "libm.so",
    "libm-",
    "libstdc++",
    "libc++",
    "libgcc_s",
    "libunwind",
    "libpthread",
    "libdl.",
    "libdl-",
    "librt.",
    "librt-",
    "ld-linux",
    "ld64.so",
    "ld.so",
    "libcpuprof",
    "[vdso]",
    "linux-vdso",
];

/// Name prefixes of standard-library code compiled into the program (Rust's std, C++'s
/// templates): not "the program" either.
pub const SYSTEM_NAMES: &[&str] = &["std::", "core::", "alloc::", "<std::", "<core::", "<alloc::"];

/// The name as families match it: glibc's internal aliases and leading underscores stripped
/// (`__GI___libc_free` -> `free`, `__memcpy_avx_unaligned_erms` -> `memcpy_avx_unaligned_erms`,
/// `__read_nocancel` -> `read`), and a PLT stub's `@plt` (`free@plt` -> `free`): a sample in the
/// stub is part of the call into the function.
pub fn normalise(name: &str) -> &str {
    let name = name.strip_suffix("@plt").unwrap_or(name);
    let name = name.strip_prefix("__GI_").unwrap_or(name).trim_start_matches('_');
    let name = name.strip_prefix("libc_").unwrap_or(name);
    name.strip_suffix("_nocancel").unwrap_or(name)
}

impl Family {
    pub fn matches(&self, name: &str, object: &str) -> bool {
        let short = normalise(name);
        self.patterns.iter().any(|p| match *p {
            Exact(s) => short == s,
            Prefix(s) => short.starts_with(s),
            Contains(s) => name.contains(s),
            Object(s) => object.starts_with(s),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn families_of(name: &str, object: &str) -> Vec<&'static str> {
        FAMILIES
            .iter()
            .filter(|f| f.matches(name, object))
            .map(|f| f.name)
            .collect()
    }

    #[test]
    fn glibc_spellings_are_recognised() {
        assert_eq!(families_of("__GI___libc_free", "libc.so.6"), ["allocation and freeing"]);
        assert_eq!(families_of("_int_malloc", "libc.so.6"), ["allocation and freeing"]);
        assert_eq!(families_of("free@plt", "families"), ["allocation and freeing"]);
        assert_eq!(families_of("memset@plt", "families"), ["copying and zeroing"]);
        assert_eq!(
            families_of("__memcpy_avx_unaligned_erms", "libc.so.6"),
            ["copying and zeroing"]
        );
        assert_eq!(families_of("__lll_lock_wait", "libc.so.6"), ["locking and futex waits"]);
        assert_eq!(
            families_of("__GI_munmap", "libc.so.6"),
            ["system calls and page faults"]
        );
        assert_eq!(
            families_of("__read_nocancel", "libc.so.6"),
            ["system calls and page faults"]
        );
        assert_eq!(
            families_of("__vfprintf_internal", "libc.so.6"),
            ["formatting and parsing"]
        );
        assert_eq!(families_of("_itoa_word", "libc.so.6"), ["formatting and parsing"]);
        assert_eq!(
            families_of("__GI_____strtol_l_internal", "libc.so.6"),
            ["formatting and parsing"]
        );
        assert_eq!(families_of("msort_with_tmp", "libc.so.6"), ["sorting"]);
        assert_eq!(
            families_of("_Unwind_RaiseException", "libgcc_s.so.1"),
            ["exception unwinding"]
        );
        assert_eq!(
            families_of("_dl_relocate_object", "ld-linux-x86-64.so.2"),
            ["the dynamic loader"]
        );
    }

    #[test]
    fn compression_and_cryptography_by_object_and_name() {
        // A stripped zlib's static code is named by address: its object says what it is.
        assert_eq!(
            families_of("libz.so.1.2.13+0x4970", "libz.so.1.2.13"),
            ["compression and checksums"]
        );
        assert_eq!(
            families_of("ZSTD_compressBlock_lazy2", "zstd"),
            ["compression and checksums"]
        );
        assert_eq!(
            families_of("sha256_block_data_order_avx2", "libcrypto.so.3"),
            ["cryptography"]
        );
        // The program's own object of a similar name is not claimed.
        assert!(families_of("main", "libzx").is_empty());
    }

    #[test]
    fn demangled_paths_are_recognised() {
        assert_eq!(
            families_of("<core::hash::sip::Hasher<S> as core::hash::Hasher>::write", "app"),
            ["hashing"]
        );
        assert_eq!(families_of("core::fmt::write", "app"), ["formatting and parsing"]);
        assert_eq!(
            families_of("void std::__introsort_loop<int*, long>(int*, int*, long)", "app"),
            ["sorting"]
        );
        assert_eq!(
            families_of("operator new(unsigned long)", "libstdc++.so.6"),
            ["allocation and freeing"]
        );
    }

    #[test]
    fn the_programs_own_names_are_not_claimed() {
        for name in [
            "hash_strings",
            "count_primes",
            "sort_numbers",
            "main",
            "hot_a",
            "burn",
            "compare",
        ] {
            assert!(families_of(name, "demo").is_empty(), "{name}");
        }
    }
}
