//! `cpuprof advise`: a short ranked list of what could be optimised, each hint with the numbers
//! from the profile behind it. Three kinds:
//!
//! * **growth**: functions whose cumulative time or share grew against a history of profiles,
//!   as `diff --history` judges them (only what it marks significant, with its interval);
//! * **lines**: a function of the program whose self time sits on a few source lines (the
//!   innermost frame, inlined frames expanded, of each sample's interrupted address);
//! * **family**: a known-costly family of library functions ([`FAMILIES`]), with the share of
//!   samples that are in it (counted once per sample) and its main callers in the program.
//!
//! Hints are ranked by the share of all samples at stake: for growth the points the share
//! grew by (or the time, as a share of the usual total), for lines the samples on those lines,
//! for a family the samples in it. Families may overlap (`free` calling `munmap` is both
//! allocation and a system call), so stakes are not summed.

use crate::analysis::diff::{self, Report, Row};
use crate::model::stacks::{Counts, Stacks};
use crate::render::json::{num, string};
use crate::symbols::{file_name, Locator, Symbolizer};
use cpuprof::format::{FastHash, Maps, Profile};
use std::collections::HashMap;
use std::fmt::Write;
use std::rc::Rc;

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
const SYSTEM_OBJECTS: &[&str] = &[
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
const SYSTEM_NAMES: &[&str] = &["std::", "core::", "alloc::", "<std::", "<core::", "<alloc::"];

/// The name as families match it: glibc's internal aliases and leading underscores stripped
/// (`__GI___libc_free` -> `free`, `__memcpy_avx_unaligned_erms` -> `memcpy_avx_unaligned_erms`,
/// `__read_nocancel` -> `read`), and a PLT stub's `@plt` (`free@plt` -> `free`): a sample in the
/// stub is part of the call into the function.
fn normalise(name: &str) -> &str {
    let name = name.strip_suffix("@plt").unwrap_or(name);
    let name = name.strip_prefix("__GI_").unwrap_or(name).trim_start_matches('_');
    let name = name.strip_prefix("libc_").unwrap_or(name);
    name.strip_suffix("_nocancel").unwrap_or(name)
}

impl Family {
    fn matches(&self, name: &str, object: &str) -> bool {
        let short = normalise(name);
        self.patterns.iter().any(|p| match *p {
            Exact(s) => short == s,
            Prefix(s) => short.starts_with(s),
            Contains(s) => name.contains(s),
            Object(s) => object.starts_with(s),
        })
    }
}

/// One frame of a sample's chain.
struct Site {
    name: String,
    file: String,
    line: u64,
    /// In a system object or standard-library code (see [`SYSTEM_OBJECTS`]).
    system: bool,
    /// Bit `i` set: a member of `FAMILIES[i]`.
    families: u32,
}

/// One family's samples and its callers in the program.
pub struct FamilyShare {
    pub family: &'static Family,
    pub samples: u64,
    /// Caller -> samples, `None` where no frame of the program calls the family.
    pub callers: Vec<(Option<String>, u64)>,
    /// Where the family's samples were taken: interrupted function -> samples.
    pub leaves: Vec<(String, u64)>,
}

#[derive(Default)]
struct FamilyTally {
    samples: u64,
    callers: HashMap<Option<String>, u64>,
    leaves: HashMap<String, u64>,
}

/// A profile read for advice: the chains as `top` names them, per-line self samples of the
/// program's functions, and the families.
pub struct Analysis {
    pub stacks: Stacks,
    pub total: u64,
    pub period_us: u64,
    /// Function -> (file, line) -> self samples, for functions of the program.
    lines: HashMap<String, HashMap<(String, u64), u64>>,
    pub families: Vec<FamilyShare>,
}

/// Names the addresses of one profile as `top` does, keeping file, line and object.
struct Sites<'a> {
    symbolizer: Symbolizer,
    maps: &'a Maps,
    cache: HashMap<u64, Rc<Vec<Site>>, FastHash>,
}

impl Sites<'_> {
    /// The frames at `addr`, outermost (caller of inlined code) first.
    fn at(&mut self, addr: u64) -> Rc<Vec<Site>> {
        if let Some(known) = self.cache.get(&addr) {
            return known.clone();
        }
        let object = self.maps.find(addr).map_or("", |m| file_name(&m.path));
        // Code in no mapping is nobody's: not a caller in the program.
        let in_system = object.is_empty() || SYSTEM_OBJECTS.iter().any(|s| object.starts_with(s));
        let mut frames: Vec<(String, String, u64)> = self
            .symbolizer
            .frames(self.maps, addr)
            .into_iter()
            .map(|f| (f.function, f.file, f.line))
            .collect();
        if frames.is_empty() {
            // Unnamed code gets the name `top` gives it.
            frames = self
                .symbolizer
                .functions(self.maps, addr)
                .into_iter()
                .map(|name| (name, String::new(), 0))
                .collect();
        }
        let sites: Vec<Site> = frames
            .into_iter()
            .rev()
            .map(|(name, file, line)| {
                let families = FAMILIES
                    .iter()
                    .enumerate()
                    .filter(|(_, f)| f.matches(&name, object))
                    .fold(0, |bits, (i, _)| bits | 1 << i);
                Site {
                    system: in_system || SYSTEM_NAMES.iter().any(|p| name.starts_with(p)),
                    name,
                    file,
                    line,
                    families,
                }
            })
            .collect();
        let sites = Rc::new(sites);
        self.cache.insert(addr, sites.clone());
        sites
    }
}

impl Analysis {
    pub fn new(profile: &Profile, locator: &Locator) -> Analysis {
        let mut sites = Sites {
            symbolizer: Symbolizer::new(locator.clone(), &profile.maps),
            maps: &profile.maps,
            cache: HashMap::default(),
        };
        let mut stacks = Stacks::new(profile.period_us);
        let mut lines: HashMap<String, HashMap<(String, u64), u64>> = HashMap::new();
        let mut families: Vec<FamilyTally> = FAMILIES.iter().map(|_| FamilyTally::default()).collect();
        let mut chain: Vec<Rc<Vec<Site>>> = Vec::new();
        for sample in &profile.samples {
            chain.clear();
            for (i, &pc) in sample.pcs.iter().enumerate().rev() {
                // Return addresses point after the call; look up the call instruction itself.
                chain.push(sites.at(if i == 0 { pc } else { pc.saturating_sub(1) }));
            }
            let frames: Vec<&Site> = chain.iter().flat_map(|s| s.iter()).collect();
            stacks.push(frames.iter().map(|s| s.name.as_str()), sample.count);
            if let Some(leaf) = frames.last().filter(|s| !s.system && s.line > 0) {
                *lines
                    .entry(leaf.name.clone())
                    .or_default()
                    .entry((leaf.file.clone(), leaf.line))
                    .or_default() += sample.count;
            }
            for (i, tally) in families.iter_mut().enumerate() {
                let bit = 1 << i;
                // The outermost member: what the family's callers called (callbacks it calls
                // back into the program, like qsort's comparison, are inside it).
                let Some(first) = frames.iter().position(|s| s.families & bit != 0) else {
                    continue;
                };
                tally.samples += sample.count;
                if let Some(leaf) = frames.last() {
                    *tally.leaves.entry(leaf.name.clone()).or_default() += sample.count;
                }
                let caller = frames[..first]
                    .iter()
                    .rev()
                    .find(|s| !s.system && s.families & bit == 0)
                    .map(|s| s.name.clone());
                *tally.callers.entry(caller).or_default() += sample.count;
            }
        }
        let families = FAMILIES
            .iter()
            .zip(families)
            .filter(|(_, tally)| tally.samples > 0)
            .map(|(family, tally)| FamilyShare {
                family,
                samples: tally.samples,
                callers: by_count(tally.callers),
                leaves: by_count(tally.leaves),
            })
            .collect();
        Analysis {
            total: stacks.total(),
            period_us: profile.period_us,
            stacks,
            lines,
            families,
        }
    }

    /// The self (flat) and cumulative samples of every function, as `top` counts them.
    fn functions(&self) -> HashMap<&str, Counts> {
        self.stacks.per_function()
    }
}

fn by_count<K: Ord>(map: HashMap<K, u64>) -> Vec<(K, u64)> {
    let mut v: Vec<(K, u64)> = map.into_iter().collect();
    v.sort_by(|a, b| b.1.cmp(&a.1).then(a.0.cmp(&b.0)));
    v
}

/// One hint.
pub enum Hint {
    /// A function that grew against the history (a row `diff --history` marked significant).
    Growth {
        row: Row,
        runs: usize,
        usual_seconds: f64,
    },
    /// Self time of `function` concentrated on `lines` (file, line, samples, source text).
    Lines {
        function: String,
        self_samples: u64,
        lines: Vec<(String, u64, u64, Option<String>)>,
    },
    /// Functions whose time grew significantly but not their share: the run as a whole took
    /// longer (`seconds` against the history's usual `usual_seconds`).
    Slower {
        functions: Vec<String>,
        usual_seconds: f64,
        seconds: f64,
        runs: usize,
    },
    Family(usize),
}

/// The hints, ranked.
pub struct Advice<'a> {
    analysis: &'a Analysis,
    pub hints: Vec<(f64, Hint)>,
}

/// A function's self time counts as concentrated when at most this many lines hold at least
/// [`CONCENTRATED`] of it.
const MAX_LINES: usize = 3;
const CONCENTRATED: f64 = 0.5;
/// Fewer self samples than this cannot say which lines are hot (1 of 2 is "50 %").
const MIN_LINE_SAMPLES: u64 = 10;

pub fn advise<'a>(analysis: &'a Analysis, growth: Option<(&Report, usize)>) -> Advice<'a> {
    let total = analysis.total.max(1) as f64;
    let mut hints: Vec<(f64, Hint)> = Vec::new();
    if let Some((report, runs)) = growth {
        // The whole run took longer when a function with all the samples did.
        let whole = report
            .rows
            .iter()
            .any(|r| r.share.before >= 99.0 && r.time.significant && r.time.change() > 0.0);
        let mut slower = Vec::new();
        for row in report.rows.iter().filter(|r| grew(r)) {
            let share_grew = row.share.significant && row.share.change() > 0.0;
            if whole && !share_grew {
                // Its time grew, its share did not: it grew with the whole run.
                slower.push(row);
                continue;
            }
            // At stake: the points of share the growth added, or what its time added to the
            // usual total.
            let stake = if share_grew {
                row.share.change() / 100.0
            } else {
                row.time.change() / report.base_seconds.max(f64::MIN_POSITIVE)
            };
            hints.push((
                stake,
                Hint::Growth {
                    row: row.clone(),
                    runs,
                    usual_seconds: report.base_seconds,
                },
            ));
        }
        if !slower.is_empty() && report.base_seconds > 0.0 {
            // One hint for all of them, at stake what the largest added to the usual total.
            let added = slower.iter().map(|r| r.time.change()).fold(0.0, f64::max);
            hints.push((
                added / report.base_seconds,
                Hint::Slower {
                    functions: slower.iter().map(|r| r.function.clone()).collect(),
                    usual_seconds: report.base_seconds,
                    seconds: report.new_seconds,
                    runs,
                },
            ));
        }
    }
    let functions = analysis.functions();
    for (function, lines) in &analysis.lines {
        let self_samples = functions.get(function.as_str()).map_or(0, |c| c.flat);
        let ranked = by_count(lines.clone());
        let mut held = 0;
        let mut chosen = Vec::new();
        for ((file, line), samples) in ranked.into_iter().take(MAX_LINES) {
            held += samples;
            chosen.push((file.clone(), line, samples, source_line(&file, line)));
            if held as f64 >= CONCENTRATED * self_samples as f64 {
                break;
            }
        }
        if self_samples < MIN_LINE_SAMPLES || (held as f64) < CONCENTRATED * self_samples as f64 {
            continue;
        }
        hints.push((
            held as f64 / total,
            Hint::Lines {
                function: function.clone(),
                self_samples,
                lines: chosen,
            },
        ));
    }
    for (i, family) in analysis.families.iter().enumerate() {
        hints.push((family.samples as f64 / total, Hint::Family(i)));
    }
    hints.sort_by(|a, b| b.0.total_cmp(&a.0).then_with(|| key(&a.1).cmp(&key(&b.1))));
    Advice { analysis, hints }
}

/// A stable tie-break between hints of equal stake.
fn key(hint: &Hint) -> String {
    match hint {
        Hint::Growth { row, .. } => format!("0{}", row.function),
        Hint::Slower { .. } => "0".to_string(),
        Hint::Lines { function, .. } => format!("1{function}"),
        Hint::Family(i) => format!("2{i}"),
    }
}

fn grew(row: &Row) -> bool {
    (row.share.significant && row.share.change() > 0.0) || (row.time.significant && row.time.change() > 0.0)
}

/// Line `line` of `file`, trimmed, if the file is at hand: shows what the line is.
fn source_line(file: &str, line: u64) -> Option<String> {
    let (f, _, _) = crate::symbols::open_regular(std::path::Path::new(file)).ok()?;
    // A source file beyond 64 MiB is not source.
    let mut text = String::new();
    std::io::Read::read_to_string(&mut std::io::Read::take(f, 64 << 20), &mut text).ok()?;
    let text = text.lines().nth(usize::try_from(line).ok()?.checked_sub(1)?)?.trim();
    let mut shown: String = text.chars().take(70).collect();
    if shown.len() < text.len() {
        shown.push_str("...");
    }
    Some(shown)
}

/// History options: `diff --history`'s defaults, on cumulative samples.
pub fn diff_options() -> diff::Options {
    diff::Options {
        cumulative: true,
        alpha: 0.001,
        confidence: 0.95,
        rows: 0,
    }
}

fn pct(n: u64, total: u64) -> f64 {
    crate::render::text::percent(n, total)
}

impl Advice<'_> {
    /// The hints at stake of at least `min_share` (a fraction), at most `count` of them,
    /// then one line for each smaller one.
    pub fn text(&self, min_share: f64, count: usize) -> String {
        let a = self.analysis;
        let total = a.total;
        let mut out = format!(
            "{total} samples ({:.2} s at {} us per sample); hints ranked by the share of all samples at stake\n",
            total as f64 * a.period_us as f64 / 1e6,
            a.period_us
        );
        let (major, minor): (Vec<_>, Vec<_>) = self.hints.iter().partition(|(stake, _)| *stake >= min_share);
        if total == 0 {
            out.push_str("no samples: nothing to advise on\n");
        } else if major.is_empty() {
            let _ = writeln!(out, "no hint: nothing at stake reaches {:.1} %", 100.0 * min_share);
        }
        for (rank, (stake, hint)) in major.iter().take(count).enumerate() {
            let _ = write!(out, "\n{}. [{:.1} %] ", rank + 1, 100.0 * stake);
            for (i, line) in self.lines(hint).iter().enumerate() {
                let indent = if i == 0 { "" } else { "   " };
                let _ = writeln!(out, "{indent}{line}");
            }
        }
        if major.len() > count {
            let _ = writeln!(
                out,
                "\n({} more hints above {:.1} %: -n)",
                major.len() - count,
                100.0 * min_share
            );
        }
        if !minor.is_empty() {
            let _ = writeln!(out, "\nbelow {:.1} %:", 100.0 * min_share);
            for (stake, hint) in &minor {
                let what = match hint {
                    Hint::Growth { row, .. } => format!("{} grew", row.function),
                    Hint::Slower { functions, .. } => {
                        format!("the run took longer: {} grew with it", list(functions, 3))
                    }
                    Hint::Lines { function, lines, .. } => format!(
                        "{function}: line {} holds most of its self time",
                        lines.iter().map(|l| l.1.to_string()).collect::<Vec<_>>().join(", ")
                    ),
                    Hint::Family(i) => {
                        let f = self.family(*i);
                        format!("{} ({} samples), from {}", f.family.name, f.samples, self.callers(f, 2))
                    }
                };
                let _ = writeln!(out, "   [{:.1} %] {what}", 100.0 * stake);
            }
        }
        out
    }

    /// What `hint` says: its headline, then the lines of evidence under it.
    pub fn lines(&self, hint: &Hint) -> Vec<String> {
        let total = self.analysis.total;
        let mark = |significant: bool| if significant { " significant" } else { "" };
        match hint {
            Hint::Growth {
                row,
                runs,
                usual_seconds,
            } => {
                let (s, t) = (&row.share, &row.time);
                vec![
                    format!(
                        "{} grew against {runs} earlier runs (cumulative: it and what it calls)",
                        row.function
                    ),
                    format!(
                        "share {:.1} % -> {:.1} %: {:+.1} points [{:+.1}, {:+.1}]{}",
                        s.before,
                        s.after,
                        s.change(),
                        s.low,
                        s.high,
                        mark(s.significant)
                    ),
                    format!(
                        "time {:.3} s -> {:.3} s: {:+.3} s [{:+.3}, {:+.3}]{} (usual total {usual_seconds:.3} s)",
                        t.before,
                        t.after,
                        t.change(),
                        t.low,
                        t.high,
                        mark(t.significant)
                    ),
                ]
            }
            Hint::Slower {
                functions,
                usual_seconds,
                seconds,
                runs,
            } => vec![
                format!(
                    "the run took {seconds:.3} s of CPU against the usual {usual_seconds:.3} s of {runs} earlier runs ({:+.1} %)",
                    100.0 * (seconds - usual_seconds) / usual_seconds
                ),
                format!(
                    "grew in time but not in share (with the whole run): {}",
                    list(functions, 6)
                ),
                "if the runs did the same work, everything slowed down; else it is the extra work".to_string(),
            ],
            Hint::Lines {
                function,
                self_samples,
                lines: hot,
            } => {
                let held: u64 = hot.iter().map(|l| l.2).sum();
                let which = match hot.as_slice() {
                    [(file, line, _, _)] => format!("line {line} of {function} ({}) holds", file_name(file)),
                    _ => format!(
                        "lines {} of {function} ({}) hold",
                        hot.iter().map(|l| l.1.to_string()).collect::<Vec<_>>().join(", "),
                        file_name(&hot[0].0)
                    ),
                };
                let mut lines = vec![format!(
                    "{which} {:.1} % of {function}'s self time ({held} of {self_samples} samples; {function} self {:.1} % of all)",
                    pct(held, *self_samples),
                    pct(*self_samples, total)
                )];
                for (file, line, samples, source) in hot {
                    lines.push(format!(
                        "{}:{line}  {samples} samples, {:.1} % of all{}",
                        file_name(file),
                        pct(*samples, total),
                        source.as_ref().map_or(String::new(), |s| format!("  | {s}"))
                    ));
                }
                lines
            }
            Hint::Family(i) => {
                let f = self.family(*i);
                vec![
                    format!(
                        "{}: {:.1} % of samples ({} of {total}) are in it or what it calls",
                        f.family.name,
                        pct(f.samples, total),
                        f.samples
                    ),
                    format!("called from {}", self.callers(f, 3)),
                    format!("time spent in {}", self.leaves(f, 4)),
                ]
            }
        }
    }

    /// The family hint `i` points at.
    pub fn family(&self, i: usize) -> &FamilyShare {
        &self.analysis.families[i]
    }

    fn callers(&self, f: &FamilyShare, n: usize) -> String {
        let total = self.analysis.total;
        let mut parts: Vec<String> = f
            .callers
            .iter()
            .take(n)
            .map(|(caller, samples)| {
                format!(
                    "{} {:.1} %",
                    caller.as_deref().unwrap_or("(no caller in the program)"),
                    pct(*samples, total)
                )
            })
            .collect();
        if f.callers.len() > n {
            parts.push(format!("{} more", f.callers.len() - n));
        }
        parts.join(", ")
    }

    fn leaves(&self, f: &FamilyShare, n: usize) -> String {
        let total = self.analysis.total;
        let mut parts: Vec<String> = f
            .leaves
            .iter()
            .take(n)
            .map(|(name, samples)| format!("{name} {:.1} %", pct(*samples, total)))
            .collect();
        if f.leaves.len() > n {
            parts.push(format!("{} more", f.leaves.len() - n));
        }
        parts.join(", ")
    }

    /// Every hint, with raw counts, as JSON (for scripts and the HTML report).
    pub fn json(&self) -> String {
        let a = self.analysis;
        let mut hints = Vec::new();
        for (rank, (stake, hint)) in self.hints.iter().enumerate() {
            let body = match hint {
                Hint::Growth { row, runs, .. } => {
                    let effect = |e: &diff::Effect| {
                        format!(
                            "{{\"before\":{},\"now\":{},\"change\":{},\"low\":{},\"high\":{},\"significant\":{}}}",
                            num(e.before),
                            num(e.after),
                            num(e.change()),
                            num(e.low),
                            num(e.high),
                            e.significant
                        )
                    };
                    format!(
                        "\"kind\":\"growth\",\"function\":{},\"runs\":{runs},\"share_points\":{},\"time_seconds\":{}",
                        string(&row.function),
                        effect(&row.share),
                        effect(&row.time)
                    )
                }
                Hint::Slower {
                    functions,
                    usual_seconds,
                    seconds,
                    runs,
                } => {
                    let names: Vec<String> = functions.iter().map(|f| string(f)).collect();
                    format!(
                        "\"kind\":\"slower\",\"runs\":{runs},\"usual_seconds\":{},\"seconds\":{},\"functions\":[{}]",
                        num(*usual_seconds),
                        num(*seconds),
                        names.join(",")
                    )
                }
                Hint::Lines {
                    function,
                    self_samples,
                    lines,
                } => {
                    let lines: Vec<String> = lines
                        .iter()
                        .map(|(file, line, samples, source)| {
                            format!(
                                "{{\"file\":{},\"line\":{line},\"samples\":{samples},\"source\":{}}}",
                                string(file),
                                source.as_deref().map_or("null".to_string(), string)
                            )
                        })
                        .collect();
                    format!(
                        "\"kind\":\"lines\",\"function\":{},\"self_samples\":{self_samples},\"lines\":[{}]",
                        string(function),
                        lines.join(",")
                    )
                }
                Hint::Family(i) => {
                    let f = self.family(*i);
                    let pairs = |v: &[(Option<String>, u64)]| {
                        v.iter()
                            .map(|(n, s)| {
                                format!(
                                    "{{\"function\":{},\"samples\":{s}}}",
                                    n.as_deref().map_or("null".to_string(), string)
                                )
                            })
                            .collect::<Vec<_>>()
                            .join(",")
                    };
                    let leaves: Vec<(Option<String>, u64)> =
                        f.leaves.iter().map(|(n, s)| (Some(n.clone()), *s)).collect();
                    format!(
                        "\"kind\":\"family\",\"family\":{},\"samples\":{},\"callers\":[{}],\"leaves\":[{}]",
                        string(f.family.name),
                        f.samples,
                        pairs(&f.callers),
                        pairs(&leaves)
                    )
                }
            };
            hints.push(format!("{{\"rank\":{},\"stake\":{},{body}}}", rank + 1, num(*stake)));
        }
        format!(
            "{{\"total_samples\":{},\"period_us\":{},\"hints\":[{}]}}\n",
            a.total,
            a.period_us,
            hints.join(",\n")
        )
    }
}

/// The first `n` of `names`, and how many more.
fn list(names: &[String], n: usize) -> String {
    let mut shown = names.iter().take(n).cloned().collect::<Vec<_>>().join(", ");
    if names.len() > n {
        let _ = write!(shown, " and {} more", names.len() - n);
    }
    shown
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

    #[test]
    fn json_strings_are_escaped() {
        assert_eq!(string("a\"b\\c\n"), "\"a\\\"b\\\\c\\u000a\"");
        assert_eq!(num(f64::INFINITY), "null");
    }
}
