//! DWARF CFI stack walking with `framehop`, for code built without frame pointers.
//!
//! A [`DwarfUnwinder`] is an immutable snapshot of the loaded objects (executable, shared
//! libraries, vDSO) with its own copies of their `.eh_frame_hdr` and `.eh_frame`: a library
//! unloaded with `dlclose` while a walk runs cannot take the tables away. It is built outside
//! signal context ([`DwarfUnwinder::build`], which takes the loader lock through
//! `dl_iterate_phdr`); the sampler publishes it and swaps in a new one when the set of loaded
//! objects changes. Walks claim a preallocated framehop cache from the snapshot's pool, so
//! nothing allocates or locks during a walk; every stack read goes through [`StackReader`].
//! Where no CFI covers a PC (JIT code, stripped tables), framehop follows the frame pointer.
//! On x86-64, frames whose CFA is defined from rbx (ld.so's lazy-binding stubs), which framehop
//! would walk by frame pointer, are stepped here instead ([`crate::arch::x86_64::rbx_cfa`]). framehop's
//! unwinder for the architecture comes from [`crate::arch::dwarf`].

#[cfg(target_arch = "x86_64")]
use super::frame_records::{self, FunctionStarts};
use super::stack_reader::StackReader;
use super::Registers;
use crate::arch::dwarf::{unwind_regs, Cache, Unwinder as ArchUnwinder};
#[cfg(target_arch = "x86_64")]
use crate::arch::x86_64::rbx_cfa::{Lookup, RbxTables, RbxTablesBuilder};
use crate::claim_pool::ClaimPool;
use framehop::{ExplicitModuleSectionInfo, FrameAddress, Module, MustNotAllocateDuringUnwind, Unwinder};
use std::ffi::{c_int, c_void, CStr};

type Policy = MustNotAllocateDuringUnwind;

/// Unwinder caches per snapshot: more handlers at once than this walk without a cache.
const CACHES: usize = 16;

pub struct DwarfUnwinder {
    unwinder: ArchUnwinder<Vec<u8>, Policy>,
    caches: ClaimPool<Cache<Policy>>,
    /// The highest code address of the modules (aarch64 strips pointer authentication with it).
    max_code_address: u64,
    /// Frames framehop cannot step (CFA from rbx: ld.so's binding stubs) and how to follow rbx.
    #[cfg(target_arch = "x86_64")]
    rbx: RbxTables,
    /// Code ranges of the modules, sorted: a PC stepped from rbx must land in one.
    #[cfg(target_arch = "x86_64")]
    texts: Vec<std::ops::Range<u64>>,
    /// Where each function starts, to prove a frame record found without rbp.
    #[cfg(target_arch = "x86_64")]
    starts: FunctionStarts,
    /// `dl_iterate_phdr`'s load and unload counters when this snapshot was taken.
    generation: (u64, u64),
    modules: usize,
    table_bytes: usize,
}

impl DwarfUnwinder {
    /// Snapshots the unwind tables of every loaded object. Not for signal context.
    pub fn build() -> DwarfUnwinder {
        let mut unwinder = ArchUnwinder::new();
        let mut modules = 0;
        let mut table_bytes = 0;
        #[cfg(target_arch = "x86_64")]
        let mut rbx = RbxTablesBuilder::new();
        let mut texts = Vec::new();
        #[cfg(target_arch = "x86_64")]
        let mut starts = FunctionStarts::default();
        let generation = for_each_object(|object| {
            #[cfg(target_arch = "x86_64")]
            let module = object_module(object, &mut rbx);
            #[cfg(not(target_arch = "x86_64"))]
            let module = object_module(object);
            if let Some((module, bytes, (hdr_address, hdr))) = module {
                modules += 1;
                table_bytes += bytes + hdr.len();
                texts.push(module.avma_range());
                #[cfg(target_arch = "x86_64")]
                starts.add(module.avma_range(), hdr_address, hdr);
                #[cfg(not(target_arch = "x86_64"))]
                let _ = (hdr_address, hdr);
                unwinder.add_module(module);
            }
        });
        texts.sort_by_key(|r| r.start);
        let max_code_address = texts.iter().map(|r| r.end).max().unwrap_or(0);
        DwarfUnwinder {
            unwinder,
            caches: ClaimPool::new(CACHES, CACHES, Cache::new_in),
            max_code_address,
            #[cfg(target_arch = "x86_64")]
            rbx: rbx.finish(),
            #[cfg(target_arch = "x86_64")]
            texts,
            #[cfg(target_arch = "x86_64")]
            starts,
            generation,
            modules,
            table_bytes,
        }
    }

    /// Whether objects were loaded or unloaded since this snapshot was taken.
    pub fn is_stale(&self) -> bool {
        loaded_objects_generation() != self.generation
    }

    pub fn module_count(&self) -> usize {
        self.modules
    }

    /// Bytes of unwind tables this snapshot owns.
    pub fn table_bytes(&self) -> usize {
        self.table_bytes
    }

    /// Walks the stack interrupted at `regs.sp`, read through `stack`, into `out` (PC first);
    /// `None` if all caches are in use, in which case the caller walks frame pointers instead.
    /// `without_rbp`: `regs.fp` is not known (a thread blocked in the kernel), and a frame
    /// that needs it is stepped by its proven frame record ([`super::frame_records`]) - a
    /// scan that reads up to a page of stack and is not for signal handlers.
    /// Async-signal-safe.
    #[cfg(target_arch = "x86_64")]
    pub fn walk(&self, regs: Registers, stack: &mut StackReader, out: &mut [u64], without_rbp: bool) -> Option<usize> {
        if out.is_empty() || regs.pc == 0 {
            return Some(0);
        }
        let mut cache = self.caches.claim()?;
        let mut state = unwind_regs(&regs, self.max_code_address);
        // The rbx of the frame being stepped, while it is known (see `rbx_cfa`).
        let mut rbx = regs.rbx;
        let mut address = FrameAddress::from_instruction_pointer(regs.pc);
        out[0] = regs.pc;
        let mut n = 1;
        while n < out.len() {
            let mut read = |addr: u64| stack.read(addr).ok_or(());
            let lookup = if self.rbx.is_empty() {
                Lookup::Untracked
            } else {
                self.rbx.lookup(address.address_for_lookup())
            };
            let next = match lookup {
                Lookup::Tracked(Some(row)) if row.cfa_from_rbx.is_some() => {
                    self.step_from_rbx(row, &mut rbx, &mut state, &mut read)
                }
                _ => {
                    let next = self.unwinder.unwind_frame(address, &mut state, &mut cache, &mut read);
                    let next = match next {
                        // framehop reads rbp 0 as the end of the frame chain.
                        Err(_) | Ok(None) if without_rbp => self
                            .step_by_frame_record(address, &mut state, stack)
                            .map_or(next, |ret| Ok(Some(ret))),
                        next => next,
                    };
                    // framehop set sp to this frame's CFA; recover the caller's rbx from it.
                    rbx = match lookup {
                        Lookup::Untracked => None,
                        Lookup::Tracked(None) => rbx,
                        Lookup::Tracked(Some(row)) => {
                            row.rbx_at.and_then(|at| stack.read(state.sp().wrapping_add_signed(at)))
                        }
                    };
                    next.ok().flatten()
                }
            };
            match next.and_then(FrameAddress::from_return_address) {
                Some(ret) if ret.address() >= 4096 => {
                    out[n] = ret.address();
                    n += 1;
                    address = ret;
                }
                _ => break,
            }
        }
        Some(n)
    }

    /// Walks the stack interrupted at `regs.sp`, read through `stack`, into `out` (PC first);
    /// `None` if all caches are in use, in which case the caller walks frame pointers instead.
    /// framehop takes the first frame's caller from LR where the CFI says it is still there,
    /// and strips pointer authentication from return addresses. `_without_rbp`: a blocked
    /// thread's frame-pointer frames are not recovered here (x86-64's frame-record proof decodes
    /// x86 calls), so such a walk ends at the first frame that needs x29. Async-signal-safe.
    #[cfg(not(target_arch = "x86_64"))]
    pub fn walk(&self, regs: Registers, stack: &mut StackReader, out: &mut [u64], _without_rbp: bool) -> Option<usize> {
        if out.is_empty() || regs.pc == 0 {
            return Some(0);
        }
        let mut cache = self.caches.claim()?;
        let mut read = |addr: u64| stack.read(addr).ok_or(());
        let mut state = unwind_regs(&regs, self.max_code_address);
        let mut address = FrameAddress::from_instruction_pointer(regs.pc);
        out[0] = regs.pc;
        let mut n = 1;
        while n < out.len() {
            let next = self.unwinder.unwind_frame(address, &mut state, &mut cache, &mut read);
            let next = match next {
                // framehop ends the walk at a frame record whose saved x29 is 0 (the root a
                // thread's entry makes) without its return address: clone's thread_start
                // below start_thread. Taken here from that record.
                Ok(None) => {
                    let fp = state.fp();
                    match (read(fp), fp.checked_add(8).map(&mut read)) {
                        (Ok(0), Some(Ok(ret))) if fp != 0 => {
                            let ret = crate::arch::return_address(ret);
                            if ret >= 4096 {
                                out[n] = ret;
                                n += 1;
                            }
                        }
                        _ => {}
                    }
                    break;
                }
                next => next.ok().flatten(),
            };
            match next.and_then(FrameAddress::from_return_address) {
                Some(ret) if ret.address() >= 4096 => {
                    out[n] = ret.address();
                    n += 1;
                    address = ret;
                }
                _ => break,
            }
        }
        Some(n)
    }
}

#[cfg(target_arch = "x86_64")]
impl DwarfUnwinder {
    /// Steps a frame whose CFA may need the rbp a blocked thread's walk does not have, by its
    /// frame record if one is proven; the caller's return address, or `None`. Kept out of
    /// `walk`'s loop (never inlined, rarely taken): inlined, its registers crowded the loop that
    /// every sample runs, which then kept the return address in memory (issue 26: 3-7 % of the
    /// handler's cost on deep stacks).
    #[cold]
    #[inline(never)]
    fn step_by_frame_record(
        &self,
        address: FrameAddress,
        state: &mut crate::arch::dwarf::UnwindRegs,
        stack: &mut StackReader,
    ) -> Option<u64> {
        let (cfa, ret, caller_rbp) =
            frame_records::find(&self.starts, address.address_for_lookup(), state.sp(), stack, |pc| {
                self.is_code(pc)
            })?;
        state.set_sp(cfa);
        state.set_bp(caller_rbp);
        state.set_ip(ret);
        Some(ret)
    }

    /// Steps a frame whose CFA is `rbx + k` (`row`); `None` ends the walk: rbx unknown, or a
    /// result that is not a caller's frame (CFA not above sp, return address outside code).
    /// Never inlined into `walk`'s loop, for the reason given at `step_by_frame_record`.
    #[inline(never)]
    fn step_from_rbx(
        &self,
        row: crate::arch::x86_64::rbx_cfa::Row,
        rbx: &mut Option<u64>,
        state: &mut crate::arch::dwarf::UnwindRegs,
        read: &mut impl FnMut(u64) -> Result<u64, ()>,
    ) -> Option<u64> {
        let cfa = rbx.and_then(|rbx| rbx.checked_add_signed(row.cfa_from_rbx?))?;
        if cfa <= state.sp() {
            return None;
        }
        let ret = read(cfa.wrapping_add_signed(row.ra_at)).ok()?;
        if !self.is_code(ret.wrapping_sub(1)) {
            return None;
        }
        let slot = |at: Option<i64>, read: &mut dyn FnMut(u64) -> Result<u64, ()>| {
            at.and_then(|at| read(cfa.wrapping_add_signed(at)).ok())
        };
        let bp = slot(row.rbp_at, read).unwrap_or(state.bp());
        *rbx = match row.rbx_at {
            Some(at) => slot(Some(at), read),
            None => *rbx,
        };
        state.set_sp(cfa);
        state.set_bp(bp);
        state.set_ip(ret);
        Some(ret)
    }

    /// Whether `pc` lies in a loaded module's code. Async-signal-safe.
    fn is_code(&self, pc: u64) -> bool {
        let i = self.texts.partition_point(|r| r.start <= pc);
        i.checked_sub(1).is_some_and(|i| self.texts[i].contains(&pc))
    }

    #[cfg(test)]
    pub(crate) fn rbx_tables(&self) -> &RbxTables {
        &self.rbx
    }
}

/// `dl_iterate_phdr`'s (loads, unloads) counters. Not for signal context.
pub fn loaded_objects_generation() -> (u64, u64) {
    let mut generation = (0, 0);
    unsafe extern "C" fn first(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        let info = &*info;
        *(data as *mut (u64, u64)) = (info.dlpi_adds, info.dlpi_subs);
        1
    }
    // SAFETY: the callback only reads the info glibc passes and writes our local.
    unsafe { libc::dl_iterate_phdr(Some(first), &mut generation as *mut _ as *mut c_void) };
    generation
}

/// Calls `f` for every loaded object; returns the (loads, unloads) counters.
fn for_each_object(mut f: impl FnMut(&libc::dl_phdr_info)) -> (u64, u64) {
    struct State<'a> {
        f: &'a mut dyn FnMut(&libc::dl_phdr_info),
        generation: (u64, u64),
    }
    unsafe extern "C" fn each(info: *mut libc::dl_phdr_info, _size: usize, data: *mut c_void) -> c_int {
        let state = &mut *(data as *mut State);
        let info = &*info;
        state.generation = (info.dlpi_adds, info.dlpi_subs);
        (state.f)(info);
        0
    }
    let mut state = State {
        f: &mut f,
        generation: (0, 0),
    };
    // SAFETY: the callback gets our State back through `data`; glibc holds the loader lock
    // while it runs, so the objects' memory stays mapped while we copy from it.
    unsafe { libc::dl_iterate_phdr(Some(each), &mut state as *mut State as *mut c_void) };
    state.generation
}

/// A copy of an object's `.eh_frame_hdr` and the address it was at.
type HeaderCopy = (u64, Vec<u8>);

/// A framehop module for one loaded object, with copies of its unwind tables, their size, and
/// another copy of `.eh_frame_hdr` with its address (for function starts). Rows that concern
/// rbx go to `rbx` (see `rbx_cfa`).
fn object_module(
    object: &libc::dl_phdr_info,
    #[cfg(target_arch = "x86_64")] rbx: &mut RbxTablesBuilder,
) -> Option<(Module<Vec<u8>>, usize, HeaderCopy)> {
    // SAFETY: glibc passes dlpi_phnum program headers at dlpi_phdr.
    let headers = unsafe { std::slice::from_raw_parts(object.dlpi_phdr, object.dlpi_phnum as usize) };
    let bias = object.dlpi_addr;
    let hdr = headers.iter().find(|h| h.p_type == libc::PT_GNU_EH_FRAME)?;
    let code = headers
        .iter()
        .filter(|h| h.p_type == libc::PT_LOAD && h.p_flags & libc::PF_X != 0);
    let text_start = code.clone().map(|h| h.p_vaddr).min()?;
    let text_end = code.map(|h| h.p_vaddr + h.p_memsz).max()?;

    let hdr_svma = hdr.p_vaddr..hdr.p_vaddr + hdr.p_memsz;
    let eh_frame_hdr = copy_memory(bias + hdr.p_vaddr, hdr.p_memsz);
    let eh_frame_svma_start = crate::elf::eh_frame_hdr::eh_frame_address(&eh_frame_hdr, hdr.p_vaddr)?;
    // The header does not give .eh_frame's length: take the rest of the segment holding it.
    let segment = headers.iter().find(|h| {
        h.p_type == libc::PT_LOAD && h.p_vaddr <= eh_frame_svma_start && eh_frame_svma_start < h.p_vaddr + h.p_filesz
    })?;
    let eh_frame_len = segment.p_vaddr + segment.p_filesz - eh_frame_svma_start;
    let eh_frame = copy_memory(bias + eh_frame_svma_start, eh_frame_len);

    // SAFETY: dlpi_name is a NUL-terminated string (empty for the main program).
    let name = unsafe { CStr::from_ptr(object.dlpi_name) }
        .to_string_lossy()
        .into_owned();
    let bytes = eh_frame_hdr.len() + eh_frame.len();
    // Only the dynamic loader's binding stubs define the CFA from rbx (none in libc, libm,
    // libstdc++, libgcc_s, libcrypto, python3.11 here), and reading an object's whole
    // .eh_frame costs: reading every object (once each) took python importing 15 extension
    // modules from 0.35 s to 3.3 s of CPU in a debug build, ld.so alone to 0.55 s.
    // SAFETY: getauxval has no preconditions.
    #[cfg(target_arch = "x86_64")]
    if bias == unsafe { libc::getauxval(libc::AT_BASE) } {
        rbx.add(&name, &eh_frame, eh_frame_svma_start, bias, text_start..text_end);
    }
    let info = ExplicitModuleSectionInfo {
        base_svma: 0,
        text_svma: Some(text_start..text_end),
        eh_frame_hdr_svma: Some(hdr_svma),
        eh_frame_hdr: Some(eh_frame_hdr),
        eh_frame_svma: Some(eh_frame_svma_start..eh_frame_svma_start + eh_frame_len),
        eh_frame: Some(eh_frame),
        ..Default::default()
    };
    let hdr_copy = (bias + hdr.p_vaddr, info.eh_frame_hdr.clone().unwrap_or_default());
    Some((
        Module::new(name, bias + text_start..bias + text_end, bias, info),
        bytes,
        hdr_copy,
    ))
}

fn copy_memory(addr: u64, len: u64) -> Vec<u8> {
    // SAFETY: callers pass ranges inside segments of a loaded object, mapped while the loader
    // lock is held.
    unsafe { std::slice::from_raw_parts(addr as *const u8, len as usize) }.to_vec()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn snapshot_covers_the_executable_and_libc() {
        let unwinder = DwarfUnwinder::build();
        assert!(unwinder.module_count() >= 3, "{} modules", unwinder.module_count());
        assert!(unwinder.table_bytes() > 10_000);
        assert!(!unwinder.is_stale());
    }

    /// Walks this function's own stack (DWARF with `unwinder`, else frame pointers) while it is
    /// live: the registers are this function's, not those of a callee that has returned,
    /// whose frame the walk's own calls would overwrite.
    #[inline(never)]
    fn walk_from_here(unwinder: Option<&DwarfUnwinder>, out: &mut [u64]) -> usize {
        let regs = crate::arch::calling_registers();
        let mut window = [0; 64];
        let mut stack = StackReader::new(regs.sp, None, &mut window);
        let n = match unwinder {
            Some(unwinder) => unwinder.walk(regs, &mut stack, out, false).unwrap(),
            None => crate::unwind::walk(regs, &mut stack, out),
        };
        std::hint::black_box(n)
    }

    #[test]
    fn walks_through_std_to_the_thread_entry() {
        let _fd = crate::unwind::safe_read::for_tests();
        let unwinder = DwarfUnwinder::build();
        let mut out = [0u64; 128];
        let n = walk_from_here(Some(&unwinder), &mut out);
        // The test harness runs us on a std thread: the walk must get through Rust's std (no
        // frame pointers) down to libc's thread start.
        assert!(n >= 8, "only {n} frames");
        let dwarf = out[..n].to_vec();
        let fp_n = walk_from_here(None, &mut out);
        assert!(
            n >= fp_n,
            "DWARF walk ({n}: {dwarf:x?}) should not be shorter than the frame-pointer walk ({fp_n}: {:x?})",
            &out[..fp_n]
        );
    }

    /// A sample interrupted in ld.so's binding stub, on a made-up stack: the caller comes from
    /// rbx when rbx and the frame it gives are sound, and the walk stops otherwise.
    #[test]
    #[cfg(target_arch = "x86_64")]
    fn binding_stub_frames_step_from_rbx_or_not_at_all() {
        let _fd = crate::unwind::safe_read::for_tests();
        let unwinder = DwarfUnwinder::build();
        let stub = unwinder.rbx_tables().stub_row().expect("ld.so's stub");
        let (k, ra_at, rbx_at) = (stub.cfa_from_rbx.unwrap(), stub.ra_at, stub.rbx_at.unwrap());
        let caller = walks_through_std_to_the_thread_entry as *const () as u64 + 1;
        let mut mem = vec![0u64; 64];
        let base = mem.as_ptr() as u64;
        let rbx = base + 8 * 16;
        let cfa = rbx.wrapping_add_signed(k);
        let slot = |at: i64| (cfa.wrapping_add_signed(at) - base) as usize / 8;
        mem[slot(ra_at)] = caller;
        mem[slot(rbx_at)] = 0x1234;
        let walk = |rbx: Option<u64>, out: &mut [u64]| {
            let regs = Registers {
                pc: stub.start,
                sp: base,
                fp: 0,
                rbx,
            };
            let mut window = [0; 64];
            unwinder
                .walk(regs, &mut StackReader::new(base, None, &mut window), out, false)
                .unwrap()
        };
        let mut out = [0u64; 8];
        assert!(walk(Some(rbx), &mut out) >= 2);
        assert_eq!(&out[..2], &[stub.start, caller]);

        // rbx unknown, below sp, or pointing at a frame whose return address is not code.
        assert_eq!(walk(None, &mut out), 1);
        assert_eq!(walk(Some(base - 4096), &mut out), 1);
        mem[slot(ra_at)] = 0x4141_4141_4141_4141;
        assert_eq!(walk(Some(rbx), &mut out), 1);
    }
}
