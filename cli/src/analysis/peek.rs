//! `peek REGEX`: each matching function's callers and callees with the samples that went
//! through each call, like `pprof -peek`.
//!
//! A caller -> callee edge counts a sample once however often the pair appears in its stack,
//! and a function calling itself makes no edge (pprof's graph does the same), so in a stack
//! `main;rec;rec;c` rec has one caller (main) and one callee (c). Shares of edges are of the
//! function's cumulative samples; the function's own are of the profile's total.

use crate::model::stacks::{Counts, Stacks};
use crate::model::unit::Unit;
use crate::render::text::{heap_heading, percent};
use crate::render::units::Scale;
use regex::Regex;
use std::collections::HashMap;
use std::fmt::Write;

/// Calls between two functions (caller id, callee id) and the samples through them.
type Edges = HashMap<(u32, u32), u64>;

pub fn peek(stacks: &Stacks, re: &Regex) -> String {
    let names = stacks.names();
    let matching: Vec<bool> = names.iter().map(|n| re.is_match(n)).collect();
    let mut counts = vec![Counts::default(); names.len()];
    let mut edges = Edges::new();
    let mut seen: Vec<(u32, u32)> = Vec::new();
    let mut counted: Vec<u32> = Vec::new();
    for (chain, count) in stacks.chains() {
        // Chains are short: a linear search keeps each function and edge once per sample.
        counted.clear();
        seen.clear();
        for (i, &id) in chain.iter().enumerate() {
            if !counted.contains(&id) {
                counted.push(id);
                let c = &mut counts[id as usize];
                c.cum = c.cum.saturating_add(count);
            }
            let Some(&caller) = i.checked_sub(1).and_then(|p| chain.get(p)) else {
                continue;
            };
            let edge = (caller, id);
            let wanted = matching[caller as usize] || matching[id as usize];
            if caller != id && wanted && !seen.contains(&edge) {
                seen.push(edge);
                let e = edges.entry(edge).or_insert(0);
                *e = e.saturating_add(count);
            }
        }
        if let Some(&leaf) = chain.last() {
            let c = &mut counts[leaf as usize];
            c.flat = c.flat.saturating_add(count);
        }
    }
    render(stacks, re, &matching, &counts, &edges)
}

fn render(stacks: &Stacks, re: &Regex, matching: &[bool], counts: &[Counts], edges: &Edges) -> String {
    let names = stacks.names();
    let total = stacks.total();
    // A heap profile's bytes in one unit, as `top` prints them (from the smallest count of a
    // function shown).
    let smallest = (0..names.len())
        .filter(|&i| matching[i])
        .map(|i| {
            if counts[i].flat > 0 {
                counts[i].flat
            } else {
                counts[i].cum
            }
        })
        .filter(|&v| v > 0)
        .min()
        .unwrap_or(0);
    let scale = Scale::for_table(stacks.unit, smallest, total);
    let mut out = match stacks.unit {
        Unit::Samples => crate::render::text::total_line(total, stacks.period_us, stacks.event.as_ref()),
        unit => format!("{}Total: {} {}\n", heap_heading(unit), scale.label(total), unit.name()),
    };
    let v = |n: u64| scale.label(n);
    // Functions in the order pprof shows them: most flat samples first, then most cumulative.
    let mut shown: Vec<usize> = (0..names.len()).filter(|&i| matching[i] && counts[i].cum > 0).collect();
    shown.sort_by(|&a, &b| {
        (counts[b].flat, counts[b].cum)
            .cmp(&(counts[a].flat, counts[a].cum))
            .then(names[a].cmp(&names[b]))
    });
    if shown.is_empty() {
        let _ = writeln!(out, "no function with samples matches `{re}`");
        return out;
    }
    let rule = format!("{:-<48}+{:-<30}", "", "");
    let _ = writeln!(
        out,
        "{:>8} {:>6} {:>8} {:>6} {:>8} {:>6} | callers above, callees below",
        "flat", "flat%", "cum", "cum%", "calls", "calls%"
    );
    // Edges of one function, most samples first.
    let sorted = |pick: &dyn Fn(&(u32, u32)) -> Option<u32>| {
        let mut list: Vec<(u32, u64)> = edges.iter().filter_map(|(e, &n)| Some((pick(e)?, n))).collect();
        list.sort_by(|a, b| b.1.cmp(&a.1).then(names[a.0 as usize].cmp(&names[b.0 as usize])));
        list
    };
    for i in shown {
        let id = i as u32;
        let Counts { flat, cum } = counts[i];
        let _ = writeln!(out, "{rule}");
        let edge_line = |out: &mut String, (other, n): (u32, u64)| {
            let _ = writeln!(
                out,
                "{:>32} {:>8} {:>5.1}% |   {}",
                "",
                v(n),
                percent(n, cum),
                names[other as usize]
            );
        };
        for caller in sorted(&|&(from, to)| (to == id).then_some(from)) {
            edge_line(&mut out, caller);
        }
        let _ = writeln!(
            out,
            "{:>8} {:>5.1}% {:>8} {:>5.1}% {:>15} | {}",
            v(flat),
            percent(flat, total),
            v(cum),
            percent(cum, total),
            "",
            names[i]
        );
        for callee in sorted(&|&(from, to)| (from == id).then_some(to)) {
            edge_line(&mut out, callee);
        }
    }
    let _ = writeln!(out, "{rule}");
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Rows of the peek of `regex` as (indent-free) text, for comparison.
    fn rows(stacks: &Stacks, regex: &str) -> Vec<String> {
        peek(stacks, &Regex::new(regex).unwrap())
            .lines()
            .skip(2)
            .filter(|l| !l.starts_with('-'))
            .map(|l| l.split_whitespace().collect::<Vec<_>>().join(" "))
            .collect()
    }

    #[test]
    fn callers_and_callees_count_each_sample_once_and_recursion_makes_no_edge() {
        let mut stacks = Stacks::new(1000);
        stacks.push(["main", "a", "c"], 3);
        stacks.push(["main", "b", "c"], 1);
        stacks.push(["main", "rec", "rec", "rec", "c"], 1);
        stacks.push(["main", "a"], 2);
        // c calls a again below itself: the a -> c edge counts once for this sample.
        stacks.push(["main", "a", "c", "a", "c"], 1);
        assert_eq!(
            rows(&stacks, "^c$"),
            [
                "4 66.7% | a",
                "1 16.7% | b",
                "1 16.7% | rec",
                "6 75.0% 6 75.0% | c",
                "1 16.7% | a",
            ]
        );
        assert_eq!(
            rows(&stacks, "^rec$"),
            ["1 100.0% | main", "0 0.0% 1 12.5% | rec", "1 100.0% | c"]
        );
        let none = peek(&stacks, &Regex::new("^x$").unwrap());
        assert!(none.ends_with("no function with samples matches `^x$`\n"), "{none}");
    }
}
