//! One function per command: each reads its inputs (`input`), names them (`symbols`), shapes
//! them (`model`), works out what they say (`analysis`) and writes it (`render`). Each returns
//! the exit status (see `args::EXIT_STATUS`) or the message of an error.

mod compare;
mod files;
mod read;
pub mod record;

pub use compare::{advise, diff, history, report};
pub use files::{check, db, dump, merge};
pub use read::{collapse, convert, flamegraph, list, peek, top};
pub use record::record;
