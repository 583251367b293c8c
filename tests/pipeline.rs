//! The engine without signals: chains recorded in the table, drained and harvested into the
//! writer, come out as exactly the expected bytes.

use cpuprof::format::{Profile, ProfileWriter, SlotFormat};
use cpuprof::table::{CallChainTable, TableConfig};

fn write_profile(table: &CallChainTable) -> Vec<u8> {
    let mut w = ProfileWriter::new(Vec::new(), SlotFormat::LE64, 10_000).unwrap();
    let mut write = |count: u64, pcs: &[u64]| w.write_record(count, pcs).unwrap();
    table.drain_evicted(&mut write);
    table.harvest(&mut write);
    w.finish(b"00400000-00401000 r-xp 00000000 00:00 0 /bin/x\n").unwrap()
}

fn slots(bytes: &[u8]) -> Vec<u64> {
    bytes
        .chunks(8)
        .map(|c| u64::from_le_bytes(c.try_into().unwrap()))
        .collect()
}

#[test]
fn one_known_sample_merged_from_five_signals() {
    let table = CallChainTable::new(TableConfig::default());
    for _ in 0..3 {
        table.record(&[0x401010, 0x402020, 0x403030], 1);
    }
    table.record(&[0x401010, 0x402020, 0x403030], 2);
    let bytes = write_profile(&table);
    let records_end = 8 * (5 + 5 + 3);
    assert_eq!(
        slots(&bytes[..records_end]),
        vec![0, 3, 0, 10_000, 0, 5, 3, 0x401010, 0x402020, 0x403030, 0, 1, 0]
    );
    assert_eq!(
        &bytes[records_end..],
        b"00400000-00401000 r-xp 00000000 00:00 0 /bin/x\n"
    );
}

#[test]
fn evicted_and_resident_records_of_one_chain_sum_in_the_reader() {
    // One bucket, one way: every new chain evicts the previous one.
    let table = CallChainTable::new(TableConfig {
        buckets: 1,
        ways: 1,
        max_depth: 8,
        ring_slots: 1024,
    });
    for _ in 0..3 {
        table.record(&[0x10, 0x20], 2);
        table.record(&[0x30], 1);
    }
    let profile = Profile::parse(&write_profile(&table)).unwrap();
    assert_eq!(profile.records, 6);
    let mut samples: Vec<_> = profile.samples.iter().map(|s| (s.pcs.clone(), s.count)).collect();
    samples.sort();
    assert_eq!(samples, vec![(vec![0x10, 0x20], 6), (vec![0x30], 3)]);
}
