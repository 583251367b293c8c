//! `.eh_frame_hdr`: where `.eh_frame` is, and the binary-search table of function starts.
//!
//! Both look-ups read only the header's bytes (a copy, or a slice of any memory the caller
//! vouches for), and neither allocates, locks, formats nor panics: the table look-up runs in
//! stack walks ([`crate::unwind`]).

/// Header version 1, the only one.
const VERSION: u8 = 1;
const ABSPTR: u8 = 0x00;
const UDATA4: u8 = 0x03;
const UDATA8: u8 = 0x04;
const PCREL_SDATA4: u8 = 0x1b;
/// `DW_EH_PE_datarel | DW_EH_PE_sdata4`: the table encoding GNU ld, gold, lld and mold write.
const DATAREL_SDATA4: u8 = 0x3b;

/// The link-time address of `.eh_frame` from the header `hdr`, itself at link-time address
/// `hdr_address` (pointer encoded pc-relative 4 bytes, as linkers write it, or absolute).
pub fn eh_frame_address(hdr: &[u8], hdr_address: u64) -> Option<u64> {
    if hdr.first() != Some(&VERSION) {
        return None;
    }
    let field = hdr.get(4..)?;
    match *hdr.get(1)? {
        PCREL_SDATA4 => Some(
            hdr_address
                .wrapping_add(4)
                .wrapping_add_signed(i64::from(i32::from_le_bytes(field.get(..4)?.try_into().ok()?))),
        ),
        UDATA4 => Some(u64::from(u32::from_le_bytes(field.get(..4)?.try_into().ok()?))),
        UDATA8 | ABSPTR => Some(u64::from_le_bytes(field.get(..8)?.try_into().ok()?)),
        _ => None,
    }
}

/// The start of the function holding `pc`: the greatest initial location at or below `pc`
/// in the search table of the header `hdr` (at address `hdr_address`; `pc` and the result in
/// the same terms). `None` if the table is in another encoding than every linker writes
/// (count `udata4`, entries `datarel sdata4`), is cut short, or starts above `pc`.
/// A binary search over the bytes: no allocation, no panic.
pub fn function_start(hdr: &[u8], hdr_address: u64, pc: u64) -> Option<u64> {
    if hdr.first() != Some(&VERSION) || hdr.get(2) != Some(&UDATA4) || hdr.get(3) != Some(&DATAREL_SDATA4) {
        return None;
    }
    // The pointer to .eh_frame is 4 bytes in every encoding ld writes with this table
    // encoding (pcrel or datarel sdata4, udata4).
    let count = u32::from_le_bytes(*hdr.get(8..12)?.first_chunk()?) as usize;
    let table = hdr.get(12..12usize.checked_add(count.checked_mul(8)?)?)?;
    let start = |i: usize| -> Option<u64> {
        let rel = i32::from_le_bytes(*table.get(8 * i..)?.first_chunk()?);
        Some(hdr_address.wrapping_add_signed(i64::from(rel)))
    };
    // The entries are sorted by initial location: the last one at or below `pc`.
    let (mut low, mut high) = (0, count);
    while low < high {
        let mid = low + (high - low) / 2;
        if start(mid)? <= pc {
            low = mid + 1;
        } else {
            high = mid;
        }
    }
    start(low.checked_sub(1)?)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A header at `hdr_address` listing functions at `starts`.
    pub(crate) fn header(hdr_address: u64, starts: &[u64]) -> Vec<u8> {
        let mut hdr = vec![1, PCREL_SDATA4, UDATA4, DATAREL_SDATA4];
        hdr.extend_from_slice(&0i32.to_le_bytes());
        hdr.extend_from_slice(&(starts.len() as u32).to_le_bytes());
        for &s in starts {
            hdr.extend_from_slice(&((s as i64 - hdr_address as i64) as i32).to_le_bytes());
            hdr.extend_from_slice(&0i32.to_le_bytes());
        }
        hdr
    }

    #[test]
    fn function_starts_come_from_the_table() {
        let hdr = header(0x3000, &[0x1000, 0x1100, 0x1800]);
        assert_eq!(function_start(&hdr, 0x3000, 0x1000), Some(0x1000));
        assert_eq!(function_start(&hdr, 0x3000, 0x10ff), Some(0x1000));
        assert_eq!(function_start(&hdr, 0x3000, 0x1234), Some(0x1100));
        assert_eq!(function_start(&hdr, 0x3000, 0x1fff), Some(0x1800));
        assert_eq!(function_start(&hdr, 0x3000, 0xfff), None);
        // Cut short, or another encoding: nothing, no panic.
        for cut in 0..hdr.len() {
            assert_eq!(function_start(&hdr[..cut], 0x3000, 0x1234), None);
        }
        let mut other = hdr.clone();
        other[3] = PCREL_SDATA4;
        assert_eq!(function_start(&other, 0x3000, 0x1234), None);
        let mut huge = hdr;
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert_eq!(function_start(&huge, 0x3000, 0x1234), None);
    }

    #[test]
    fn eh_frame_pointer_encodings() {
        let hdr = [1, 0x1b, 0x03, 0x3b, 0xfc, 0xff, 0xff, 0xff];
        assert_eq!(eh_frame_address(&hdr, 0x1000), Some(0x1000));
        assert_eq!(
            eh_frame_address(&[1, 0x03, 0, 0, 0x78, 0x56, 0x34, 0x12], 0),
            Some(0x12345678)
        );
        assert_eq!(eh_frame_address(&[2, 0x1b, 0, 0, 0, 0, 0, 0], 0), None);
        assert_eq!(eh_frame_address(&[1, 0x1b], 0), None);
    }
}
