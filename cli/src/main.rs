//! `cpuprof`: reads raw gperftools-format CPU profiles.
//!
//! Exit status: 0 success, 1 the input is not a valid profile or cannot be read/written,
//! 2 usage error.

mod report;
mod symbolize;

use clap::{Parser, Subcommand};
use cpuprof::format::Profile;
use std::path::{Path, PathBuf};
use std::process::ExitCode;

#[derive(Parser)]
#[command(
    name = "cpuprof",
    version,
    about = "Read, symbolise and visualise raw CPU profiles (gperftools format)"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Subcommand)]
enum Command {
    /// Flat and cumulative samples per function, like `pprof -top`.
    Top {
        file: PathBuf,
        /// Sort by cumulative instead of flat samples.
        #[arg(long)]
        cum: bool,
        /// Number of functions to show.
        #[arg(short = 'n', long, default_value_t = 20)]
        count: usize,
    },
    /// Draw an SVG flame graph.
    Flamegraph {
        file: PathBuf,
        #[arg(short = 'o', long, default_value = "flamegraph.svg")]
        output: PathBuf,
    },
    /// Print the header, every record and the mapped objects.
    Dump { file: PathBuf },
    /// Validate a profile; say exactly what is wrong and where.
    Check { file: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(()) => ExitCode::SUCCESS,
        Err(message) => {
            eprintln!("cpuprof: {message}");
            ExitCode::from(1)
        }
    }
}

fn run(command: Command) -> Result<(), String> {
    match command {
        Command::Top { file, cum, count } => {
            let profile = read_profile(&file)?;
            print!("{}", report::top(&profile, cum, count));
            Ok(())
        }
        Command::Flamegraph { file, output } => {
            let profile = read_profile(&file)?;
            report::flamegraph(&profile, &output)?;
            eprintln!("wrote {}", output.display());
            Ok(())
        }
        Command::Dump { file } => {
            let bytes = read_bytes(&file)?;
            let (profile, defect) = Profile::parse_lenient(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
            print!("{}", report::dump(&profile));
            match defect {
                Some(e) => Err(format!("{}: {e}", file.display())),
                None => Ok(()),
            }
        }
        Command::Check { file } => {
            let profile = read_profile(&file)?;
            println!(
                "{}: valid {} profile, period {} us, {} records, {} distinct stacks, {} samples, {} mappings",
                file.display(),
                profile.format,
                profile.period_us,
                profile.records,
                profile.samples.len(),
                profile.total_samples(),
                profile.maps.entries.len()
            );
            Ok(())
        }
    }
}

fn read_bytes(file: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

fn read_profile(file: &Path) -> Result<Profile, String> {
    Profile::parse(&read_bytes(file)?).map_err(|e| format!("{}: {e}", file.display()))
}
