//! Context-switch records: the user registers of threads whose `/proc/self/task/TID/syscall`
//! the process can no longer open.
//!
//! A process that changes its credentials (`setuid`, `setgid`, ...) stops being dumpable, and
//! then every file of `/proc/self/task/TID/` belongs to root; `syscall` is mode 0400, so the
//! now unprivileged process cannot open it for any of its threads, not even a thread for
//! itself through `/proc/thread-self`. Measured on Linux 6.18 (`perf_event_paranoid` 2), after
//! `setgid`+`setuid` from root to nobody:
//!
//! | source | threads from before the change | threads started after it |
//! |---|---|---|
//! | `syscall` opened before the change, read after | the line (the check at read time passes for its own thread group) | — |
//! | `syscall` opened after (by path, through a kept `/proc/self/task` directory, by the thread itself) | `EACCES` | `EACCES` |
//! | `stat`, `schedstat`, `wchan`, `status` (mode 0444) | readable | readable; `stat`'s `kstkeip`/`kstkesp` are 0 |
//! | `/proc/self/mem` opened before the change / after | readable / `EACCES` | same |
//! | `process_vm_readv` of its own memory | works | works |
//! | `perf_event_open` on its own thread, context switches, `exclude_kernel` | opens, never records a switch (a switch happens in the kernel) | same |
//! | the same without `exclude_kernel` | `EACCES` (paranoid 2) | `EACCES` |
//! | opened as root before the change, per CPU, `inherit` | user registers (IP, SP, BP) at each switch-out, equal to the `syscall` line's | the same, through inheritance: threads and their threads started after the change |
//!
//! So the credential-change interposers ([`super::privileges`]) open, while the process can,
//! one context-switch event per CPU on every thread of the program: a software event counting
//! `context-switches` (kernel included, as only a privileged process may ask), sampling every
//! switch-out with the thread id and the user registers, inherited by the threads each thread
//! starts (`inherit_thread`: not by forked processes). A per-thread inherited event cannot be
//! mapped (`EINVAL`), so the events are per CPU, all of a CPU's writing into one ring buffer
//! (`PERF_EVENT_IOC_SET_OUTPUT`). The records hold nothing of the kernel: the thread ids and
//! user registers of the process's own threads, which it could read itself.
//!
//! The wall sampler drains the buffers every tick and keeps each thread's newest switch-out
//! ([`SwitchRecords`]). A thread found blocked (`stat`) is where its newest switch-out left it:
//! the registers are walked as a `syscall` line's are. Records the kernel drops (a full buffer)
//! make every thread's newest record uncertain: it still counts for a thread whose CPU clock has
//! not moved since a look that trusted it, and for no other (a lost record means its thread ran).
//!
//! The records carry no system call number on x86-64 (`rax` holds `-ENOSYS` during a call;
//! `orig_ax` is not among perf's registers): it is taken from `syscall` lines seen at the same
//! PC, else from the instruction before the PC (`mov $N, %eax` or `xor %eax, %eax` right
//! before `syscall`, glibc's wrappers), else the sample says `blocked:unknown`. On aarch64 the
//! number is in x8.
//!
//! Cost: the kernel writes a ~48-byte record at every context switch of the program's threads
//! (measured in docs/PERFORMANCE.md); there are none of these events unless a credential
//! change happens during a wall-clock profile.

use crate::format::sample_context::UNKNOWN_SYSCALL;
use crate::in_program::fd::GuardedFd;
use crate::sampler::perf_event::{PerfEventAttr, ATTR_EXCLUDE_HV, PERF_FLAG_FD_CLOEXEC, PERF_TYPE_SOFTWARE};
use crate::unwind::Registers;
use std::collections::HashMap;
use std::io;
use std::os::fd::{FromRawFd, OwnedFd};
use std::sync::atomic::{AtomicU64, Ordering};

const PERF_COUNT_SW_CONTEXT_SWITCHES: u64 = 3;
const PERF_SAMPLE_TID: u64 = 1 << 1;
const PERF_SAMPLE_REGS_USER: u64 = 1 << 12;
const ATTR_INHERIT: u64 = 1 << 1;
const ATTR_INHERIT_THREAD: u64 = 1 << 35;
const ATTR_REMOVE_ON_EXEC: u64 = 1 << 36;
const PERF_EVENT_IOC_SET_OUTPUT: libc::c_ulong = 0x2405;
const PERF_RECORD_LOST: u32 = 2;
const PERF_RECORD_SAMPLE: u32 = 9;
/// `PERF_SAMPLE_REGS_ABI_NONE`: a record without user registers.
const REGS_ABI_NONE: u64 = 0;
/// Offsets of `data_head` and `data_tail` in `struct perf_event_mmap_page`.
const DATA_HEAD: usize = 1024;
const DATA_TAIL: usize = 1032;
const PAGE: usize = 4096;

/// Most event descriptors held: one per CPU per thread that had events opened on it.
pub const MAX_EVENTS: usize = 256;

#[cfg(target_arch = "x86_64")]
mod arch {
    use crate::unwind::Registers;

    /// perf's x86 register numbers: BP 6, SP 7, IP 8 (`asm/perf_regs.h`); a record holds
    /// them in that order.
    pub const MASK: u64 = 1 << 6 | 1 << 7 | 1 << 8;
    pub const COUNT: usize = 3;

    pub fn registers(r: &[u64; COUNT]) -> Registers {
        Registers::new(r[2], r[1], r[0])
    }

    /// Not in the record: `rax` holds `-ENOSYS` while a call runs, and `orig_ax` is not one of
    /// perf's registers.
    pub fn syscall_number(_r: &[u64; COUNT]) -> Option<u16> {
        None
    }
}

#[cfg(target_arch = "aarch64")]
mod arch {
    use crate::unwind::Registers;

    /// perf's arm64 register numbers: x8 (the system call number), x29, x30, SP 31, PC 32.
    pub const MASK: u64 = 1 << 8 | 1 << 29 | 1 << 30 | 1 << 31 | 1 << 32;
    pub const COUNT: usize = 5;

    pub fn registers(r: &[u64; COUNT]) -> Registers {
        Registers {
            pc: r[4],
            sp: r[3],
            fp: r[1],
            lr: Some(r[2]),
        }
    }

    pub fn syscall_number(r: &[u64; COUNT]) -> Option<u16> {
        u16::try_from(r[0]).ok().filter(|n| *n < super::UNKNOWN_SYSCALL)
    }
}

type UserRegs = [u64; arch::COUNT];

/// One CPU's ring buffer, written by every event of that CPU.
struct Buffer {
    cpu: i32,
    /// The event the buffer was mapped from (the others' output goes here).
    fd: GuardedFd,
    base: *mut u8,
    len: usize,
}

impl Drop for Buffer {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `open_buffer`, unmapped once.
        unsafe { libc::munmap(self.base.cast(), self.len) };
    }
}

/// The context-switch events opened at credential changes, and their buffers.
pub struct SwitchEvents {
    /// The process that opened them: a forked child has the descriptors but neither the
    /// events' threads nor the mappings (perf maps its buffers `VM_DONTCOPY`).
    pid: u32,
    buffers: Vec<Buffer>,
    /// Events writing into another event's buffer.
    events: Vec<GuardedFd>,
    /// Threads with events.
    covered: Vec<libc::pid_t>,
    /// The CPUs to open events on (online when the first events were opened).
    cpus: Vec<i32>,
    /// Data pages per buffer (a power of two).
    pages: usize,
    /// The attribute flags this kernel takes (`inherit_thread` and `remove_on_exec` since 5.13).
    flags: u64,
    /// Why events could not be opened, if they could not.
    pub refused: Option<String>,
    /// Threads present at a change that got no events (refused, or beyond [`MAX_EVENTS`]).
    pub uncovered: usize,
}

// SAFETY: the raw pointers are mappings of this process, used only under the owner's lock.
unsafe impl Send for SwitchEvents {}

impl SwitchEvents {
    pub fn new() -> SwitchEvents {
        let cpus = online_cpus();
        let pages = (256 / cpus.len().max(1)).clamp(4, 16).next_power_of_two().min(16);
        SwitchEvents {
            pid: std::process::id(),
            buffers: Vec::new(),
            events: Vec::new(),
            covered: Vec::new(),
            cpus,
            pages,
            flags: ATTR_INHERIT | ATTR_INHERIT_THREAD | ATTR_REMOVE_ON_EXEC | ATTR_EXCLUDE_HV,
            refused: None,
            uncovered: 0,
        }
    }

    /// Whether this process opened them (not its parent, before a fork).
    pub fn is_ours(&self) -> bool {
        self.pid == std::process::id()
    }

    /// Descriptors held.
    pub fn descriptors(&self) -> usize {
        self.buffers.len() + self.events.len()
    }

    /// Threads with events.
    pub fn covered(&self) -> usize {
        self.covered.len()
    }

    /// Opens events on each of `tids` that has none, in order (the thread changing credentials
    /// first: it is the one likely to start the program's threads), while the budget lasts.
    pub fn cover(&mut self, tids: &[libc::pid_t]) {
        if !self.is_ours() {
            return;
        }
        for &tid in tids {
            if self.covered.contains(&tid) {
                continue;
            }
            if self.refused.is_some() || self.descriptors() + self.cpus.len() > MAX_EVENTS {
                self.uncovered += 1;
                continue;
            }
            match self.open_on(tid) {
                Ok(true) => self.covered.push(tid),
                Ok(false) => {} // gone
                Err(e) => {
                    self.refused = Some(e.to_string());
                    self.uncovered += 1;
                }
            }
        }
    }

    /// Opens the events of `tid` on every CPU; `Ok(false)` if the thread is gone.
    fn open_on(&mut self, tid: libc::pid_t) -> io::Result<bool> {
        crate::sampler::thread_timers::perf_allowed_here()?;
        let mut opened = false;
        for cpu in self.cpus.clone() {
            let fd = match self.open_event(tid, cpu) {
                Ok(fd) => fd,
                Err(e) if e.raw_os_error() == Some(libc::ESRCH) => return Ok(opened),
                // Offline since listed: its threads run elsewhere.
                Err(e) if e.raw_os_error() == Some(libc::ENODEV) => continue,
                Err(e) => return Err(e),
            };
            match self.buffers.iter().find(|b| b.cpu == cpu) {
                Some(buffer) => {
                    // SAFETY: both descriptors are our perf events, on the same CPU.
                    if unsafe { libc::ioctl(fd.raw(), PERF_EVENT_IOC_SET_OUTPUT, buffer.fd.raw()) } != 0 {
                        return Err(io::Error::last_os_error());
                    }
                    self.events.push(fd);
                }
                None => {
                    let buffer = self.map(cpu, fd)?;
                    self.buffers.push(buffer);
                }
            }
            opened = true;
        }
        Ok(opened)
    }

    fn open_event(&mut self, tid: libc::pid_t, cpu: i32) -> io::Result<GuardedFd> {
        loop {
            let attr = PerfEventAttr {
                kind: PERF_TYPE_SOFTWARE,
                size: std::mem::size_of::<PerfEventAttr>() as u32,
                config: PERF_COUNT_SW_CONTEXT_SWITCHES,
                sample_period: 1,
                sample_type: PERF_SAMPLE_TID | PERF_SAMPLE_REGS_USER,
                flags: self.flags,
                sample_regs_user: arch::MASK,
                ..Default::default()
            };
            // SAFETY: perf_event_open with a valid attribute.
            let fd = unsafe {
                libc::syscall(
                    libc::SYS_perf_event_open,
                    &attr as *const PerfEventAttr,
                    tid,
                    cpu,
                    -1,
                    PERF_FLAG_FD_CLOEXEC,
                )
            } as i32;
            if fd >= 0 {
                // SAFETY: the descriptor just returned, ours alone.
                let owned = unsafe { OwnedFd::from_raw_fd(fd) };
                return GuardedFd::adopt(owned, "perf context-switch event");
            }
            let e = io::Error::last_os_error();
            let newer = ATTR_INHERIT_THREAD | ATTR_REMOVE_ON_EXEC;
            if matches!(e.raw_os_error(), Some(libc::EINVAL | libc::E2BIG)) && self.flags & newer != 0 {
                // Before 5.13: inherited by forked children too, whose records are ignored.
                self.flags &= !newer;
                continue;
            }
            return Err(e);
        }
    }

    fn map(&self, cpu: i32, fd: GuardedFd) -> io::Result<Buffer> {
        let len = (1 + self.pages) * PAGE;
        // SAFETY: maps the event's ring buffer; the kernel checks the size.
        let base = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.raw(),
                0,
            )
        };
        if base == libc::MAP_FAILED {
            return Err(io::Error::last_os_error());
        }
        Ok(Buffer {
            cpu,
            fd,
            base: base.cast(),
            len,
        })
    }

    /// Takes every record written since the last drain into `records`. The mappings stay
    /// valid even if the program closed the descriptors.
    pub fn drain(&mut self, records: &mut SwitchRecords) {
        if !self.is_ours() {
            return;
        }
        let mut lost = false;
        for buffer in &self.buffers {
            let size = (buffer.len - PAGE) as u64;
            // SAFETY: the header page of a live mapping; data_head is written by the kernel,
            // data_tail by us only.
            let (head_word, tail_word) = unsafe {
                (
                    &*(buffer.base.add(DATA_HEAD) as *const AtomicU64),
                    &*(buffer.base.add(DATA_TAIL) as *const AtomicU64),
                )
            };
            let head = head_word.load(Ordering::Acquire);
            let mut tail = tail_word.load(Ordering::Relaxed);
            let mut record = [0u8; 256];
            while tail < head {
                let copy = |at: u64, out: &mut [u8]| {
                    for (i, byte) in out.iter_mut().enumerate() {
                        // SAFETY: within the data pages of the mapping (offset modulo their size).
                        *byte = unsafe { *buffer.base.add(PAGE + ((at + i as u64) % size) as usize) };
                    }
                };
                copy(tail, &mut record[..8]);
                let kind = u32::from_ne_bytes(record[..4].try_into().unwrap());
                let len = usize::from(u16::from_ne_bytes(record[6..8].try_into().unwrap()));
                if len < 8 || len as u64 > head - tail {
                    tail = head; // not a record: skip what is there
                    break;
                }
                if len <= record.len() {
                    copy(tail, &mut record[..len]);
                    match kind {
                        PERF_RECORD_SAMPLE => records.note(&record[8..len]),
                        PERF_RECORD_LOST if len >= 24 => {
                            lost = true;
                            records.lost += u64::from_ne_bytes(record[16..24].try_into().unwrap());
                        }
                        _ => {}
                    }
                }
                tail += len as u64;
            }
            tail_word.store(tail, Ordering::Release);
        }
        if lost {
            records.lost_serial = records.serial;
        }
    }
}

/// The CPUs online now (`/sys/devices/system/cpu/online`, else 0..the online count).
fn online_cpus() -> Vec<i32> {
    let listed = std::fs::read_to_string("/sys/devices/system/cpu/online")
        .ok()
        .and_then(|text| parse_cpu_list(text.trim()));
    listed.unwrap_or_else(|| {
        // SAFETY: sysconf has no preconditions.
        let n = unsafe { libc::sysconf(libc::_SC_NPROCESSORS_ONLN) }.max(1);
        (0..n as i32).collect()
    })
}

/// `0-3,5,7-8` as a list of CPUs.
fn parse_cpu_list(text: &str) -> Option<Vec<i32>> {
    let mut cpus = Vec::new();
    for part in text.split(',') {
        match part.split_once('-') {
            Some((a, b)) => cpus.extend(a.parse::<i32>().ok()?..=b.parse::<i32>().ok()?),
            None => cpus.push(part.parse().ok()?),
        }
    }
    (!cpus.is_empty() && cpus.len() <= 4096).then_some(cpus)
}

/// Each thread's newest switch-out, as drained.
#[derive(Default)]
pub struct SwitchRecords {
    latest: HashMap<libc::pid_t, Latest>,
    /// Records taken so far; each record's `serial` is this count when it was taken.
    serial: u64,
    /// `serial` at the end of the last drain that found records lost: records up to it may
    /// not be their threads' newest.
    lost_serial: u64,
    /// Records the kernel reported lost.
    pub lost: u64,
}

struct Latest {
    regs: UserRegs,
    serial: u64,
    /// The thread's CPU time at a look that trusted this record: while the clock still reads
    /// this, the thread has not run, and no later switch-out can have been lost.
    trusted_cpu_ns: Option<u64>,
}

/// What the records say about a thread.
pub enum Lookup {
    /// Its newest switch-out: the registers to walk from, the system call number if the record
    /// has it, and the record's serial (compare with [`SwitchRecords::serial_of`] after the
    /// walk: another switch means the thread ran meanwhile).
    Found {
        regs: Registers,
        syscall: Option<u16>,
        serial: u64,
    },
    /// None of its switches was recorded.
    NoRecord,
    /// Records were lost since its newest, and it ran since.
    Lost,
}

impl SwitchRecords {
    /// Takes one sample record's body: `pid, tid`, the registers' ABI, the registers.
    fn note(&mut self, body: &[u8]) {
        let word = |i: usize| {
            body.get(i * 8..i * 8 + 8)
                .map(|b| u64::from_ne_bytes(b.try_into().unwrap()))
        };
        let (Some(ids), Some(abi)) = (word(0), word(1)) else {
            return;
        };
        if abi == REGS_ABI_NONE {
            return;
        }
        let mut regs = [0u64; arch::COUNT];
        for (i, r) in regs.iter_mut().enumerate() {
            let Some(value) = word(2 + i) else { return };
            *r = value;
        }
        // `pid` then `tid`, each 32 bits.
        let tid = (ids >> 32) as libc::pid_t;
        self.serial += 1;
        self.latest.insert(
            tid,
            Latest {
                regs,
                serial: self.serial,
                trusted_cpu_ns: None,
            },
        );
    }

    /// Where thread `tid`, found blocked with CPU time `cpu_ns`, was left by its newest switch.
    pub fn lookup(&mut self, tid: libc::pid_t, cpu_ns: u64) -> Lookup {
        let lost_serial = self.lost_serial;
        let Some(latest) = self.latest.get_mut(&tid) else {
            return Lookup::NoRecord;
        };
        if latest.serial > lost_serial {
            latest.trusted_cpu_ns = Some(cpu_ns);
        } else if latest.trusted_cpu_ns != Some(cpu_ns) {
            return Lookup::Lost;
        }
        Lookup::Found {
            regs: arch::registers(&latest.regs),
            syscall: arch::syscall_number(&latest.regs),
            serial: latest.serial,
        }
    }

    /// The registers of `tid`'s newest record if it left the thread at `pc` and `sp`: the frame
    /// pointer (and on aarch64 the link register) that a `syscall` line lacks.
    pub fn registers_at(&self, tid: libc::pid_t, pc: u64, sp: u64) -> Option<Registers> {
        let latest = self.latest.get(&tid)?;
        let regs = arch::registers(&latest.regs);
        (regs.pc == pc && regs.sp == sp).then_some(regs)
    }

    /// The serial of `tid`'s newest record.
    pub fn serial_of(&self, tid: libc::pid_t) -> Option<u64> {
        self.latest.get(&tid).map(|l| l.serial)
    }

    /// Forgets threads not in `live` (sorted).
    pub fn retain(&mut self, live: &[libc::pid_t]) {
        self.latest.retain(|tid, _| live.binary_search(tid).is_ok());
    }
}

/// The system call a thread stopped at `pc` is in, from the instruction before `pc`, which
/// follows a `syscall` (x86-64): `mov $N, %eax; syscall`, `xor %eax, %eax; syscall`, or glibc's
/// futex calls' `mov $N, %eax; xor $imm8, %sil; syscall`. `None` for anything else. Code bytes
/// are copied through the kernel (`safe_read`), never loaded.
pub fn syscall_before(pc: u64) -> Option<u16> {
    if !cfg!(target_arch = "x86_64") {
        return None;
    }
    let mut code = [0u8; 11];
    let start = pc.checked_sub(code.len() as u64)?;
    if crate::unwind::safe_read::copy_bytes(start, &mut code) != code.len() {
        return None;
    }
    decode_syscall(&code)
}

/// [`syscall_before`] on the 11 bytes before the PC.
fn decode_syscall(code: &[u8; 11]) -> Option<u16> {
    if code[9..] != [0x0f, 0x05] {
        return None;
    }
    let imm = |at: usize| u32::from_le_bytes(code[at..at + 4].try_into().unwrap());
    let number = if code[4] == 0xb8 {
        imm(5)
    } else if matches!(code[7..9], [0x31 | 0x33, 0xc0]) {
        0
    } else if code[0] == 0xb8 && code[5..8] == [0x40, 0x80, 0xf6] {
        imm(1)
    } else {
        return None;
    };
    u16::try_from(number).ok().filter(|n| *n < UNKNOWN_SYSCALL)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cpu_lists_are_read_as_the_kernel_writes_them() {
        assert_eq!(parse_cpu_list("0-3,5,7-8"), Some(vec![0, 1, 2, 3, 5, 7, 8]));
        assert_eq!(parse_cpu_list("0"), Some(vec![0]));
        assert_eq!(parse_cpu_list(""), None);
        assert_eq!(parse_cpu_list("x"), None);
        assert!(!online_cpus().is_empty());
    }

    #[test]
    fn system_calls_are_read_from_glibcs_wrappers_only() {
        // epoll_wait: mov 0xc(%rsp),%edi; mov $0xe8,%eax; syscall
        let epoll = [0x90, 0x90, 0x8b, 0x7c, 0x24, 0xb8, 0xe8, 0x00, 0x00, 0x0f, 0x05];
        assert_eq!(
            decode_syscall(&[0, 0, 0, 0, 0xb8, 0xe8, 0, 0, 0, 0x0f, 0x05]),
            Some(232)
        );
        assert_eq!(decode_syscall(&epoll), None, "b8 not where a mov would start");
        // read: xor %eax,%eax; syscall
        assert_eq!(decode_syscall(&[0, 0, 0, 0, 0, 0, 0, 0x31, 0xc0, 0x0f, 0x05]), Some(0));
        // futex: mov $0xca,%eax; xor $0x80,%sil; syscall
        let futex = [0xb8, 0xca, 0, 0, 0, 0x40, 0x80, 0xf6, 0x80, 0x0f, 0x05];
        assert_eq!(decode_syscall(&futex), Some(202));
        // Not after a syscall instruction, or a number no call has.
        assert_eq!(decode_syscall(&[0, 0, 0, 0, 0xb8, 1, 0, 0, 0, 0x0f, 0x04]), None);
        assert_eq!(decode_syscall(&[0, 0, 0, 0, 0xb8, 0, 0, 1, 0, 0x0f, 0x05]), None);
    }

    #[test]
    fn a_record_lost_after_a_threads_newest_distrusts_it_once_the_thread_has_run() {
        let body = |tid: u32, ip: u64| {
            let mut b = Vec::new();
            b.extend_from_slice(&((u64::from(tid) << 32) | 7).to_ne_bytes());
            b.extend_from_slice(&2u64.to_ne_bytes());
            for i in 0..arch::COUNT as u64 {
                b.extend_from_slice(&(ip + i).to_ne_bytes());
            }
            b
        };
        let mut records = SwitchRecords::default();
        records.note(&body(11, 0x1000));
        records.note(&body(12, 0x2000));
        assert!(matches!(records.lookup(11, 500), Lookup::Found { .. }));
        assert!(matches!(records.lookup(13, 500), Lookup::NoRecord));
        // Records lost: 11 trusted at CPU time 500 still counts while its clock reads 500.
        records.lost_serial = records.serial;
        assert!(matches!(records.lookup(11, 500), Lookup::Found { .. }));
        assert!(matches!(records.lookup(11, 501), Lookup::Lost));
        assert!(matches!(records.lookup(12, 9), Lookup::Lost), "never trusted");
        // A newer record is trusted again.
        records.note(&body(12, 0x3000));
        assert!(matches!(records.lookup(12, 10), Lookup::Found { serial, .. } if serial == records.serial));
        records.retain(&[12]);
        assert!(matches!(records.lookup(11, 500), Lookup::NoRecord));
    }

    #[test]
    fn a_record_without_user_registers_is_skipped() {
        let mut records = SwitchRecords::default();
        let mut b = Vec::new();
        b.extend_from_slice(&(5u64 << 32).to_ne_bytes());
        b.extend_from_slice(&REGS_ABI_NONE.to_ne_bytes());
        records.note(&b);
        assert!(matches!(records.lookup(5, 0), Lookup::NoRecord));
    }
}
