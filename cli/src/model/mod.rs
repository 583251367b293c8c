//! Profiles as their readers see them: call chains of function names with counts
//! (`stacks`), pprof's focus/ignore/hide/show (`filters`), and profiles summed (`merge`).

pub mod filters;
pub mod merge;
pub mod stacks;
