//! Counts as users read them: CPU samples as plain numbers, a heap profile's bytes scaled as
//! pprof scales them (`150.15MB`: powers of 1024, two decimals, `.00` dropped) and its objects
//! as plain numbers, a contention profile's delays in pprof's units of time (`5.97s`). pprof prints a whole table in one unit, chosen from its smallest value
//! and its total ([`Scale::for_table`]), so `top` of a heap profile prints the same strings as
//! `go tool pprof -top` of it.

use crate::model::unit::Unit;

/// pprof's units of memory (`internal/measurement`): name and bytes.
const BYTES: [(&str, f64); 6] = [
    ("B", 1.0),
    ("kB", 1024.0),
    ("MB", 1048576.0),
    ("GB", 1073741824.0),
    ("TB", 1099511627776.0),
    ("PB", 1125899906842624.0),
];

/// pprof's units of time for nanosecond values: name and nanoseconds.
const TIME: [(&str, f64); 4] = [("ns", 1.0), ("us", 1e3), ("ms", 1e6), ("s", 1e9)];

/// The unit of `units` pprof would print `value` in: the largest no bigger than it (the
/// smallest for 0), its name and its size.
fn unit_in(units: &'static [(&'static str, f64)], value: u64) -> (&'static str, f64) {
    units
        .iter()
        .rev()
        .find(|(_, f)| value as f64 / f >= 1.0)
        .copied()
        .unwrap_or(units[0])
}

/// The unit pprof would print `value` bytes in: the largest no bigger than it (bytes for 0),
/// its name and its size in bytes.
pub fn bytes_unit(value: u64) -> (&'static str, f64) {
    unit_in(&BYTES, value)
}

/// `value` nanoseconds in the unit that suits it (`1.50ms`).
pub fn nanoseconds(value: u64) -> String {
    Scale::of(&TIME, value).label(value)
}

/// `value` bytes in the unit that suits it (`512kB`).
pub fn bytes(value: u64) -> String {
    Scale::of_bytes(value).label(value)
}

/// How the values of one table are printed.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Scale {
    /// Plain numbers (samples, objects, waits).
    Plain,
    /// Bytes or nanoseconds divided by `factor`, followed by `name`.
    Bytes { name: &'static str, factor: f64 },
}

/// The units values of `unit` are printed in, if it has any.
fn units_of(unit: Unit) -> Option<&'static [(&'static str, f64)]> {
    if unit.is_bytes() {
        Some(&BYTES)
    } else if unit.is_nanoseconds() {
        Some(&TIME)
    } else {
        None
    }
}

impl Scale {
    /// The unit of `units` that suits `value`.
    fn of(units: &'static [(&'static str, f64)], value: u64) -> Scale {
        let (name, factor) = unit_in(units, value);
        Scale::Bytes { name, factor }
    }

    /// The unit of [`bytes_unit`].
    fn of_bytes(value: u64) -> Scale {
        Scale::of(&BYTES, value)
    }

    /// Each value of `unit` printed on its own, in the unit that suits it.
    pub fn label_alone(unit: Unit, value: u64) -> String {
        match units_of(unit) {
            Some(units) => Scale::of(units, value).label(value),
            None => value.to_string(),
        }
    }

    /// One unit for a table of `unit` whose smallest non-zero value is `smallest` (0: none)
    /// and whose total is `total`, chosen as pprof's text reports choose it: the unit of the
    /// smallest value, or, when that is below a hundredth of the total and the total has a
    /// larger unit, the unit of a hundred times the smallest.
    pub fn for_table(unit: Unit, smallest: u64, total: u64) -> Scale {
        let Some(units) = units_of(unit) else {
            return Scale::Plain;
        };
        let smallest = if smallest == 0 { total } else { smallest };
        let (low, high) = (Scale::of(units, smallest), Scale::of(units, total));
        if low != high && smallest.saturating_mul(100) < total {
            Scale::of(units, smallest.saturating_mul(100))
        } else {
            low
        }
    }

    /// `value` in this unit: pprof's `%.2f` with a trailing `.00` dropped, `0` for nothing.
    pub fn label(self, value: u64) -> String {
        match self {
            Scale::Plain => value.to_string(),
            Scale::Bytes { name, factor } => {
                let text = format!("{:.2}", value as f64 / factor);
                let text = text.strip_suffix(".00").unwrap_or(&text);
                if text == "0" {
                    "0".to_string()
                } else {
                    format!("{text}{name}")
                }
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use cpuprof::format::heap::HeapValue;

    const SPACE: Unit = Unit::Heap {
        value: HeapValue::InuseSpace,
        period: 524288,
    };

    #[test]
    fn bytes_read_as_pprof_prints_them() {
        let alone = |n| Scale::label_alone(SPACE, n);
        assert_eq!(alone(0), "0");
        assert_eq!(alone(500), "500B");
        assert_eq!(alone(1024), "1kB");
        assert_eq!(alone(1536), "1.50kB");
        // Ties round to even, as Go's %.2f does: 1.125 kB.
        assert_eq!(alone(1152), "1.12kB");
        assert_eq!(alone(3 << 30), "3GB");
        let objects = Unit::Heap {
            value: HeapValue::AllocObjects,
            period: 524288,
        };
        assert_eq!(Scale::label_alone(objects, 205000), "205000");
        assert_eq!(Scale::label_alone(Unit::Samples, 12), "12");
    }

    #[test]
    fn a_table_takes_one_unit_as_pprof_chooses_it() {
        // go tool pprof -top: 300.29MB of 1201.17MB stays in MB (not a hundredth of the total).
        let mb = 1u64 << 20;
        let table = Scale::for_table(SPACE, 300 * mb, 1201 * mb);
        assert_eq!(table.label(1201 * mb + mb / 2), "1201.50MB");
        // A smallest value far below the total: the unit of a hundred times it.
        assert_eq!(Scale::for_table(SPACE, 2048, 2 << 30).label(2048), "2kB");
        assert_eq!(Scale::for_table(SPACE, 20 * 1024, 2 << 30).label(20 * 1024), "0.02MB");
        assert_eq!(Scale::for_table(SPACE, 0, 5 * mb).label(5 * mb), "5MB");
        assert_eq!(Scale::for_table(Unit::Samples, 1, 100), Scale::Plain);
    }
}
