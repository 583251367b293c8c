//! The flame graph's data: every chain of a profile (and of its baseline, in a comparison)
//! merged into one call tree, written for the page's script as flat arrays in preorder.
//!
//! Nothing is pruned: the page's search totals and the caller views are exact sums over
//! the whole tree; the script draws only the nodes wide enough to see. Each node costs the
//! page three small integers (its name, samples and depth), plus one with a baseline.

use crate::model::stacks::Stacks;
use cpuprof::format::Interner;
use std::collections::HashMap;
use std::fmt::Write;

/// Node 0 is the root: all samples, drawn as the bottom (here: top) bar.
pub struct Tree {
    names: Interner,
    /// Per node: name id, samples in the new profile and in the baseline.
    name: Vec<u32>,
    value: Vec<u64>,
    base: Vec<u64>,
    children: HashMap<(u32, u32), u32>,
    has_base: bool,
    /// Per group of samples (a label value): samples per node, for the nodes it reaches.
    groups: Vec<HashMap<u32, u64>>,
}

/// The root's name: not a function (no function name starts with a space).
pub const ROOT: &str = " all";

impl Tree {
    pub fn new() -> Tree {
        let mut tree = Tree {
            names: Interner::default(),
            name: Vec::new(),
            value: Vec::new(),
            base: Vec::new(),
            children: HashMap::new(),
            has_base: false,
            groups: Vec::new(),
        };
        let root = tree.id(ROOT);
        tree.name.push(root);
        tree.value.push(0);
        tree.base.push(0);
        tree
    }

    /// The id of function `name` in the page's name table.
    pub fn id(&mut self, name: &str) -> u32 {
        self.names.id(name)
    }

    pub fn names(&self) -> &[String] {
        self.names.strings()
    }

    /// Adds every chain of `stacks`, as the new profile's or as the baseline's samples.
    pub fn add(&mut self, stacks: &Stacks, baseline: bool) {
        self.has_base |= baseline;
        self.walk(stacks, |tree, node, count| {
            let slot = if baseline {
                &mut tree.base[node as usize]
            } else {
                &mut tree.value[node as usize]
            };
            *slot = slot.saturating_add(count);
        });
    }

    /// Adds `stacks` (a subset of the profile's samples, already added) as a group the page
    /// can show alone.
    pub fn add_group(&mut self, stacks: &Stacks) {
        self.groups.push(HashMap::new());
        let group = self.groups.len() - 1;
        self.walk(stacks, |tree, node, count| {
            let slot = tree.groups[group].entry(node).or_default();
            *slot = slot.saturating_add(count);
        });
    }

    /// Calls `bump(self, node, count)` for every node on every chain of `stacks`, from the
    /// root, making the nodes not in the tree yet.
    fn walk(&mut self, stacks: &Stacks, mut bump: impl FnMut(&mut Tree, u32, u64)) {
        let ids: Vec<u32> = stacks.names().iter().map(|n| self.id(n)).collect();
        for (chain, count) in stacks.chains() {
            let mut node = 0u32;
            bump(self, node, count);
            for &frame in chain {
                let name = ids[frame as usize];
                node = match self.children.get(&(node, name)) {
                    Some(&child) => child,
                    None => {
                        let child = self.name.len() as u32;
                        self.name.push(name);
                        self.value.push(0);
                        self.base.push(0);
                        self.children.insert((node, name), child);
                        child
                    }
                };
                bump(self, node, count);
            }
        }
    }

    #[cfg(test)]
    pub fn nodes(&self) -> usize {
        self.name.len()
    }

    /// `"tree":[name,samples,depth,...]` in preorder, each node's children by samples (most
    /// first, then by the baseline's, then by name), `"base":[samples,...]` in the same
    /// order or null, and `"groups":[[node,samples,...],...]`: per group, its nodes' preorder
    /// indices and samples.
    pub fn json(&self) -> String {
        let mut kids: Vec<Vec<u32>> = vec![Vec::new(); self.name.len()];
        for (&(parent, _), &child) in &self.children {
            kids[parent as usize].push(child);
        }
        for list in &mut kids {
            list.sort_by(|&a, &b| {
                let (a, b) = (a as usize, b as usize);
                (self.value[b], self.base[b])
                    .cmp(&(self.value[a], self.base[a]))
                    .then_with(|| {
                        self.names.strings()[self.name[a] as usize].cmp(&self.names.strings()[self.name[b] as usize])
                    })
            });
        }
        let mut tree = String::with_capacity(self.name.len() * 10);
        let mut base = String::with_capacity(if self.has_base { self.name.len() * 4 } else { 0 });
        let mut stack: Vec<(u32, u32)> = vec![(0, 0)];
        let mut first = true;
        let mut preorder = vec![0u32; self.name.len()];
        let mut next = 0;
        while let Some((node, depth)) = stack.pop() {
            let n = node as usize;
            preorder[n] = next;
            next += 1;
            let comma = if first { "" } else { "," };
            let _ = write!(tree, "{comma}{},{},{depth}", self.name[n], self.value[n]);
            if self.has_base {
                let _ = write!(base, "{comma}{}", self.base[n]);
            }
            first = false;
            stack.extend(kids[n].iter().rev().map(|&c| (c, depth + 1)));
        }
        let base = if self.has_base {
            format!("[{base}]")
        } else {
            "null".to_string()
        };
        let groups: Vec<String> = self
            .groups
            .iter()
            .map(|group| {
                let mut nodes: Vec<(u32, u64)> = group.iter().map(|(&n, &v)| (preorder[n as usize], v)).collect();
                nodes.sort_unstable();
                let flat: Vec<String> = nodes.iter().map(|(i, v)| format!("{i},{v}")).collect();
                format!("[{}]", flat.join(","))
            })
            .collect();
        format!("\"tree\":[{tree}],\"base\":{base},\"groups\":[{}]", groups.join(","))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn chains_merge_into_a_preorder_tree() {
        let mut new = Stacks::new(1000);
        new.push(["main", "a", "x"], 3);
        new.push(["main", "b"], 5);
        new.push(["main", "a"], 1);
        let mut old = Stacks::new(1000);
        old.push(["main", "a", "x"], 2);
        old.push(["main", "c"], 7);
        let mut tree = Tree::new();
        tree.add(&new, false);
        tree.add(&old, true);
        assert_eq!(tree.nodes(), 6);
        let id = |n: &str| tree.names().iter().position(|x| x == n).unwrap();
        let (main, a, b, c, x) = (id("main"), id("a"), id("b"), id("c"), id("x"));
        // Root 9 new / 9 base; main; b (5) before a (4) before c (0 new, 7 base); x under a.
        assert_eq!(
            tree.json(),
            format!("\"tree\":[0,9,0,{main},9,1,{b},5,2,{a},4,2,{x},3,3,{c},0,2],\"base\":[9,9,0,2,2,7],\"groups\":[]")
        );
        let mut alone = Tree::new();
        alone.add(&new, false);
        assert!(alone.json().ends_with("\"base\":null,\"groups\":[]"));
        // A group: the samples of main>a only, at the preorder indices of root, main, a, x.
        let mut part = Stacks::new(1000);
        part.push(["main", "a", "x"], 3);
        part.push(["main", "a"], 1);
        alone.add_group(&part);
        assert!(
            alone.json().ends_with("\"groups\":[[0,4,1,4,3,4,4,3]]"),
            "{}",
            alone.json()
        );
    }
}
