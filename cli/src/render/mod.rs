//! What users read: text tables, JSON, SVG flame graphs, pprof protobuf, DCPI files and the
//! HTML report, plus the progress line long reads draw on a terminal and how counts are
//! printed (`units`: samples, or a heap profile's bytes as pprof prints them).

pub mod advice;
pub mod dcpi;
pub mod diff;
pub mod history;
pub mod html;
pub mod json;
pub mod markup;
pub mod pprof;
pub mod progress;
pub mod text;
pub mod units;
