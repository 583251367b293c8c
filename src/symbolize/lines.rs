//! Source lines for the endpoint's protobuf, from an object's own DWARF line tables
//! (`.debug_line`, with `.debug_line_str` for DWARF 5 file names), read in-process with gimli.
//!
//! Affordable only with bounds, measured (release build, 2000 addresses): the line programs
//! of glibc (1.2 MiB of `.debug_line`, 291k rows) take 55 ms, cpuprof's own debug CLI (3.8 MiB,
//! 602k rows) 131 ms: ~25 MiB/s. A large C++ program built with -g has tens of MiB, seconds of
//! the profiled program's CPU per request. So:
//! * Memory: the section is read one line program (one compilation unit) at a time, never
//!   whole; what is kept is the sorted addresses asked about and their answers.
//! * Time: an object whose `.debug_line` is over [`MAX_DEBUG_LINE`] gets no lines, and one
//!   request reads at most [`MAX_DEBUG_LINE_PER_REQUEST`] in all, first come first served.
//! * Compressed sections (`SHF_COMPRESSED`, Debian's debug files) and separate debug files are
//!   not read: the CLI does that offline.
//!
//! The line is the innermost one at the address: for code inlined into the function the
//! symbol names, it is the inlined code's file and line (inline frames are not read).

use gimli::{AttributeValue, DebugLine, DebugLineOffset, DebugLineStr, EndianSlice, LittleEndian};

/// Largest `.debug_line` read for one object (~0.6 s at the measured rate).
pub(crate) const MAX_DEBUG_LINE: u64 = 16 << 20;
/// Most `.debug_line` bytes read for one profile request, over all objects.
pub(crate) const MAX_DEBUG_LINE_PER_REQUEST: u64 = 32 << 20;

/// File offset and size of a section.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Section {
    pub(crate) offset: u64,
    pub(crate) size: u64,
}

/// For each of `addresses` (link-time, sorted ascending), the file and line the line tables
/// give, if any. `read(offset, len)` reads the object's file.
pub(crate) fn lines(
    read: &dyn Fn(u64, u64) -> Option<Vec<u8>>,
    debug_line: Section,
    debug_line_str: Option<Section>,
    addresses: &[u64],
) -> Vec<Option<(String, u64)>> {
    let mut answers: Vec<Option<(String, u64)>> = vec![None; addresses.len()];
    if debug_line.size > MAX_DEBUG_LINE {
        return answers;
    }
    let line_str = debug_line_str.and_then(|s| read(s.offset, s.size)).unwrap_or_default();
    let line_str = DebugLineStr::new(&line_str, LittleEndian);
    let mut at = 0u64;
    while at < debug_line.size {
        let Some(offset) = debug_line.offset.checked_add(at) else {
            break;
        };
        // The unit's length, 32-bit or (after 0xffffffff) 64-bit DWARF.
        let Some(head) = read(offset, 12.min(debug_line.size - at)) else {
            break;
        };
        let length = match head.get(..4).map(|b| u32::from_le_bytes(b.try_into().unwrap())) {
            Some(0xffff_ffff) => head
                .get(4..12)
                .map(|b| u64::from_le_bytes(b.try_into().unwrap()))
                .and_then(|l| l.checked_add(12)),
            Some(l) if l < 0xffff_fff0 => Some(u64::from(l) + 4),
            _ => None,
        };
        let Some(length) = length.filter(|&l| l <= debug_line.size - at) else {
            break;
        };
        let Some(unit) = read(offset, length) else {
            break;
        };
        at += length;
        unit_lines(&unit, line_str, addresses, &mut answers);
    }
    answers
}

/// Runs one line program, answering the addresses it covers that have no answer yet.
fn unit_lines(
    unit: &[u8],
    line_str: DebugLineStr<EndianSlice<'_, LittleEndian>>,
    addresses: &[u64],
    answers: &mut [Option<(String, u64)>],
) {
    let Ok(program) = DebugLine::new(unit, LittleEndian).program(DebugLineOffset(0), 8, None, None) else {
        return;
    };
    let mut rows = program.rows();
    // The row that holds from its address up to the next row's, within one sequence.
    let mut previous: Option<(u64, u64, u64)> = None;
    // Addresses answered by this program and their file index; the line goes into `answers`
    // at once (claiming the address), the file's name once the program has run.
    let mut hits: Vec<(usize, u64)> = Vec::new();
    while let Ok(Some((_, row))) = rows.next_row() {
        let address = row.address();
        if let Some((from, file, line)) = previous.filter(|&(from, _, _)| from < address) {
            let first = addresses.partition_point(|&a| a < from);
            let end = addresses.partition_point(|&a| a < address);
            for (i, answer) in answers.iter_mut().enumerate().take(end).skip(first) {
                if answer.is_none() {
                    *answer = Some((String::new(), line));
                    hits.push((i, file));
                }
            }
        }
        previous = (!row.end_sequence()).then(|| (address, row.file_index(), row.line().map_or(0, |l| l.get())));
    }
    let header = rows.header();
    for (i, file) in hits {
        if let Some((name, _)) = &mut answers[i] {
            *name = file_name(header, file, line_str);
        }
    }
}

/// The path of file `index` of a line program: its directory joined to its name unless the
/// name is absolute; empty when the names are elsewhere (`.debug_str`, not read here).
fn file_name(
    header: &gimli::LineProgramHeader<EndianSlice<'_, LittleEndian>>,
    index: u64,
    line_str: DebugLineStr<EndianSlice<'_, LittleEndian>>,
) -> String {
    let text = |value: AttributeValue<EndianSlice<'_, LittleEndian>>| match value {
        AttributeValue::String(s) => Some(s.to_string_lossy().into_owned()),
        AttributeValue::DebugLineStrRef(offset) => {
            line_str.get_str(offset).ok().map(|s| s.to_string_lossy().into_owned())
        }
        _ => None,
    };
    let Some(file) = header.file(index) else {
        return String::new();
    };
    let Some(name) = text(file.path_name()) else {
        return String::new();
    };
    if name.starts_with('/') {
        return name;
    }
    match file.directory(header).and_then(text) {
        Some(dir) if !dir.is_empty() => format!("{}/{name}", dir.trim_end_matches('/')),
        _ => name,
    }
}
