//! The allocator interposers behind heap profiles, gperftools' `heap-profiler.h` API, and
//! `HEAPPROFILE` at load.
//!
//! `malloc`, `free`, `calloc`, `realloc`, `reallocarray`, `memalign`, `posix_memalign`,
//! `aligned_alloc`, `valloc`, `pvalloc` and `malloc_usable_size` are the program's: each
//! passes the call to the allocator the program would have used without us (the next
//! definition after libcpuprof.so: glibc's, or jemalloc's or mimalloc's preloaded after us),
//! and counts it: the thread's countdown is taken before the call, and a sampled block is
//! recorded once the allocator has returned it ([`cpuprof_core::heap::recorder`]). C++'s `operator new` and
//! `delete` reach them through libstdc++. With no heap profile running, an interposer is two
//! loads and a jump to the allocator (a free: and a compare, and a byte read once a heap
//! profile has started); while one runs, an unsampled allocation costs a thread-local
//! subtraction and a compare more, a free of an unsampled block one byte read.
//!
//! Finding the next allocator needs `dlsym`, which itself allocates (and calls `calloc`):
//! while the first thread to allocate is resolving them, its own allocations come from a
//! small static arena ([`bootstrap`]) that is never given back; other threads wait the few
//! microseconds it takes. Blocks from the arena are recognised by address in `free`,
//! `realloc` and `malloc_usable_size`.

use cpuprof_core::heap::{dumps, recorder};
use cpuprof_core::in_program::messages;
use std::ffi::{c_char, c_int, c_void, CStr};
use std::sync::atomic::{AtomicU32, AtomicU64, AtomicUsize, Ordering};

mod countdown;

/// Counts the allocation of `size` bytes at `p` if a heap profile runs. A sampled chain
/// leaves out the recorder's frame and this library's (`recorder::leave_out_code`, said at
/// load): it begins where the program allocated.
#[inline(always)]
fn count(p: *mut c_void, size: usize) {
    if recorder::is_running() {
        recorder::allocated(this_countdown(), p.cast(), size, 0);
    }
}

/// The calling thread's countdown.
#[inline(always)]
fn this_countdown() -> &'static mut cpuprof_core::heap::Countdown {
    // SAFETY: the thread's own TLS block, valid for the thread's life, touched only by the
    // thread (and by no signal handler).
    unsafe { &mut *countdown::this_thread() }
}

/// Whether an allocation of `size` bytes about to be made is to be sampled: false at once
/// while no heap profile runs, else the countdown taken ([`recorder::sampled`] finishes a
/// yes once the allocator has returned the block).
#[inline(always)]
fn to_sample(size: usize) -> bool {
    recorder::is_running() && this_countdown().take(size)
}

/// Records the block `p` the allocator returned for an allocation [`to_sample`] chose.
#[inline(always)]
fn record_sampled(p: *mut c_void, size: usize) {
    recorder::sampled(this_countdown(), p.cast(), size, 0);
}

/// Tells the recorder where this library's code lies (its executable segment), so that a
/// sampled chain leaves out however many frames of ours it begins with. At load, before any
/// heap profile can start.
pub fn leave_out_own_code() {
    unsafe extern "C" fn segment(info: *mut libc::dl_phdr_info, _: usize, found: *mut c_void) -> c_int {
        let here = leave_out_own_code as *const () as u64;
        // SAFETY: dl_iterate_phdr passes a valid entry whose headers it keeps mapped.
        let info = unsafe { &*info };
        let headers = if info.dlpi_phdr.is_null() {
            &[][..]
        } else {
            // SAFETY: as above: dlpi_phnum headers at dlpi_phdr.
            unsafe { std::slice::from_raw_parts(info.dlpi_phdr, usize::from(info.dlpi_phnum)) }
        };
        for h in headers
            .iter()
            .filter(|h| h.p_type == libc::PT_LOAD && h.p_flags & libc::PF_X != 0)
        {
            let start = info.dlpi_addr.wrapping_add(h.p_vaddr);
            if (start..start.wrapping_add(h.p_memsz)).contains(&here) {
                // SAFETY: `found` is the caller's (u64, u64).
                unsafe { *found.cast::<(u64, u64)>() = (start, start + h.p_memsz) };
                return 1;
            }
        }
        0
    }
    let mut found = (0u64, 0u64);
    // SAFETY: the callback reads only what dl_iterate_phdr passes and writes `found`.
    unsafe { libc::dl_iterate_phdr(Some(segment), std::ptr::addr_of_mut!(found).cast()) };
    recorder::leave_out_code(found.0, found.1);
}

#[inline(always)]
fn forget(p: *mut c_void) {
    recorder::forget(p.cast());
}

/// The functions of the allocator underneath, by index into [`REAL`].
#[derive(Clone, Copy)]
enum Fn {
    Malloc,
    Free,
    Calloc,
    Realloc,
    Reallocarray,
    Memalign,
    PosixMemalign,
    AlignedAlloc,
    Valloc,
    Pvalloc,
    UsableSize,
}

const NAMES: [&CStr; 11] = [
    c"malloc",
    c"free",
    c"calloc",
    c"realloc",
    c"reallocarray",
    c"memalign",
    c"posix_memalign",
    c"aligned_alloc",
    c"valloc",
    c"pvalloc",
    c"malloc_usable_size",
];

static REAL: [AtomicUsize; 11] = [const { AtomicUsize::new(0) }; 11];
const UNRESOLVED: u32 = 0;
const RESOLVING: u32 = 1;
const RESOLVED: u32 = 2;
static STATE: AtomicU32 = AtomicU32::new(UNRESOLVED);
/// The thread pointer of the thread resolving, whose allocations meanwhile use the arena.
static RESOLVER: AtomicU64 = AtomicU64::new(0);

/// The address of the allocator's function `f`; 0 while this thread is finding them (the
/// caller then uses [`bootstrap`]) or where the allocator has no such function.
#[inline(always)]
fn real(f: Fn) -> usize {
    let addr = REAL[f as usize].load(Ordering::Acquire);
    if addr != 0 {
        return addr;
    }
    resolve();
    REAL[f as usize].load(Ordering::Acquire)
}

#[cold]
fn resolve() {
    let me = cpuprof_core::unwind::thread_pointer();
    match STATE.compare_exchange(UNRESOLVED, RESOLVING, Ordering::AcqRel, Ordering::Acquire) {
        Ok(_) => {
            RESOLVER.store(me, Ordering::Release);
            for (i, name) in NAMES.iter().enumerate() {
                // SAFETY: dlsym with a NUL-terminated name; RTLD_NEXT skips this library.
                let addr = unsafe { libc::dlsym(libc::RTLD_NEXT, name.as_ptr()) } as usize;
                REAL[i].store(if addr != 0 { addr } else { glibc(i) }, Ordering::Release);
            }
            STATE.store(RESOLVED, Ordering::Release);
        }
        Err(RESOLVED) => {}
        Err(_) if RESOLVER.load(Ordering::Acquire) == me => {}
        Err(_) => {
            while STATE.load(Ordering::Acquire) != RESOLVED {
                std::hint::spin_loop();
                // SAFETY: no arguments.
                unsafe { libc::sched_yield() };
            }
        }
    }
}

/// glibc's own entry points, where `dlsym` found nothing (a static program has none to find).
fn glibc(i: usize) -> usize {
    extern "C" {
        fn __libc_malloc(size: usize) -> *mut c_void;
        fn __libc_free(p: *mut c_void);
        fn __libc_calloc(n: usize, size: usize) -> *mut c_void;
        fn __libc_realloc(p: *mut c_void, size: usize) -> *mut c_void;
        fn __libc_memalign(align: usize, size: usize) -> *mut c_void;
    }
    match i {
        0 => __libc_malloc as *const () as usize,
        1 => __libc_free as *const () as usize,
        2 => __libc_calloc as *const () as usize,
        3 => __libc_realloc as *const () as usize,
        5 => __libc_memalign as *const () as usize,
        _ => 0,
    }
}

/// Allocations made while the allocator is being found: a static arena, bump-allocated, each
/// block after a 16-byte header holding its size. Never freed (a few hundred bytes, once).
mod bootstrap {
    use std::sync::atomic::{AtomicUsize, Ordering};

    const SIZE: usize = 64 * 1024;
    #[repr(C, align(4096))]
    struct Arena([u8; SIZE]);
    static mut ARENA: Arena = Arena([0; SIZE]);
    static USED: AtomicUsize = AtomicUsize::new(0);

    #[inline(always)]
    fn base() -> usize {
        std::ptr::addr_of_mut!(ARENA) as usize
    }

    /// `size` zeroed bytes aligned to `align` (a power of two up to 4096); null when the arena
    /// is spent.
    pub fn alloc(size: usize, align: usize) -> *mut u8 {
        let align = align.clamp(16, 4096);
        let mut used = USED.load(Ordering::Relaxed);
        loop {
            let start = (base() + used + 16).next_multiple_of(align);
            let Some(end) = start.checked_add(size).filter(|&e| e <= base() + SIZE) else {
                return std::ptr::null_mut();
            };
            match USED.compare_exchange(used, end - base(), Ordering::AcqRel, Ordering::Relaxed) {
                Ok(_) => {
                    // SAFETY: [start - 16, end) lies in the arena and is ours alone now.
                    unsafe { ((start - 16) as *mut usize).write(size) };
                    return start as *mut u8;
                }
                Err(now) => used = now,
            }
        }
    }

    /// Whether `p` is one of the arena's blocks (or inside one): one compare.
    #[inline(always)]
    pub fn holds(p: *mut u8) -> bool {
        (p as usize).wrapping_sub(base() + 16) < SIZE - 16
    }

    /// The size of the arena's block at `p`, if `p` is one.
    pub fn size_of(p: *mut u8) -> Option<usize> {
        // SAFETY: a block's header precedes it inside the arena.
        holds(p).then(|| unsafe { ((p as usize - 16) as *const usize).read() })
    }
}

macro_rules! call {
    ($f:expr, fn($($t:ty),*) -> $r:ty, $($arg:expr),*) => {{
        let addr = real($f);
        // SAFETY: `addr` is the allocator's function of that name, with C's signature.
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn($($t),*) -> $r>(addr)($($arg),*) }
    }};
}

// The interposers' common paths — no heap profile running (every program preloading cpuprof
// for CPU profiles only), or one running and the allocation not sampled, or a free of a
// block never sampled — are a few loads, a thread-local subtraction and a compare, and a
// sibling call (a jump) to the allocator: no frame of ours to build, none left on the stack
// for a CPU profile to show. The countdown is taken before the allocator is called so that
// this holds while a profile runs too; only a sampled allocation calls the allocator from a
// frame of ours, to record the block it returns. Everything else is in a function of its own
// (`#[inline(never)]`), entered by a sibling call too, so its frame setup is not paid on the
// common path. (Written without the `call!` helper: a debug build keeps helpers as frames of
// their own.)

/// Interposed: the allocator's `malloc`, counted.
#[no_mangle]
pub extern "C" fn malloc(size: usize) -> *mut c_void {
    let next = REAL[Fn::Malloc as usize].load(Ordering::Acquire);
    if next == 0 {
        return malloc_unresolved(size);
    }
    if to_sample(size) {
        return malloc_sampled(next, size);
    }
    // SAFETY: `next` is the allocator's malloc.
    unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(usize) -> *mut c_void>(next)(size) }
}

/// `malloc` while this thread or another finds the allocator.
#[inline(never)]
extern "C" fn malloc_unresolved(size: usize) -> *mut c_void {
    let p = if real(Fn::Malloc) == 0 {
        bootstrap::alloc(size, 16).cast()
    } else {
        call!(Fn::Malloc, fn(usize) -> *mut c_void, size)
    };
    count(p, size);
    p
}

/// `malloc` of a sampled allocation, `next` the allocator's.
#[inline(never)]
extern "C" fn malloc_sampled(next: usize, size: usize) -> *mut c_void {
    // SAFETY: `next` is the allocator's malloc.
    let p = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(usize) -> *mut c_void>(next)(size) };
    record_sampled(p, size);
    p
}

/// Interposed: the allocator's `calloc`, counted.
#[no_mangle]
pub extern "C" fn calloc(n: usize, size: usize) -> *mut c_void {
    let next = REAL[Fn::Calloc as usize].load(Ordering::Acquire);
    // An overflowing `n * size` goes the slow way, which fails it.
    match n.checked_mul(size) {
        Some(bytes) if next != 0 => {
            if to_sample(bytes) {
                return calloc_sampled(next, n, size);
            }
            // SAFETY: `next` is the allocator's calloc.
            unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(usize, usize) -> *mut c_void>(next)(n, size) }
        }
        _ => calloc_unresolved(n, size),
    }
}

/// `calloc` while the allocator is being found, or of more than the address space.
#[inline(never)]
extern "C" fn calloc_unresolved(n: usize, size: usize) -> *mut c_void {
    let Some(bytes) = n.checked_mul(size) else {
        // SAFETY: the thread's errno.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return std::ptr::null_mut();
    };
    let p = if real(Fn::Calloc) == 0 {
        // The arena is zeroed and never reused.
        bootstrap::alloc(bytes, 16).cast()
    } else {
        call!(Fn::Calloc, fn(usize, usize) -> *mut c_void, n, size)
    };
    count(p, bytes);
    p
}

/// `calloc` of a sampled allocation, `next` the allocator's.
#[inline(never)]
extern "C" fn calloc_sampled(next: usize, n: usize, size: usize) -> *mut c_void {
    // SAFETY: `next` is the allocator's calloc.
    let p = unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(usize, usize) -> *mut c_void>(next)(n, size) };
    record_sampled(p, n * size);
    p
}

/// Interposed: the allocator's `free`; a sampled block leaves the profile's in-use counts.
///
/// # Safety
/// `p` is null or a block from this allocator, not yet freed.
#[no_mangle]
pub unsafe extern "C" fn free(p: *mut c_void) {
    let next = REAL[Fn::Free as usize].load(Ordering::Acquire);
    if next == 0 || bootstrap::holds(p.cast()) || recorder::may_be_sampled(p.cast()) {
        // SAFETY: the caller's contract.
        return unsafe { free_rare(p) };
    }
    // SAFETY: `next` is the allocator's free; `p` one of its blocks (or null).
    unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void)>(next)(p) }
}

/// `free` of a block that was sampled (or shares its bucket with one), of a block from the
/// arena, or while the allocator is being found.
///
/// # Safety
/// As `free`.
#[inline(never)]
unsafe extern "C" fn free_rare(p: *mut c_void) {
    // Without the allocator's free (this thread is finding it), a block not from the arena
    // cannot exist yet.
    if p.is_null() || bootstrap::holds(p.cast()) || real(Fn::Free) == 0 {
        return;
    }
    forget(p);
    // The allocator's free last: a sibling call in release builds.
    call!(Fn::Free, fn(*mut c_void) -> (), p)
}

/// Interposed: the allocator's `realloc`; counted as the free of the old block and the
/// allocation of the new one.
///
/// # Safety
/// As `realloc`.
#[no_mangle]
pub unsafe extern "C" fn realloc(p: *mut c_void, size: usize) -> *mut c_void {
    let next = REAL[Fn::Realloc as usize].load(Ordering::Acquire);
    if next == 0 || bootstrap::holds(p.cast()) || recorder::may_be_sampled(p.cast()) {
        // SAFETY: the caller's contract.
        return unsafe { realloc_rare(p, size) };
    }
    // The old block was never sampled: nothing to forget, only the new one to count.
    if to_sample(size) {
        // SAFETY: as above.
        return unsafe { realloc_sampled(next, p, size) };
    }
    // SAFETY: `next` is the allocator's realloc; `p` one of its blocks (or null).
    unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>(next)(p, size) }
}

/// `realloc` of a block from the arena, of one that may have been sampled, or while the
/// allocator is being found.
///
/// # Safety
/// As `realloc`.
#[inline(never)]
unsafe extern "C" fn realloc_rare(p: *mut c_void, size: usize) -> *mut c_void {
    if let Some(old) = bootstrap::size_of(p.cast()) {
        let q = malloc(size);
        if !q.is_null() {
            // SAFETY: both blocks hold at least the bytes copied.
            unsafe { std::ptr::copy_nonoverlapping(p.cast::<u8>(), q.cast::<u8>(), old.min(size)) };
        }
        return q;
    }
    if real(Fn::Realloc) == 0 {
        // This thread is finding the allocator: only `realloc(NULL, n)` can come here.
        return if p.is_null() {
            malloc(size)
        } else {
            std::ptr::null_mut()
        };
    }
    // Before the call: once it returns, the old address may be another thread's new block.
    forget(p);
    let q = call!(Fn::Realloc, fn(*mut c_void, usize) -> *mut c_void, p, size);
    count(q, size);
    q
}

/// `realloc` of a block never sampled into a sampled allocation, `next` the allocator's.
///
/// # Safety
/// As `realloc`.
#[inline(never)]
unsafe extern "C" fn realloc_sampled(next: usize, p: *mut c_void, size: usize) -> *mut c_void {
    // SAFETY: `next` is the allocator's realloc; the caller's contract for `p`.
    let q =
        unsafe { std::mem::transmute::<usize, unsafe extern "C" fn(*mut c_void, usize) -> *mut c_void>(next)(p, size) };
    record_sampled(q, size);
    q
}

/// Interposed: the allocator's `reallocarray` (glibc 2.26), or `realloc` with the
/// multiplication checked where the allocator has none.
///
/// # Safety
/// As `reallocarray`.
#[no_mangle]
pub unsafe extern "C" fn reallocarray(p: *mut c_void, n: usize, size: usize) -> *mut c_void {
    let Some(bytes) = n.checked_mul(size) else {
        // SAFETY: the thread's errno.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return std::ptr::null_mut();
    };
    if real(Fn::Reallocarray) == 0 || bootstrap::size_of(p.cast()).is_some() {
        // SAFETY: the caller's contract.
        return unsafe { realloc(p, bytes) };
    }
    forget(p);
    let q = call!(
        Fn::Reallocarray,
        fn(*mut c_void, usize, usize) -> *mut c_void,
        p,
        n,
        size
    );
    count(q, bytes);
    q
}

/// An aligned allocation through the allocator's function `f` (which takes the alignment
/// first), or from the arena while the allocator is being found.
#[inline(always)]
fn aligned(f: Fn, align: usize, size: usize) -> *mut c_void {
    let p = if real(f) == 0 {
        if real(Fn::Malloc) == 0 {
            bootstrap::alloc(size, align).cast()
        } else {
            // SAFETY: the thread's errno.
            unsafe { *libc::__errno_location() = libc::ENOSYS };
            std::ptr::null_mut()
        }
    } else {
        call!(f, fn(usize, usize) -> *mut c_void, align, size)
    };
    count(p, size);
    p
}

/// Interposed: the allocator's `memalign`, counted.
#[no_mangle]
pub extern "C" fn memalign(align: usize, size: usize) -> *mut c_void {
    aligned(Fn::Memalign, align, size)
}

/// Interposed: the allocator's `aligned_alloc`, counted.
#[no_mangle]
pub extern "C" fn aligned_alloc(align: usize, size: usize) -> *mut c_void {
    aligned(Fn::AlignedAlloc, align, size)
}

/// Interposed: the allocator's `posix_memalign`, counted when it succeeds; its error
/// (EINVAL, ENOMEM) is returned unchanged.
///
/// # Safety
/// `out` is valid for a write.
#[no_mangle]
pub unsafe extern "C" fn posix_memalign(out: *mut *mut c_void, align: usize, size: usize) -> c_int {
    if real(Fn::PosixMemalign) == 0 {
        let p = bootstrap::alloc(size, align);
        if p.is_null() {
            return libc::ENOMEM;
        }
        // SAFETY: the caller's contract.
        unsafe { *out = p.cast() };
        return 0;
    }
    let status = call!(
        Fn::PosixMemalign,
        fn(*mut *mut c_void, usize, usize) -> c_int,
        out,
        align,
        size
    );
    if status == 0 {
        // SAFETY: the allocator wrote the block's address.
        count(unsafe { *out }, size);
    }
    status
}

/// Interposed: the allocator's `valloc`, counted.
#[no_mangle]
pub extern "C" fn valloc(size: usize) -> *mut c_void {
    let p = call_unary(Fn::Valloc, size);
    count(p, size);
    p
}

/// Interposed: the allocator's `pvalloc`, counted (as the page multiple it allocates).
#[no_mangle]
pub extern "C" fn pvalloc(size: usize) -> *mut c_void {
    let p = call_unary(Fn::Pvalloc, size);
    // SAFETY: no arguments.
    let page = usize::try_from(unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).unwrap_or(4096);
    count(p, size.max(1).next_multiple_of(page));
    p
}

fn call_unary(f: Fn, size: usize) -> *mut c_void {
    if real(f) == 0 {
        // SAFETY: the thread's errno.
        unsafe { *libc::__errno_location() = libc::ENOMEM };
        return std::ptr::null_mut();
    }
    call!(f, fn(usize) -> *mut c_void, size)
}

/// Interposed: the allocator's `malloc_usable_size` (the arena's blocks: their size).
///
/// # Safety
/// `p` is null or a live block of this allocator.
#[no_mangle]
pub unsafe extern "C" fn malloc_usable_size(p: *mut c_void) -> usize {
    if let Some(size) = bootstrap::size_of(p.cast()) {
        return size;
    }
    if real(Fn::UsableSize) == 0 {
        return 0;
    }
    call!(Fn::UsableSize, fn(*mut c_void) -> usize, p)
}

/// The object whose `malloc` the program calls, if it is not this library: where another
/// allocator comes first (the program's own, or one preloaded before libcpuprof.so), no
/// allocation passes here. Compared by object, through `dladdr`: taking `malloc`'s address
/// here would itself go through the symbol table and name the first definition, whichever
/// it is.
fn other_malloc() -> Option<String> {
    let ours = object_of(other_malloc as *const c_void).map(|o| o.base);
    match first_malloc() {
        Some(o) if Some(o.base) == ours => None,
        Some(o) if !o.name.is_empty() => Some(o.name),
        _ => Some("the program".to_string()),
    }
}

/// A loaded object, as `dladdr` names it.
struct Object {
    base: usize,
    name: String,
    /// Whether the symbol at the address asked about is defined there, rather than a
    /// non-PIE executable's "canonical PLT" entry for a function defined elsewhere.
    defines: bool,
}

/// `dladdr1`'s request for the symbol's table entry (glibc's dlfcn.h).
const RTLD_DL_SYMENT: std::ffi::c_int = 1;
/// The section index of a symbol the object does not define (elf.h).
const SHN_UNDEF: u16 = 0;

fn object_of(addr: *const c_void) -> Option<Object> {
    // SAFETY: dladdr1 writes the structs we pass; zeroed is a valid initial value.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    let mut symbol: *mut libc::Elf64_Sym = std::ptr::null_mut();
    // SAFETY: any address may be asked about; dli_fname is NUL-terminated when set; the
    // symbol entry, when given, is the loaded object's own.
    let found = unsafe {
        libc::dladdr1(
            addr,
            &mut info,
            (&mut symbol as *mut *mut libc::Elf64_Sym).cast(),
            RTLD_DL_SYMENT,
        )
    };
    if found == 0 {
        return None;
    }
    let name = if info.dli_fname.is_null() {
        String::new()
    } else {
        // SAFETY: as above.
        unsafe { CStr::from_ptr(info.dli_fname) }.to_string_lossy().into_owned()
    };
    // SAFETY: set by dladdr1 to an entry of the object's symbol table, or left null.
    let defines = unsafe { symbol.as_ref() }.is_none_or(|s| s.st_shndx != SHN_UNDEF);
    Some(Object {
        base: info.dli_fbase as usize,
        name,
        defines,
    })
}

/// The object defining the `malloc` the program's calls reach: the first definition in load
/// order. `dlsym` answers the first symbol of the name, which in a non-PIE executable that
/// takes `malloc`'s address (Debian's python3) is the executable's PLT entry: calls there
/// jump on to the first definition after it, which the link map then finds.
fn first_malloc() -> Option<Object> {
    // SAFETY: dlsym with a constant NUL-terminated name.
    let first = object_of(unsafe { libc::dlsym(libc::RTLD_DEFAULT, c"malloc".as_ptr()) })?;
    if first.defines {
        return Some(first);
    }
    /// The public head of glibc's `struct link_map`.
    #[repr(C)]
    struct LinkMap {
        l_addr: usize,
        l_name: *const std::ffi::c_char,
        l_ld: *mut c_void,
        l_next: *mut LinkMap,
        l_prev: *mut LinkMap,
    }
    let mut map: *mut LinkMap = std::ptr::null_mut();
    // SAFETY: the main program's handle (never closed: dlopen(NULL) is not counted), asked
    // for its link map, which the loader keeps for the process's life.
    let known = unsafe {
        let program = libc::dlopen(std::ptr::null(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        !program.is_null() && libc::dlinfo(program, libc::RTLD_DI_LINKMAP, (&mut map as *mut *mut LinkMap).cast()) == 0
    };
    if !known {
        return None;
    }
    // SAFETY: the loader's list, read while it cannot change (at load, or under the program's
    // own threads' dlopen, which takes the same lock our dlopen calls below take).
    let mut entry = unsafe { map.as_ref() }.map(|m| m.l_next);
    while let Some(object) = entry.and_then(|e| unsafe { e.as_ref() }) {
        entry = Some(object.l_next);
        if object.l_name.is_null() {
            continue;
        }
        // SAFETY: a loaded object's own name; NOLOAD loads nothing; the handle is closed.
        let found = unsafe {
            let handle = libc::dlopen(object.l_name, libc::RTLD_LAZY | libc::RTLD_NOLOAD);
            if handle.is_null() {
                continue;
            }
            let found = libc::dlsym(handle, c"malloc".as_ptr());
            libc::dlclose(handle);
            found
        };
        // The handle's search reaches the object's dependencies too: this object's only if
        // defined in it.
        let name = unsafe { CStr::from_ptr(object.l_name) }.to_string_lossy();
        match object_of(found) {
            Some(o) if o.defines && o.name == name => return Some(o),
            _ => {}
        }
    }
    None
}

/// Says, in every process (it is a loss), why the heap profile is off: whose `malloc` runs.
fn say_heap_off(owner: &str) {
    // The executable's own malloc comes before any preloaded library: nothing to reorder.
    // Compared by the file each name leads to: a program started as `/proc/self/exe`
    // (Chromium's zygote) is named so by the loader.
    let real = |path: &str| std::fs::canonicalize(path).ok();
    let (exe, real_owner) = (real("/proc/self/exe"), real(owner));
    let owner = real_owner
        .as_deref()
        .map_or(owner.to_string(), |p| p.display().to_string());
    let advice = if owner.is_empty() || (exe.is_some() && exe == real_owner) {
        "the program defines malloc itself, ahead of any preloaded library: its allocations cannot be seen"
    } else {
        "it comes before libcpuprof.so: put libcpuprof.so first in LD_PRELOAD, or link it before the allocator"
    };
    messages::say_for_tree(format_args!(
        "cpuprof: heap profile off in process {}: the program's malloc is {owner}'s, not libcpuprof.so's ({advice})",
        std::process::id()
    ));
}

fn start_files(prefix: &std::path::Path, period: u64, triggers: dumps::Triggers, use_pid: bool) -> bool {
    if let Some(owner) = other_malloc() {
        say_heap_off(&owner);
        return false;
    }
    match dumps::start(prefix, period, triggers, use_pid) {
        Ok(()) => true,
        Err(e) => {
            cpuprof_core::say!("cpuprof: heap profile: {e}");
            false
        }
    }
}

/// `HEAPPROFILE=prefix` at load: a heap profile written as gperftools' heap profiler writes it;
/// `CPUPROF_HEAP=1` (or the HTTP endpoint, unless `CPUPROF_HEAP=0`): sampled for the endpoint.
pub fn start_from_environment() {
    let var = |k: &str| std::env::var(k).ok();
    match dumps::from_env(var) {
        None => match dumps::sampling_from_env(var) {
            None => {}
            Some(Err(e)) => cpuprof_core::say!("cpuprof: {e}; the program continues without a heap profile"),
            Some(Ok(period)) => {
                if let Some(owner) = other_malloc() {
                    say_heap_off(&owner);
                } else if let Err(e) = recorder::start(period) {
                    cpuprof_core::say!("cpuprof: heap profile: {e}");
                }
            }
        },
        Some(Err(e)) => cpuprof_core::say!("cpuprof: {e}; the program continues without a heap profile"),
        Some(Ok((prefix, period, triggers))) => {
            // Programs this one starts inherit HEAPPROFILE: they write `prefix_PID` files
            // rather than overwrite ours (set only when absent, as CPUPROFILE_USE_PID is).
            let use_pid = var("HEAPPROFILE_USE_PID").is_some();
            if !use_pid {
                std::env::set_var("HEAPPROFILE_USE_PID", "1");
            }
            // And they keep quiet (`in_program::messages`), unless a CPU profile named the root.
            if var(messages::ROOT_PID_VARIABLE).is_none() {
                std::env::set_var(messages::ROOT_PID_VARIABLE, std::process::id().to_string());
            }
            if !start_files(&prefix, period, triggers, use_pid) {
                return;
            }
            let pid = if use_pid {
                format!("_{}", std::process::id())
            } else {
                String::new()
            };
            cpuprof_core::say!(
                "cpuprof: heap profile to {}{pid}.NNNN.heap, one sample per {period} bytes",
                prefix.display()
            );
        }
    }
}

/// The end of the process: the last file.
pub fn stop_at_exit() {
    if dumps::is_writing() {
        dumps::stop();
    }
}

/// gperftools' `HeapProfilerStart`: heap profiles written to `prefix.NNNN.heap`, sampled and
/// triggered as `HEAPPROFILE`'s options say.
///
/// # Safety
/// `prefix` is a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn HeapProfilerStart(prefix: *const c_char) {
    if prefix.is_null() {
        cpuprof_core::say!("cpuprof: HeapProfilerStart: prefix is NULL");
        return;
    }
    // SAFETY: the caller passes a NUL-terminated string.
    let prefix = unsafe { CStr::from_ptr(prefix) }.to_string_lossy().into_owned();
    let var = |k: &str| match k {
        "HEAPPROFILE" => Some(prefix.clone()),
        _ => std::env::var(k).ok(),
    };
    match dumps::from_env(var) {
        Some(Ok((prefix, period, triggers))) => {
            start_files(&prefix, period, triggers, false);
        }
        Some(Err(e)) => cpuprof_core::say!("cpuprof: HeapProfilerStart: {e}"),
        None => cpuprof_core::say!("cpuprof: HeapProfilerStart: empty prefix"),
    }
}

/// gperftools' `HeapProfilerStop`: writes the last file and stops.
#[no_mangle]
pub extern "C" fn HeapProfilerStop() {
    dumps::stop();
}

/// gperftools' `IsHeapProfilerRunning`.
#[no_mangle]
pub extern "C" fn IsHeapProfilerRunning() -> c_int {
    c_int::from(recorder::is_running())
}

/// gperftools' `HeapProfilerDump`: writes a file now, `reason` (may be NULL) said on stderr.
///
/// # Safety
/// `reason` is NULL or a NUL-terminated string.
#[no_mangle]
pub unsafe extern "C" fn HeapProfilerDump(reason: *const c_char) {
    let reason = if reason.is_null() {
        "HeapProfilerDump".into()
    } else {
        // SAFETY: the caller passes a NUL-terminated string.
        unsafe { CStr::from_ptr(reason) }.to_string_lossy()
    };
    if let Err(e) = dumps::dump(&reason) {
        cpuprof_core::say!("cpuprof: HeapProfilerDump: {e}");
    }
}

/// gperftools' `GetHeapProfile`: the profile so far as text, in a block from `malloc` that the
/// caller frees; NULL if no heap profile runs.
#[no_mangle]
pub extern "C" fn GetHeapProfile() -> *mut c_char {
    if !recorder::is_running() {
        return std::ptr::null_mut();
    }
    // The text is cpuprof's (not sampled); the block returned is the program's.
    let own = cpuprof_core::in_program::thread::own_work();
    let mut text = Vec::new();
    if cpuprof_core::heap::profile().write_text(&mut text).is_err() {
        return std::ptr::null_mut();
    }
    drop(own);
    let out = malloc(text.len() + 1).cast::<u8>();
    if !out.is_null() {
        // SAFETY: `out` holds text.len() + 1 bytes.
        unsafe {
            std::ptr::copy_nonoverlapping(text.as_ptr(), out, text.len());
            out.add(text.len()).write(0);
        }
    }
    out.cast()
}
