//! Writes profiles in the legacy format to any `io::Write`.

use super::{SlotFormat, TRAILER};
use std::io::{self, Write};

/// Streams a profile: the header on creation, then records, then trailer and maps on `finish`.
///
/// Records are encoded into an internal buffer and handed to the sink one whole record per
/// `write_all` (one `write` call for sinks that take all of it), so a reader of a file cut
/// short by a crash sees only complete records, and a sink can cut a refused write back to a
/// record boundary.
pub struct ProfileWriter<W: Write> {
    sink: W,
    format: SlotFormat,
    scratch: Vec<u8>,
    bytes_written: u64,
    records_written: u64,
}

impl<W: Write> ProfileWriter<W> {
    /// Writes the five header slots `0, 3, 0, period_us, 0`.
    pub fn new(sink: W, format: SlotFormat, period_us: u64) -> io::Result<Self> {
        let mut w = ProfileWriter {
            sink,
            format,
            scratch: Vec::with_capacity(4096),
            bytes_written: 0,
            records_written: 0,
        };
        for slot in [0, 3, 0, period_us, 0] {
            format.put(slot, &mut w.scratch);
        }
        w.emit()?;
        Ok(w)
    }

    /// Writes one record. `pcs` must be non-empty and must not start with 0 (that would read as
    /// the trailer); counts above the slot width are split over several records.
    pub fn write_record(&mut self, count: u64, pcs: &[u64]) -> io::Result<()> {
        let (bytes, records) = record_size(self.format, count, pcs);
        if records == 0 {
            return Ok(());
        }
        self.scratch.resize(bytes, 0);
        encode_record(self.format, count, pcs, &mut self.scratch);
        self.emit()?;
        self.records_written += records;
        Ok(())
    }

    /// Counts records and bytes that reached the sink without this writer (a process's first
    /// records, written from a signal handler before it had a writer thread).
    pub fn note_written_elsewhere(&mut self, records: u64, bytes: u64) {
        self.records_written += records;
        self.bytes_written += bytes;
    }

    /// Records handed to the sink so far: the ordinal the next record will have.
    pub fn records_written(&self) -> u64 {
        self.records_written
    }

    /// Writes the trailer and the maps text, flushes, and returns the sink.
    pub fn finish(mut self, maps_text: &[u8]) -> io::Result<W> {
        self.write_trailer(maps_text)?;
        Ok(self.sink)
    }

    /// Writes the trailer and the maps text (handed to the sink as one write) and flushes,
    /// keeping the sink for its owner to close (see [`into_inner`](Self::into_inner)).
    pub fn write_trailer(&mut self, maps_text: &[u8]) -> io::Result<()> {
        for slot in TRAILER {
            self.format.put(slot, &mut self.scratch);
        }
        self.scratch.extend_from_slice(maps_text);
        self.emit()?;
        self.sink.flush()
    }

    /// The sink, to look at what it holds.
    pub fn get_ref(&self) -> &W {
        &self.sink
    }

    /// The sink, to update what it knows.
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.sink
    }

    /// The sink, whatever state the profile is in.
    pub fn into_inner(self) -> W {
        self.sink
    }

    /// Flushes the sink so that every record written so far reaches the file.
    pub fn flush(&mut self) -> io::Result<()> {
        self.sink.flush()
    }

    /// Forgets what was handed to the sink after `bytes` (a trailer the sink took back).
    pub fn rewind_to(&mut self, bytes: u64) {
        self.bytes_written = bytes.min(self.bytes_written);
    }

    /// Bytes handed to the sink so far, header included.
    pub fn bytes_written(&self) -> u64 {
        self.bytes_written
    }

    fn emit(&mut self) -> io::Result<()> {
        let result = self.sink.write_all(&self.scratch);
        if result.is_ok() {
            self.bytes_written += self.scratch.len() as u64;
        }
        self.scratch.clear();
        result
    }
}

/// The bytes and the records that [`encode_record`] writes for `count` samples of `pcs`: none
/// when there is nothing to write (no samples, no PCs, or a first PC of 0, which would read as
/// the trailer); several records when the count is wider than a slot.
pub fn record_size(format: SlotFormat, count: u64, pcs: &[u64]) -> (usize, u64) {
    if count == 0 || pcs.is_empty() || pcs[0] == 0 {
        return (0, 0);
    }
    let records = count.div_ceil(format.max_value());
    (records as usize * (2 + pcs.len()) * format.size, records)
}

/// Encodes the records for `count` samples of `pcs` (`count, depth, pc...`, the count split
/// over several records when wider than a slot) at the start of `out`, which must hold
/// [`record_size`] bytes; returns the bytes written. Async-signal-safe.
pub fn encode_record(format: SlotFormat, count: u64, pcs: &[u64], out: &mut [u8]) -> usize {
    if record_size(format, count, pcs).1 == 0 {
        return 0;
    }
    let mut at = 0;
    let mut put = |value: u64| {
        format.put_into(value, &mut out[at..]);
        at += format.size;
    };
    let mut left = count;
    while left > 0 {
        let chunk = left.min(format.max_value());
        put(chunk);
        put(pcs.len() as u64);
        for &pc in pcs {
            put(pc);
        }
        left -= chunk;
    }
    at
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::format::ByteOrder;

    fn slots(bytes: &[u8], format: SlotFormat) -> Vec<u64> {
        bytes.chunks(format.size).map(|c| format.get(c)).collect()
    }

    #[test]
    fn empty_profile_is_header_then_trailer_then_maps() {
        let w = ProfileWriter::new(Vec::new(), SlotFormat::LE64, 10000).unwrap();
        let out = w.finish(b"maps\n").unwrap();
        assert_eq!(out.len(), 8 * 8 + 5);
        assert_eq!(slots(&out[..64], SlotFormat::LE64), vec![0, 3, 0, 10000, 0, 0, 1, 0]);
        assert_eq!(&out[64..], b"maps\n");
    }

    #[test]
    fn every_slot_format_encodes_the_same_slots() {
        for format in [SlotFormat::LE64, SlotFormat::BE64, SlotFormat::LE32, SlotFormat::BE32] {
            let mut w = ProfileWriter::new(Vec::new(), format, 2500).unwrap();
            w.write_record(5, &[0xa0000, 0xc0000, 0xe0000]).unwrap();
            let out = w.finish(b"").unwrap();
            assert_eq!(
                slots(&out, format),
                vec![0, 3, 0, 2500, 0, 5, 3, 0xa0000, 0xc0000, 0xe0000, 0, 1, 0],
                "{format:?}"
            );
        }
        let mut be = Vec::new();
        SlotFormat {
            size: 4,
            order: ByteOrder::Big,
        }
        .put(0x2710, &mut be);
        assert_eq!(be, [0, 0, 0x27, 0x10]);
    }

    #[test]
    fn counts_wider_than_a_slot_are_split() {
        let mut w = ProfileWriter::new(Vec::new(), SlotFormat::LE32, 1).unwrap();
        w.write_record(u32::MAX as u64 + 7, &[0x10]).unwrap();
        let out = w.finish(b"").unwrap();
        assert_eq!(
            slots(&out, SlotFormat::LE32),
            vec![0, 3, 0, 1, 0, u32::MAX as u64, 1, 0x10, 7, 1, 0x10, 0, 1, 0]
        );
    }

    #[test]
    fn records_that_would_read_as_a_trailer_are_not_written() {
        let mut w = ProfileWriter::new(Vec::new(), SlotFormat::LE64, 1).unwrap();
        w.write_record(3, &[0, 0x10]).unwrap();
        w.write_record(0, &[0x10]).unwrap();
        w.write_record(3, &[]).unwrap();
        assert_eq!(w.bytes_written(), 40);
    }
}
