//! `cpuprof`: records, reads, compares and converts raw gperftools-format CPU profiles.

mod cut_short;
mod dcpi;
mod debug_info;
mod diff;
mod merge;
mod plt;
mod pprof_out;
mod progress;
mod record;
mod report;
mod stacks;
mod symbolize;

use clap::{Args, Parser, Subcommand, ValueEnum};
use cpuprof::format::Profile;
use stacks::Stacks;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use symbolize::Locator;

const EXIT_STATUS: &str = "\
Exit status: 0 success; 1 an input is not a valid profile, or a file cannot be read or written;
2 usage error; 3 `diff` found significant changes. `record` exits with the recorded program's
status (128 + N if signal N killed it).";

#[derive(Parser)]
#[command(
    name = "cpuprof",
    version,
    about = "Record, read, compare and convert raw CPU profiles (gperftools format)",
    after_help = EXIT_STATUS
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

/// Where to find the binaries a profile names, when they are not at their recorded paths.
#[derive(Args, Clone, Default)]
struct Symbols {
    /// Binary to read symbols from: stands for the mapped object of the same file name, else
    /// for the profile's main executable. Repeatable.
    #[arg(long = "binary", value_name = "FILE")]
    binaries: Vec<PathBuf>,
    /// Directory searched for objects missing at their recorded path. Repeatable.
    #[arg(long = "search-path", value_name = "DIR")]
    search_path: Vec<PathBuf>,
    /// Directory of separate debug info, searched before /usr/lib/debug: by build-id
    /// (DIR/.build-id/xx/rest.debug) and by .gnu_debuglink (DIR/<object's directory>/NAME).
    /// Repeatable. DEBUGINFOD_URLS, when set, names debuginfod servers asked last.
    #[arg(long = "debug-dir", value_name = "DIR")]
    debug_dirs: Vec<PathBuf>,
}

impl From<Symbols> for Locator {
    fn from(s: Symbols) -> Locator {
        Locator {
            binaries: s.binaries,
            search_path: s.search_path,
            debug_dirs: s.debug_dirs,
        }
    }
}

/// How `diff` decides what changed.
#[derive(Args, Clone, Copy)]
struct DiffCriteria {
    /// Compare flat (self) shares instead of cumulative ones (the function and all it calls,
    /// which inlining cannot hide).
    #[arg(long)]
    flat: bool,
    /// Smallest change flagged, in |z| (the change over its sampling error).
    #[arg(long, default_value_t = 4.0)]
    threshold: f64,
    /// Smallest change flagged, in percentage points of share.
    #[arg(long, default_value_t = 1.0)]
    min_change: f64,
}

#[derive(Clone, Copy, ValueEnum)]
enum Target {
    /// Gzipped pprof protobuf (go tool pprof, Pyroscope, speedscope), symbolised.
    Pprof,
    /// One DCPI v0.07 profile per image, into a directory.
    Dcpi,
}

#[derive(Subcommand)]
enum Command {
    /// Run a program under the profiler, then print a summary and its top functions.
    #[command(after_help = "Example: cpuprof record -F 1000 -o app.prof -- ./app --flag")]
    Record {
        /// Samples per CPU-second (default 100).
        #[arg(short = 'F', long = "frequency")]
        frequency: Option<u32>,
        #[arg(short = 'o', long, default_value = "cpuprof.prof")]
        output: PathBuf,
        /// Functions shown after the run.
        #[arg(short = 'n', long, default_value_t = 10)]
        count: usize,
        /// How the processes are reported: `auto`, one report per program with the processes
        /// of one executable merged; `all` (or `--merge` alone), all in one; `none`, each alone.
        #[arg(long, value_enum, default_value = "auto", num_args = 0..=1, default_missing_value = "all")]
        merge: record::MergeMode,
        /// The program and its arguments.
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
    /// Flat and cumulative samples per function, like `pprof -top` (raw or DCPI profiles).
    Top {
        /// A raw profile, a DCPI profile, or a directory of DCPI profiles.
        file: PathBuf,
        /// Sort by cumulative instead of flat samples.
        #[arg(long)]
        cum: bool,
        /// Number of functions to show.
        #[arg(short = 'n', long, default_value_t = 20)]
        count: usize,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// What grew and what shrank between two profiles, or against a history of profiles.
    #[command(after_help = "\
Cumulative shares are compared (--flat: self time), so runs of different lengths compare
fairly and inlined code counts for the function it was inlined into. A change is flagged when it
is at least --min-change points and at least --threshold standard errors of sampling noise.
With --history DIR, NEW is compared with the mean and run-to-run spread of the profiles in DIR.
Exit status 3 when something is flagged.")]
    Diff {
        /// The baseline profile (omit with --history).
        #[arg(required_unless_present = "history")]
        base: Option<PathBuf>,
        /// The profile to judge.
        new: Option<PathBuf>,
        /// Directory of earlier profiles of the same program (at least two).
        #[arg(long, value_name = "DIR")]
        history: Option<PathBuf>,
        #[command(flatten)]
        criteria: DiffCriteria,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// Folded stacks (`main;f;g 12` per line), for flame graph and other tools.
    Collapse {
        file: PathBuf,
        /// Output file (default: standard output).
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// Draw an SVG flame graph.
    Flamegraph {
        file: PathBuf,
        #[arg(short = 'o', long, default_value = "flamegraph.svg")]
        output: PathBuf,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// Convert to pprof protobuf or to DCPI profiles.
    Convert {
        file: PathBuf,
        #[arg(long = "to", value_enum)]
        target: Target,
        /// Output file (pprof) or directory (dcpi).
        #[arg(short = 'o', long)]
        output: PathBuf,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// Sum profiles of the same program into one raw profile.
    Merge {
        #[arg(short = 'o', long)]
        output: PathBuf,
        #[arg(required = true)]
        files: Vec<PathBuf>,
        /// For profiles cut short without maps: the program's executable.
        #[command(flatten)]
        symbols: Symbols,
    },
    /// Print the header, every record and the mapped objects.
    Dump { file: PathBuf },
    /// Validate a profile; say exactly what is wrong and where.
    Check { file: PathBuf },
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    match run(cli.command) {
        Ok(code) => ExitCode::from(code),
        Err(message) => {
            eprintln!("cpuprof: {message}");
            ExitCode::from(1)
        }
    }
}

fn run(command: Command) -> Result<u8, String> {
    match command {
        Command::Record {
            frequency,
            output,
            count,
            merge,
            command,
        } => {
            let before = record::Before::snapshot(&output);
            let outcome = record::run(&command, &output, frequency)?;
            if let Some(sig) = outcome.killed_by {
                eprintln!("cpuprof: the program was killed by signal {sig}; its profile ends where it was killed");
            }
            record::summarise(&before.written(&output, outcome.pid), &command, count, merge);
            Ok(outcome.code)
        }
        Command::Top {
            file,
            cum,
            count,
            symbols,
        } => {
            let stacks = read_stacks(&file, &symbols.into())?;
            print!("{}", report::top(&stacks, cum, count));
            Ok(0)
        }
        Command::Diff {
            base,
            new,
            history,
            criteria,
            symbols,
        } => {
            let locator: Locator = symbols.into();
            let criteria = diff::Criteria {
                cumulative: !criteria.flat,
                threshold: criteria.threshold,
                min_points: criteria.min_change,
            };
            let (changes, header, before) = match history {
                Some(dir) => {
                    // With --history the single positional argument is NEW.
                    let new = new.or(base).ok_or("diff --history needs the NEW profile")?;
                    let past = read_history(&dir, &locator)?;
                    let latest = Stacks::symbolise(&read_profile(&new, &locator)?, &locator);
                    let header = format!(
                        "{} ({} samples) against {} profiles in {}",
                        new.display(),
                        latest.total(),
                        past.len(),
                        dir.display()
                    );
                    (diff::against_history(&past, &latest, criteria), header, "usual")
                }
                None => {
                    let (base, new) = (
                        base.ok_or("diff needs BASE and NEW")?,
                        new.ok_or("diff needs BASE and NEW")?,
                    );
                    let (a, b) = (
                        Stacks::symbolise(&read_profile(&base, &locator)?, &locator),
                        Stacks::symbolise(&read_profile(&new, &locator)?, &locator),
                    );
                    let header = format!(
                        "{} ({} samples) -> {} ({} samples)",
                        base.display(),
                        a.total(),
                        new.display(),
                        b.total()
                    );
                    (diff::compare(&a, &b, criteria), header, "before")
                }
            };
            print!("{}", diff::render(&changes, &header, before));
            Ok(if changes.is_empty() { 0 } else { 3 })
        }
        Command::Collapse { file, output, symbols } => {
            let locator: Locator = symbols.into();
            let stacks = Stacks::symbolise(&read_profile(&file, &locator)?, &locator);
            let mut text = stacks.folded().join("\n");
            text.push('\n');
            match output {
                Some(path) => {
                    std::fs::write(&path, text).map_err(|e| format!("cannot write {}: {e}", path.display()))?
                }
                None => print!("{text}"),
            }
            Ok(0)
        }
        Command::Flamegraph { file, output, symbols } => {
            let stacks = read_stacks(&file, &symbols.into())?;
            report::flamegraph(&stacks, &output)?;
            eprintln!("wrote {}", output.display());
            Ok(0)
        }
        Command::Convert {
            file,
            target,
            output,
            symbols,
        } => {
            let locator: Locator = symbols.into();
            let profile = read_profile(&file, &locator)?;
            match target {
                Target::Pprof => pprof_out::write(&pprof_out::encode(&profile, &locator), &output)?,
                Target::Dcpi => {
                    let taken = std::fs::metadata(&file)
                        .and_then(|m| m.modified())
                        .unwrap_or(std::time::SystemTime::now());
                    for path in dcpi::export(&profile, &locator, &output, taken)? {
                        eprintln!("wrote {}", path.display());
                    }
                }
            }
            Ok(0)
        }
        Command::Merge { output, files, symbols } => {
            let locator: Locator = symbols.into();
            let mut profiles = Vec::new();
            let mut progress = progress::Progress::new("reading", files.len());
            for (i, f) in files.iter().enumerate() {
                progress.update(i);
                profiles.push((f.display().to_string(), read_profile(f, &locator)?));
            }
            drop(progress);
            let (bytes, total) = merge::merge(&profiles)?;
            std::fs::write(&output, bytes).map_err(|e| format!("cannot write {}: {e}", output.display()))?;
            eprintln!(
                "wrote {}: {} profiles, {total} samples",
                output.display(),
                profiles.len()
            );
            Ok(0)
        }
        Command::Dump { file } => {
            let bytes = read_bytes(&file)?;
            let (profile, defect) = Profile::parse_lenient(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
            print!("{}", report::dump(&profile));
            match defect {
                Some(e) => Err(format!("{}: {e}", file.display())),
                None => Ok(0),
            }
        }
        Command::Check { file } => {
            let bytes = read_bytes(&file)?;
            let profile = Profile::parse(&bytes).map_err(|e| {
                // A cut-short file is still a defect here, but the other commands read it.
                let readable = match Profile::parse_lenient(&bytes) {
                    Ok((p, _)) if p.records > 0 => format!(
                        "; top, collapse, convert, flamegraph, merge and diff read the {} records ({} samples) before it",
                        p.records,
                        p.total_samples()
                    ),
                    _ => String::new(),
                };
                format!("{}: {e}{readable}", file.display())
            })?;
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
            Ok(0)
        }
    }
}

fn read_bytes(file: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

/// A raw profile; one cut short is read up to the cut, with a warning (see [`cut_short`]).
fn read_profile(file: &Path, locator: &Locator) -> Result<Profile, String> {
    cut_short::read(file, &read_bytes(file)?, locator)
}

/// A raw profile, a DCPI profile, or a directory of DCPI profiles, symbolised.
fn read_stacks(file: &Path, locator: &Locator) -> Result<Stacks, String> {
    if file.is_dir() {
        let mut profiles = Vec::new();
        for path in sorted_files(file)? {
            let bytes = read_bytes(&path)?;
            if dcpi::is_dcpi(&bytes) {
                profiles.push(dcpi::parse(&bytes).map_err(|e| format!("{}: {e}", path.display()))?);
            }
        }
        if profiles.is_empty() {
            return Err(format!("{}: no DCPI profiles in this directory", file.display()));
        }
        return Ok(dcpi::stacks(&profiles, locator));
    }
    let bytes = read_bytes(file)?;
    if dcpi::is_dcpi(&bytes) {
        let profile = dcpi::parse(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
        return Ok(dcpi::stacks(&[profile], locator));
    }
    let profile = cut_short::read(file, &bytes, locator)?;
    Ok(Stacks::symbolise(&profile, locator))
}

fn sorted_files(dir: &Path) -> Result<Vec<PathBuf>, String> {
    let entries = std::fs::read_dir(dir).map_err(|e| format!("cannot read {}: {e}", dir.display()))?;
    let mut files: Vec<PathBuf> = entries
        .filter_map(|e| Some(e.ok()?.path()))
        .filter(|p| p.is_file())
        .collect();
    files.sort();
    Ok(files)
}

/// Every raw profile in `dir`, symbolised; other files are skipped with a note.
fn read_history(dir: &Path, locator: &Locator) -> Result<Vec<Stacks>, String> {
    let files = sorted_files(dir)?;
    let mut out = Vec::new();
    let mut progress = progress::Progress::new("reading history", files.len());
    for (i, path) in files.iter().enumerate() {
        progress.update(i);
        match cut_short::read(path, &read_bytes(path)?, locator) {
            Ok(p) => out.push(Stacks::symbolise(&p, locator)),
            Err(e) => eprintln!("cpuprof: skipping {}: {e}", path.display()),
        }
    }
    if out.len() < 2 {
        return Err(format!(
            "{}: a history needs at least two profiles, found {}",
            dir.display(),
            out.len()
        ));
    }
    Ok(out)
}
