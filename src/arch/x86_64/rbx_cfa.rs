//! Frames whose CFA is computed from rbx (x86-64 specific, like everything it knows).
//!
//! ld.so's lazy-binding stubs (`_dl_runtime_resolve_xsave{,c}`, `_dl_runtime_profile`) copy
//! the entry rsp into rbx, align rsp down for `xsave`, and describe their frame as
//! `CFA = rbx + k`. framehop tracks only rip, rsp and rbp: it walks such a frame by frame
//! pointer, and rbp there is whatever the program's frameless code left in it, so the chain
//! past the stub was a stack address and then ASCII bytes (12 of 56 samples reached `main`).
//!
//! When a snapshot is built, [`RbxTablesBuilder::add`] reads a module's `.eh_frame` and, if
//! any row has an rbx-based CFA, keeps that module's rows that concern rbx: where the CFA is
//! rbx-based, and where rbx is saved in the frame. During a walk the caller asks
//! [`RbxTables::lookup`] for each frame: the stub's frame is stepped here from rbx, and other
//! frames of such a module tell how to recover the caller's rbx, so a sample taken deep in the
//! symbol lookup below the stub still gets through it. Where rbx is not known (a frame of
//! another module came between) the walk stops at the stub rather than guessing.

use crate::sync::Mutex;
use gimli::{
    BaseAddresses, CallFrameInstruction, CfaRule, CieOrFde, EhFrame, EndianSlice, LittleEndian, RegisterRule,
    UnwindContext, UnwindSection, X86_64,
};
use std::ops::Range;
use std::sync::Arc;

/// What one CFI row of a tracked module says about rbx, at absolute addresses.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Row {
    pub start: u64,
    pub end: u64,
    /// `CFA = rbx + offset`.
    pub cfa_from_rbx: Option<i64>,
    /// The caller's rbx is at `CFA + offset`.
    pub rbx_at: Option<i64>,
    /// The caller's rbp is at `CFA + offset` (only kept for rows with an rbx-based CFA).
    pub rbp_at: Option<i64>,
    /// The return address is at `CFA + offset` (only meaningful with an rbx-based CFA).
    pub ra_at: i64,
}

/// What the tables say about the frame at a lookup address.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Lookup {
    /// Not in a tracked module: nothing is known about how this frame treats rbx.
    Untracked,
    /// In a tracked module; `None` when no row mentions rbx (rbx is the caller's).
    Tracked(Option<Row>),
}

/// Identifies a loaded object across snapshots: name, load bias, `.eh_frame` address and size.
type ObjectKey = (String, u64, u64, usize);

/// What earlier snapshots of this process found in the objects still loaded (`None`: nothing
/// about rbx). A snapshot is rebuilt at every `dlopen` and `dlclose`; evaluating ld.so's rows
/// again each time would repeat the same work (python importing 15 extension modules
/// rebuilds 7 times).
static SEEN: Mutex<Vec<(ObjectKey, Option<Arc<ModuleRows>>)>> = Mutex::new(Vec::new());

/// The cache's lock, held across `fork` (`session::children`).
pub(crate) fn fork_lock() -> &'static dyn crate::sync::ForkLock {
    &SEEN
}

struct ModuleRows {
    text: Range<u64>,
    /// Sorted by `start`, not overlapping.
    rows: Vec<Row>,
}

/// The tracked modules of one snapshot, sorted by text address.
#[derive(Default)]
pub struct RbxTables {
    modules: Vec<Arc<ModuleRows>>,
}

/// Builds the [`RbxTables`] of a snapshot, one object at a time. Not for signal context.
pub struct RbxTablesBuilder {
    tables: RbxTables,
    previous: Vec<(ObjectKey, Option<Arc<ModuleRows>>)>,
    seen: Vec<(ObjectKey, Option<Arc<ModuleRows>>)>,
}

impl RbxTablesBuilder {
    /// Call outside `dl_iterate_phdr`: takes a lock the loader lock must not be held under.
    #[allow(clippy::new_without_default)] // `new` takes a lock: not a plain default value.
    pub fn new() -> Self {
        RbxTablesBuilder {
            tables: RbxTables::default(),
            previous: std::mem::take(&mut *SEEN.lock()),
            seen: Vec::new(),
        }
    }

    /// Adds one object: `eh_frame` at stated address `eh_frame_svma`, loaded at `bias`.
    pub fn add(&mut self, name: &str, eh_frame: &[u8], eh_frame_svma: u64, bias: u64, text_svma: Range<u64>) {
        let key = (name.to_string(), bias, eh_frame_svma, eh_frame.len());
        let rows = match self.previous.iter().position(|(k, _)| *k == key) {
            Some(i) => self.previous.swap_remove(i).1,
            None => read_module(eh_frame, eh_frame_svma, bias, text_svma).map(Arc::new),
        };
        if let Some(rows) = &rows {
            let at = self.tables.modules.partition_point(|m| m.text.start < rows.text.start);
            self.tables.modules.insert(at, rows.clone());
        }
        self.seen.push((key, rows));
    }

    /// The tables; remembers what was read for the next snapshot (objects no longer loaded
    /// are forgotten). Call outside `dl_iterate_phdr`.
    pub fn finish(self) -> RbxTables {
        *SEEN.lock() = self.seen;
        self.tables
    }
}

/// Reads one object's `.eh_frame` (stated address `eh_frame_svma`, loaded at `bias`): its rbx
/// rows if it has an rbx-based CFA anywhere.
fn read_module(eh_frame: &[u8], eh_frame_svma: u64, bias: u64, text_svma: Range<u64>) -> Option<ModuleRows> {
    let section = EhFrame::new(eh_frame, LittleEndian);
    let bases = BaseAddresses::default().set_eh_frame(eh_frame_svma);
    // Evaluating every row of every module costs more than the snapshot itself (a large
    // share of a debug build's startup with python's dozens of objects); scanning the
    // instructions first leaves all but ld.so alone.
    if !defines_cfa_from_rbx(&section, &bases) {
        return None;
    }
    let mut context = Box::new(UnwindContext::new());
    let mut rows = Vec::new();
    let mut any_rbx_cfa = false;
    let mut entries = section.entries(&bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else { continue };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
            continue;
        };
        let Ok(mut table) = fde.rows(&section, &bases, &mut context) else {
            continue;
        };
        while let Ok(Some(row)) = table.next_row() {
            let cfa_from_rbx = match row.cfa() {
                CfaRule::RegisterAndOffset { register, offset } if *register == X86_64::RBX => Some(*offset),
                _ => None,
            };
            let at = |register| match row.register(register) {
                Some(RegisterRule::Offset(offset)) => Some(offset),
                _ => None,
            };
            let rbx_at = at(X86_64::RBX);
            if cfa_from_rbx.is_none() && rbx_at.is_none() {
                continue;
            }
            any_rbx_cfa |= cfa_from_rbx.is_some();
            rows.push(Row {
                start: bias.wrapping_add(row.start_address()),
                end: bias.wrapping_add(row.end_address()),
                cfa_from_rbx,
                rbx_at,
                rbp_at: cfa_from_rbx.and(at(X86_64::RBP)),
                ra_at: at(X86_64::RA).unwrap_or(-8),
            });
        }
    }
    if !any_rbx_cfa {
        return None;
    }
    rows.sort_by_key(|r| r.start);
    let text = bias + text_svma.start..bias + text_svma.end;
    Some(ModuleRows { text, rows })
}

impl RbxTables {
    /// The first row with an rbx-based CFA.
    #[cfg(test)]
    pub(crate) fn stub_row(&self) -> Option<Row> {
        self.modules
            .iter()
            .flat_map(|m| m.rows.iter())
            .find(|r| r.cfa_from_rbx.is_some())
            .copied()
    }

    pub fn is_empty(&self) -> bool {
        self.modules.is_empty()
    }

    /// The rbx row covering `address` (a PC, or a return address minus one).
    /// Async-signal-safe: binary searches only.
    pub fn lookup(&self, address: u64) -> Lookup {
        let i = self.modules.partition_point(|m| m.text.start <= address);
        let Some(module) = i.checked_sub(1).map(|i| &self.modules[i]) else {
            return Lookup::Untracked;
        };
        if !module.text.contains(&address) {
            return Lookup::Untracked;
        }
        let j = module.rows.partition_point(|r| r.start <= address);
        let row = j.checked_sub(1).map(|j| module.rows[j]).filter(|r| address < r.end);
        Lookup::Tracked(row)
    }
}

/// Whether any FDE of `section` makes rbx the CFA register.
fn defines_cfa_from_rbx(section: &EhFrame<EndianSlice<LittleEndian>>, bases: &BaseAddresses) -> bool {
    let mut entries = section.entries(bases);
    while let Ok(Some(entry)) = entries.next() {
        let CieOrFde::Fde(partial) = entry else { continue };
        let Ok(fde) = partial.parse(EhFrame::cie_from_offset) else {
            continue;
        };
        let mut instructions = fde.instructions(section, bases);
        while let Ok(Some(instruction)) = instructions.next() {
            if let CallFrameInstruction::DefCfa { register, .. } | CallFrameInstruction::DefCfaRegister { register } =
                instruction
            {
                if register == X86_64::RBX {
                    return true;
                }
            }
        }
    }
    false
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The loader's own tables: its binding stubs are the rows this module exists for.
    #[test]
    fn finds_the_loaders_binding_stub() {
        let unwinder = crate::unwind::DwarfUnwinder::build();
        let tables = unwinder.rbx_tables();
        assert!(!tables.is_empty(), "no rbx-based CFA in ld.so");
        let stub = tables.stub_row().unwrap();
        assert_eq!(tables.lookup(stub.start), Lookup::Tracked(Some(stub)));
        assert_eq!(stub.ra_at, -8);
        assert!(stub.rbx_at.is_some(), "the stub saves the caller's rbx: {stub:?}");
        assert_eq!(tables.lookup(1), Lookup::Untracked);
    }
}
