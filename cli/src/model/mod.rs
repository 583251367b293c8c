//! Profiles as their readers see them: call chains of function names with counts
//! (`stacks`) and what the counts measure (`unit`: CPU samples or a heap profile's bytes or
//! objects), pprof's focus/ignore/hide/show (`filters`), and profiles summed (`merge`).

pub mod filters;
pub mod merge;
pub mod stacks;
pub mod unit;
