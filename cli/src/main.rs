//! `cpuprof`: records, reads, compares and converts raw gperftools-format CPU profiles.
//!
//! Layers, each a folder: `input` (one way to read any profile), `symbols` (finding objects
//! and naming addresses), `model` (stacks, filters, merging), `analysis` (statistics, diff,
//! history, advice, peek, list) and `render` (text, JSON, SVG, pprof, DCPI, HTML). `args`
//! holds what each command takes, `commands` one function per command.

mod analysis;
mod args;
mod commands;
mod error;
mod input;
mod model;
mod render;
mod symbols;

use args::{Cli, Command};
use clap::Parser;
use std::process::ExitCode;

fn main() -> ExitCode {
    let status = match Cli::parse().command {
        Command::Record(a) => commands::record(a),
        Command::Top(a) => commands::top(a),
        Command::Peek(a) => commands::peek(a),
        Command::Diff(a) => commands::diff(a),
        Command::List(a) => commands::list(a),
        Command::Advise(a) => commands::advise(a),
        Command::Report(a) => commands::report(a),
        Command::Collapse(a) => commands::collapse(a),
        Command::Flamegraph(a) => commands::flamegraph(a),
        Command::Convert(a) => commands::convert(a),
        Command::Merge(a) => commands::merge(a),
        Command::Db(a) => commands::db(a),
        Command::History(a) => commands::history(a),
        Command::Dump(a) => commands::dump(a),
        Command::Check(a) => commands::check(a),
    };
    match status {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("cpuprof: {message}");
            ExitCode::from(1)
        }
    }
}
