//! `list --disasm`: each listed function's instructions with the samples at each, or its
//! addresses when its code cannot be read.

use super::*;

/// Samples of `f` per address of its code: link-time addresses in their object (or, when
/// that is not read, the address in the process), laid out as `--disasm` lays them out.
pub(super) fn addresses(tally: &mut Tally, f: u32, out: &mut String) {
    let mut rows: Vec<(u64, Counts)> = tally
        .addresses
        .iter()
        .filter(|(&(function, _), _)| function == f)
        .map(|(&(_, addr), &c)| (addr, c))
        .collect();
    rows.sort_unstable_by_key(|&(addr, _)| addr);
    for (addr, c) in rows {
        let (at, object) = match tally.symbolizer.svma(tally.maps, addr) {
            Some((path, svma)) => (svma, crate::symbols::file_name(&path).to_string()),
            None => (addr, "(in no object read)".to_string()),
        };
        let _ = writeln!(out, "{:>10} {:>10} {at:>12x}: {object}", count(c.flat), count(c.cum));
    }
}

/// One stretch of a function's code: link-time start, bytes, and the samples at its
/// addresses (link-time).
struct Code {
    object: String,
    start: u64,
    bytes: Vec<u8>,
    samples: Vec<(u64, Counts)>,
}

/// Function `f`'s instructions with the samples at each: the addresses at which it is the
/// outermost frame (its own code, callees inlined into it included).
pub(super) fn disassembly(tally: &mut Tally, f: u32, out: &mut String) {
    routine(tally, f, "", out);
    let mut samples: Vec<(u64, Counts)> = tally
        .addresses
        .iter()
        .filter(|(&(function, _), _)| function == f)
        .map(|(&(_, addr), &c)| (addr, c))
        .collect();
    samples.sort_unstable_by_key(|&(addr, _)| addr);
    let mut code: Vec<Code> = Vec::new();
    let mut elsewhere = Counts::default();
    for (addr, c) in samples {
        let Some((object, svma)) = tally.symbolizer.svma(tally.maps, addr) else {
            elsewhere = sum(elsewhere, c);
            continue;
        };
        let known = code
            .iter()
            .position(|k| k.object == object && svma >= k.start && svma - k.start < k.bytes.len() as u64);
        let index = match known {
            Some(i) => i,
            None => match tally.symbolizer.function_code(&object, svma, MAX_CODE_BYTES) {
                Some((start, bytes, object::Architecture::X86_64)) if svma - start < bytes.len() as u64 => {
                    code.push(Code {
                        object,
                        start,
                        bytes,
                        samples: Vec::new(),
                    });
                    code.len() - 1
                }
                _ => {
                    elsewhere = sum(elsewhere, c);
                    continue;
                }
            },
        };
        code[index].samples.push((svma, c));
    }
    code.sort_by(|a, b| a.object.cmp(&b.object).then(a.start.cmp(&b.start)));
    let mut shown = Counts::default();
    for stretch in &code {
        let _ = writeln!(
            out,
            " {} at {:#x} ({} bytes)",
            stretch.object,
            stretch.start,
            stretch.bytes.len()
        );
        shown = sum(shown, disassemble(&mut tally.symbolizer, stretch, out));
    }
    if elsewhere.flat + elsewhere.cum > 0 {
        let _ = writeln!(
            out,
            " ({} flat, {} cum samples at addresses whose code could not be read (object missing or not x86-64))",
            elsewhere.flat, elsewhere.cum
        );
    }
    let _ = writeln!(
        out,
        " (the instructions' flat samples add up to {}: the function's own code, callees inlined into it included)",
        shown.flat
    );
}

fn sum(a: Counts, b: Counts) -> Counts {
    Counts {
        flat: a.flat.saturating_add(b.flat),
        cum: a.cum.saturating_add(b.cum),
    }
}

/// Prints the instructions of `code` with their samples (an address inside an instruction,
/// as a return address moved back into its call is, counts for it), each new source line
/// before its first instruction; returns the samples shown.
fn disassemble(symbolizer: &mut Symbolizer, code: &Code, out: &mut String) -> Counts {
    use iced_x86::{Decoder, DecoderOptions, Formatter, IntelFormatter};
    let mut decoder = Decoder::with_ip(64, &code.bytes, code.start, DecoderOptions::NONE);
    let mut formatter = IntelFormatter::new();
    let (mut text, mut samples, mut shown) = (String::new(), code.samples.iter().peekable(), Counts::default());
    let mut place = String::new();
    for instruction in &mut decoder {
        let (ip, next) = (instruction.ip(), instruction.next_ip());
        let mut c = Counts::default();
        while let Some(&(_, s)) = samples.next_if(|(svma, _)| *svma < next) {
            c = sum(c, s);
        }
        shown = sum(shown, c);
        if let Some(frame) = symbolizer
            .frames_at_svma(&code.object, ip)
            .and_then(|frames| frames.into_iter().next())
            .filter(|frame| frame.line > 0)
        {
            let here = format!("{}:{}", crate::symbols::file_name(&frame.file), frame.line);
            if here != place {
                let _ = writeln!(out, "{:>21} ; {here} ({})", "", frame.function);
                place = here;
            }
        }
        text.clear();
        formatter.format(&instruction, &mut text);
        let _ = writeln!(out, "{:>10} {:>10} {ip:>12x}: {text}", count(c.flat), count(c.cum));
    }
    shown
}
