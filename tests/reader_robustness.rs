//! Property test of the profile reader on arbitrary and damaged input, run in CI in place of a
//! fuzzer: random bytes, and valid profiles of every slot format truncated, bit-flipped and
//! spliced. The reader must never panic (nor hang, nor allocate without bound), every error
//! must carry a byte offset inside the input, and the lenient reader must return every record
//! before the defect.

use cpuprof::format::{Profile, ProfileWriter, SlotFormat};

/// xorshift64*: deterministic, so a failure reproduces from its iteration number.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545f4914f6cdd1d)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn valid_profile(rng: &mut Rng, format: SlotFormat) -> (Vec<u8>, usize) {
    let mut w = ProfileWriter::new(Vec::new(), format, 1 + rng.below(100_000) as u64).unwrap();
    let records = rng.below(40);
    for _ in 0..records {
        let pcs: Vec<u64> = (0..1 + rng.below(30))
            .map(|_| 1 + (rng.next() & format.max_value() >> 1))
            .collect();
        w.write_record(1 + rng.below(1000) as u64, &pcs).unwrap();
    }
    let maps =
        b"00400000-00452000 r-xp 00000000 08:02 173521 /usr/bin/app\n7fff0000-7fff1000 rw-p 00000000 00:00 0 [stack]\n";
    (w.finish(maps).unwrap(), records)
}

fn check(bytes: &[u8], what: &str) {
    match Profile::parse(bytes) {
        Ok(p) => assert!(p.records <= bytes.len(), "{what}"),
        Err(e) => {
            assert!(
                e.offset <= bytes.len(),
                "{what}: error offset {} past the end ({})",
                e.offset,
                bytes.len()
            );
            assert!(
                e.to_string().contains(&format!("at byte offset {}", e.offset)),
                "{what}: {e}"
            );
        }
    }
    if let Ok((p, defect)) = Profile::parse_lenient(bytes) {
        if let Some(e) = defect {
            assert!(e.offset <= bytes.len(), "{what}: lenient offset {}", e.offset);
        }
        assert!(p.samples.iter().all(|s| !s.pcs.is_empty()), "{what}");
    }
}

#[test]
fn arbitrary_bytes_never_panic() {
    let mut rng = Rng(0x9e3779b97f4a7c15);
    for i in 0..20_000 {
        let len = rng.below(512);
        let mut bytes: Vec<u8> = (0..len).map(|_| rng.next() as u8).collect();
        // Give a quarter of them a valid-looking header so the record parser is reached.
        if i % 4 == 0 && len >= 40 {
            bytes[..40].copy_from_slice(&[
                0, 0, 0, 0, 0, 0, 0, 0, 3, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 0, 16, 39, 0, 0, 0, 0, 0, 0, 0, 0,
                0, 0, 0, 0, 0, 0,
            ]);
        }
        check(&bytes, &format!("random input {i}"));
    }
}

#[test]
fn damaged_profiles_of_every_format_never_panic() {
    let mut rng = Rng(42);
    for i in 0..20_000 {
        let format = [SlotFormat::LE64, SlotFormat::BE64, SlotFormat::LE32, SlotFormat::BE32][i % 4];
        let (mut bytes, records) = valid_profile(&mut rng, format);
        let intact = Profile::parse(&bytes).unwrap_or_else(|e| panic!("{format}: {e}"));
        assert_eq!(intact.records, records);
        match rng.below(4) {
            0 => bytes.truncate(rng.below(bytes.len())),
            1 => {
                for _ in 0..1 + rng.below(4) {
                    let at = rng.below(bytes.len());
                    bytes[at] ^= 1 << rng.below(8);
                }
            }
            2 => {
                // A huge depth in some record's slot: must not be trusted for allocation.
                let at = rng.below(bytes.len() / format.size) * format.size;
                bytes[at..at + format.size].fill(0x7f);
            }
            _ => {
                let (other, _) = valid_profile(&mut rng, format);
                let cut = rng.below(bytes.len());
                bytes.truncate(cut);
                bytes.extend_from_slice(&other[rng.below(other.len())..]);
            }
        }
        check(&bytes, &format!("damaged {format} profile {i}"));
    }
}

#[test]
fn truncation_keeps_every_whole_record_before_the_cut() {
    let mut rng = Rng(7);
    let (bytes, records) = valid_profile(&mut rng, SlotFormat::LE64);
    let whole = Profile::parse(&bytes).unwrap();
    assert!(records > 0);
    // Cut inside the trailer: every record is still there, and the defect is located.
    let trailer_at = bytes.len() - whole_maps_len(&bytes) - 24;
    let (p, defect) = Profile::parse_lenient(&bytes[..trailer_at + 8]).unwrap();
    assert_eq!(p.records, whole.records);
    assert!(defect.expect("a missing trailer").offset >= trailer_at - 8);
}

fn whole_maps_len(bytes: &[u8]) -> usize {
    let text = bytes.windows(9).position(|w| w == b"00400000-").unwrap();
    bytes.len() - text
}
