//! `cpuprof`: records, reads, compares and converts raw gperftools-format CPU profiles.

mod advise;
mod cut_short;
mod db;
mod dcpi;
mod debug_info;
mod diff;
mod filters;
mod history;
mod html;
mod json;
mod list;
mod merge;
mod peek;
mod plt;
mod pprof_out;
mod progress;
mod record;
mod report;
mod stacks;
mod symbolize;

use clap::{Args, Parser, Subcommand, ValueEnum};
use cpuprof::format::database::FileKind;
use cpuprof::format::Profile;
use filters::Filters;
use stacks::{Functions, Stacks};
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use symbolize::Locator;

const EXIT_STATUS: &str = "\
Exit status: 0 success; 1 an input is not a valid profile, or a file cannot be read or written;
2 usage error; 3 `diff` found significant changes (with --fail-on: a condition was met), or
`history` flagged an epoch. `record` exits with the recorded program's
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

/// A profile database read instead of FILE.
#[derive(Args, Clone, Default)]
struct DbSource {
    /// A profile database (DIR/<epoch>/<program>.<pid>.prof; see `cpuprof db`), read instead
    /// of FILE: the selected epochs' profiles of one program summed as `merge` sums them.
    #[arg(long, value_name = "DIR", conflicts_with = "file")]
    db: Option<PathBuf>,
    #[command(flatten)]
    selection: db::Selection,
}

/// How `diff` reads and judges profiles.
#[derive(Args, Clone)]
struct DiffCriteria {
    /// Compare flat (self) samples instead of cumulative ones (the function and all it calls,
    /// which inlining cannot hide).
    #[arg(long)]
    flat: bool,
    /// The chance, when nothing changed, that anything is marked significant (family-wise,
    /// Holm's correction over the functions compared).
    #[arg(long, default_value_t = 0.001, value_parser = probability)]
    alpha: f64,
    /// Coverage of the intervals shown.
    #[arg(long, default_value_t = 0.95, value_parser = probability)]
    confidence: f64,
    /// Rows shown besides the significant ones.
    #[arg(short = 'n', long, default_value_t = 10)]
    count: usize,
    /// The kernel tick (us) of the machine that recorded the profiles: the default timer looks
    /// at the stack at most once a tick. Default: this machine's tick.
    #[arg(long, value_name = "US")]
    tick_us: Option<u64>,
    /// The work each run did (requests, items, ...), as BASE,NEW: times are then per unit.
    /// Without it, both runs are taken to have done the same work.
    #[arg(long, value_name = "BASE,NEW", value_parser = units, conflicts_with = "history")]
    units: Option<(f64, f64)>,
    /// Exit with status 3 when a function grew significantly and by at least this much:
    /// `significant` (any significant growth), `share=POINTS`, `growth=PERCENT%` (of the
    /// baseline's total time), `growth=SECONDS` with s, ms or us; or when the total CPU time
    /// grew by `total=PERCENT%` (a plain threshold: set it above the run-to-run noise).
    /// Repeatable; any condition met fails.
    #[arg(long, value_name = "CONDITION")]
    fail_on: Vec<diff::Gate>,
}

fn probability(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|p| *p > 0.0 && *p < 1.0)
        .ok_or_else(|| format!("`{text}` is not a probability between 0 and 1"))
}

fn percentage(text: &str) -> Result<f64, String> {
    text.parse::<f64>()
        .ok()
        .filter(|p| (0.0..=100.0).contains(p))
        .ok_or_else(|| format!("`{text}` is not a percentage between 0 and 100"))
}

fn units(text: &str) -> Result<(f64, f64), String> {
    let positive = |v: &str| v.trim().parse::<f64>().ok().filter(|u| u.is_finite() && *u > 0.0);
    text.split_once(',')
        .and_then(|(a, b)| Some((positive(a)?, positive(b)?)))
        .ok_or_else(|| format!("`{text}`: expected BASE,NEW, two positive numbers"))
}

/// The kernel tick of this machine: the resolution of the coarse clocks, which advance once a
/// tick (4 ms on a 250 Hz kernel). 4 ms when it cannot be read.
fn local_tick_us() -> u64 {
    let mut res = libc::timespec { tv_sec: 0, tv_nsec: 0 };
    // SAFETY: clock_getres writes one timespec into `res`.
    let ok = unsafe { libc::clock_getres(libc::CLOCK_MONOTONIC_COARSE, &mut res) } == 0;
    let us = res.tv_sec as u64 * 1_000_000 + res.tv_nsec as u64 / 1000;
    if ok && (100..=100_000).contains(&us) {
        us
    } else {
        4000
    }
}

#[derive(Clone, Copy, ValueEnum)]
enum Target {
    /// Gzipped pprof protobuf (go tool pprof, Pyroscope, speedscope), symbolised.
    Pprof,
    /// One DCPI v0.07 profile per image, into a directory.
    Dcpi,
}

#[derive(Clone, Copy, ValueEnum)]
enum AdviceFormat {
    Text,
    Json,
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
        /// of one executable merged (split by Chromium-style `--type=`); `all` (or `--merge`
        /// alone), all in one; `none`, each alone.
        #[arg(long, value_enum, default_value = "auto", num_args = 0..=1, default_missing_value = "all")]
        merge: record::MergeMode,
        /// Also write each report as a self-contained HTML page beside its profile (`cpuprof
        /// report`): `out.prof` gives `out.html`.
        #[arg(long)]
        html: bool,
        /// The program and its arguments.
        #[arg(required = true, last = true)]
        command: Vec<String>,
    },
    /// Flat and cumulative samples per function, like `pprof -top` (raw or DCPI profiles).
    Top {
        /// A raw profile, a DCPI profile, or a directory of DCPI profiles.
        #[arg(required_unless_present = "db")]
        file: Option<PathBuf>,
        #[command(flatten)]
        db: DbSource,
        /// Sort by cumulative instead of flat samples.
        #[arg(long)]
        cum: bool,
        /// Number of functions to show.
        #[arg(short = 'n', long, default_value_t = 20)]
        count: usize,
        #[command(flatten)]
        filters: Filters,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// Callers and callees of each function matching REGEX, with the samples through each call,
    /// like `pprof -peek`.
    #[command(after_help = "\
A call counts a sample once however often it appears in its stack, and a function calling
itself is no call (recursion counts once). calls% is of the function's cumulative samples;
flat% and cum% of the profile's total (before filters, as in pprof).")]
    Peek {
        /// Regular expression matched against function names (unanchored).
        #[arg(value_parser = filters::regex)]
        regex: regex::Regex,
        /// A raw profile, a DCPI profile, or a directory of DCPI profiles.
        file: PathBuf,
        #[command(flatten)]
        filters: Filters,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// What grew and what shrank between two profiles, or against a history of profiles.
    #[command(after_help = "\
For each function: the change in its share (cumulative; --flat: self time) and in its CPU time
(samples x period, per unit of work with --units), each with an interval. Counts are turned into
independent observations first: the default timer looks at the stack once per kernel tick, so at
1000 Hz on a 4 ms tick 1000 samples are ~250 observations. A change of share is marked * when
significant after Holm's correction over all functions (--alpha family-wise); times are not
marked between two runs, whose totals vary by more than sampling. The largest changes are shown
with their intervals whether significant or not, with how many times the samples would settle them.
With --history DIR, NEW is compared with the mean of the profiles in DIR, judged against their
run-to-run spread, and times are marked too. Exit status 3 when something is significant, or with
--fail-on, when a condition is met.")]
    Diff {
        /// The baseline profile (omit with --history).
        #[arg(required_unless_present = "history")]
        base: Option<PathBuf>,
        /// The profile to judge.
        new: Option<PathBuf>,
        /// Directory of earlier profiles of the same program (at least two), or a profile
        /// database whose epochs (of --program, or of NEW's `<program>.<pid>.prof`) are the runs.
        #[arg(long, value_name = "DIR")]
        history: Option<PathBuf>,
        /// With --history DB: the epochs taken as the history.
        #[command(flatten)]
        selection: db::Selection,
        #[command(flatten)]
        criteria: DiffCriteria,
        #[command(flatten)]
        filters: Filters,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// Source lines of each function matching REGEX with their samples, flat and cumulative
    /// (like `pprof -list`); --disasm: per instruction.
    List {
        /// Functions whose names match (unanchored, as pprof's; `^name$` for one).
        regex: regex::Regex,
        /// A raw profile.
        file: PathBuf,
        #[command(flatten)]
        options: list::Args,
        #[command(flatten)]
        filters: Filters,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// What could be optimised: a short ranked list of hints, each with its numbers.
    #[command(after_help = "\
Hints, ranked by the share of all samples at stake: functions that grew against --history (as
`diff --history` marks them, cumulative, with intervals); a function of the program whose self
time sits on at most 3 source lines (half of it or more); known-costly families of library
functions (allocation, copying, locking, system calls, formatting and parsing, sorting, hashing,
exception unwinding, the dynamic loader) with their share, counted once per sample, and the
program's functions that call them. Functions whose time grew only with the whole run are one
hint. Hints below --min-share get one line each. --format json lists every hint with its counts.")]
    Advise {
        /// A raw profile (cpuprof's or gperftools').
        file: PathBuf,
        /// Directory of earlier profiles of the same program (at least two), or a profile
        /// database whose epochs are the runs (as `diff --history`): adds what grew.
        #[arg(long, value_name = "DIR")]
        history: Option<PathBuf>,
        /// With --history DB: the epochs taken as the history.
        #[command(flatten)]
        selection: db::Selection,
        /// `text`, or `json` (every hint with raw counts).
        #[arg(long, value_enum, default_value = "text")]
        format: AdviceFormat,
        /// Hints shown in full.
        #[arg(short = 'n', long, default_value_t = 10)]
        count: usize,
        /// Share at stake (%) below which a hint gets one line.
        #[arg(long, default_value_t = 1.0, value_name = "PERCENT", value_parser = percentage)]
        min_share: f64,
        /// The kernel tick (us) of the machine that recorded the profiles (see `diff`).
        #[arg(long, value_name = "US")]
        tick_us: Option<u64>,
        #[command(flatten)]
        filters: Filters,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// One self-contained HTML page of a profile: hints, an interactive flame graph, the
    /// function table and the hottest source; with --base or --history, what changed.
    #[command(after_help = "\
The page needs no network and no server: open it in any browser, from any machine. Click a frame
of the flame graph to zoom (Reset zoom returns), type a regular expression to highlight and total
the functions it matches, click a function (in the graph, the table or a hint) for its callers
and callees. With --base, the flame graph is differential: widths are this profile, colours the
change of each stack's share, strong where `diff` finds the function's change significant.
With --history (a directory of profiles or a profile database), the baseline is the history
pooled, growth is judged as `diff --history` judges it, and a trend chart shows the top
functions over the history's profiles with this one last.")]
    Report {
        /// A raw profile (cpuprof's or gperftools').
        file: PathBuf,
        /// An earlier profile to compare with.
        #[arg(long, conflicts_with = "history")]
        base: Option<PathBuf>,
        /// Directory of earlier profiles of the same program, or a profile database.
        #[arg(long, value_name = "DIR")]
        history: Option<PathBuf>,
        /// With --history DB: the epochs taken as the history.
        #[command(flatten)]
        selection: db::Selection,
        #[arg(short = 'o', long, default_value = "report.html")]
        output: PathBuf,
        /// The kernel tick (us) of the machine that recorded the profiles (see `diff`).
        #[arg(long, value_name = "US")]
        tick_us: Option<u64>,
        #[command(flatten)]
        filters: Filters,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// Folded stacks (`main;f;g 12` per line), for flame graph and other tools.
    Collapse {
        #[arg(required_unless_present = "db")]
        file: Option<PathBuf>,
        #[command(flatten)]
        db: DbSource,
        /// Output file (default: standard output).
        #[arg(short = 'o', long)]
        output: Option<PathBuf>,
        #[command(flatten)]
        filters: Filters,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// Draw an SVG flame graph.
    Flamegraph {
        #[arg(required_unless_present = "db")]
        file: Option<PathBuf>,
        #[command(flatten)]
        db: DbSource,
        #[arg(short = 'o', long, default_value = "flamegraph.svg")]
        output: PathBuf,
        #[command(flatten)]
        filters: Filters,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// Convert to pprof protobuf or to DCPI profiles.
    #[command(after_help = "\
With filters, the output holds only the samples they keep (readers then take these as the
total), hidden frames taken out of their stacks. With --db and --to dcpi, each selected epoch
becomes a directory of OUTPUT named after it, as in DCPI's own database.")]
    Convert {
        #[arg(required_unless_present = "db")]
        file: Option<PathBuf>,
        #[command(flatten)]
        db: DbSource,
        #[arg(long = "to", value_enum)]
        target: Target,
        /// Output file (pprof) or directory (dcpi).
        #[arg(short = 'o', long)]
        output: PathBuf,
        #[command(flatten)]
        filters: Filters,
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
    /// List a profile database: its programs (epochs, processes, samples, first and last epoch)
    /// and its epochs. Files that cannot be read are reported and counted, never fatal.
    #[command(after_help = "\
Layout: DIR/<epoch start, UTC, YYYYMMDDTHHMMSSZ>/<program>.<pid>.prof, each file a complete
profile of one process over one epoch. Names not ending in .prof, or starting with '.', are a
writer's unfinished files and are skipped. top, collapse, flamegraph and convert read a
database with --db DIR; diff reads one as --history; history draws one program's epochs.")]
    Db {
        dir: PathBuf,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// One program's epochs in a profile database: samples and top functions' shares per epoch,
    /// as a table and an SVG line chart, flagging where a function left its usual range.
    #[command(after_help = "\
Each epoch after the first 3 is judged as `diff --history` judges a profile, against the
--window epochs before it; only changes of share are flagged (an epoch's CPU time is how busy
the program was). --alpha bounds the chance that anything in the whole table is flagged when
nothing changed: it is divided among the epochs judged (Bonferroni), Holm's correction applies
within each. Exit status 3 when something is flagged.")]
    History {
        /// The profile database (see `cpuprof db`).
        #[arg(long, value_name = "DIR")]
        db: PathBuf,
        #[command(flatten)]
        selection: db::Selection,
        /// Functions shown (those with the largest mean share; flagged ones are added).
        #[arg(short = 'n', long, default_value_t = 8)]
        count: usize,
        /// Epochs before each one that make its usual range.
        #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u64).range(3..))]
        window: u64,
        /// Flat (self) shares instead of cumulative ones.
        #[arg(long)]
        flat: bool,
        /// The chance, when nothing changed, that anything in the history is flagged.
        #[arg(long, default_value_t = 0.001, value_parser = probability)]
        alpha: f64,
        /// Coverage of the intervals shown.
        #[arg(long, default_value_t = 0.95, value_parser = probability)]
        confidence: f64,
        /// The kernel tick (us) of the machine that recorded the profiles (see `diff`).
        #[arg(long, value_name = "US")]
        tick_us: Option<u64>,
        /// The SVG line chart.
        #[arg(short = 'o', long, default_value = "history.svg")]
        output: PathBuf,
        #[command(flatten)]
        filters: Filters,
        #[command(flatten)]
        symbols: Symbols,
    },
    /// Print the header, every record and the mapped objects.
    Dump { file: PathBuf },
    /// Validate a profile; say exactly what is wrong and where. A wall-clock profile most of
    /// whose looks at threads are missing (their state was unreadable) is INCOMPLETE (exit
    /// status 1); fewer missing looks get a WARNING.
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
            html,
            command,
        } => {
            let before = record::Before::snapshot(&output);
            let outcome = record::run(&command, &output, frequency)?;
            if let Some(sig) = outcome.killed_by {
                eprintln!("cpuprof: the program was killed by signal {sig}; its profile ends where it was killed");
            }
            record::summarise(&before.written(&output, outcome.pid), &command, count, merge, html);
            Ok(outcome.code)
        }
        Command::Top {
            file,
            db,
            cum,
            count,
            filters,
            symbols,
        } => {
            let locator: Locator = symbols.into();
            let functions = match &db.db {
                Some(dir) => {
                    let (name, bytes) = db::merged_selection(dir, &db.selection, &locator)?;
                    let outline = cut_short::outline(&name, &bytes, &locator)?;
                    Functions::read(&bytes, &outline, &locator, &filters)
                }
                None => read_functions(&given(file)?, &locator, &filters)?,
            };
            print!("{}", report::top(&functions, cum, count));
            Ok(0)
        }
        Command::Peek {
            regex,
            file,
            filters,
            symbols,
        } => {
            let stacks = read_stacks(&file, &symbols.into(), &filters)?;
            print!("{}", peek::peek(&stacks, &regex));
            Ok(0)
        }
        Command::Diff {
            base,
            new,
            history,
            selection,
            criteria,
            filters,
            symbols,
        } => {
            let locator: Locator = symbols.into();
            let opts = diff::Options {
                cumulative: !criteria.flat,
                alpha: criteria.alpha,
                confidence: criteria.confidence,
                rows: criteria.count,
            };
            let tick_us = criteria.tick_us.unwrap_or_else(local_tick_us);
            let summary = |path: &Path, units: f64| -> Result<diff::Summary, String> {
                let profile = read_profile(path, &locator)?;
                let stacks = Stacks::symbolise(&profile, &locator).filter(&filters);
                Ok(diff::Summary::new(
                    &stacks,
                    profile.records,
                    profile.maps.signal_weights,
                    units,
                    opts.cumulative,
                    tick_us,
                ))
            };
            let report = match history {
                Some(dir) => {
                    // With --history the single positional argument is NEW.
                    let new = new.or(base).ok_or("diff --history needs the NEW profile")?;
                    let past = if db::Database::is_database(&dir) {
                        db_history(&dir, &selection, &new, &locator, &|profile: &Profile| {
                            let stacks = Stacks::symbolise(profile, &locator).filter(&filters);
                            diff::Summary::new(
                                &stacks,
                                profile.records,
                                profile.maps.signal_weights,
                                1.0,
                                opts.cumulative,
                                tick_us,
                            )
                        })?
                    } else {
                        read_history(&dir, &|path: &Path| summary(path, 1.0))?
                    };
                    let latest = summary(&new, 1.0)?;
                    let header = format!(
                        "{} ({}) against {} profiles in {} (tick {tick_us} us)",
                        new.display(),
                        latest.describe(),
                        past.len(),
                        dir.display()
                    );
                    diff::against_history(&past, &latest, header, opts)
                }
                None => {
                    let (base, new) = (
                        base.ok_or("diff needs BASE and NEW")?,
                        new.ok_or("diff needs BASE and NEW")?,
                    );
                    let (units_a, units_b) = criteria.units.unwrap_or((1.0, 1.0));
                    let (a, b) = (summary(&base, units_a)?, summary(&new, units_b)?);
                    let header = format!(
                        "{} ({}) -> {} ({}) (tick {tick_us} us)",
                        base.display(),
                        a.describe(),
                        new.display(),
                        b.describe()
                    );
                    diff::compare(&a, &b, header, criteria.units.is_some(), opts)
                }
            };
            print!("{}", report.render(opts));
            if criteria.fail_on.is_empty() {
                return Ok(if report.significant().next().is_some() { 3 } else { 0 });
            }
            let failures = report.failures(&criteria.fail_on);
            for failure in &failures {
                println!("FAIL {failure}");
            }
            Ok(if failures.is_empty() { 0 } else { 3 })
        }
        Command::List {
            regex,
            file,
            options,
            filters,
            symbols,
        } => {
            let (locator, bytes) = (symbols.into(), read_bytes(&file)?);
            let outline = cut_short::outline(&file, &bytes, &locator)?;
            print!(
                "{}",
                list::list(&bytes, &outline, &locator, &regex, &options, &filters)?
            );
            Ok(0)
        }
        Command::Advise {
            file,
            history,
            selection,
            format,
            count,
            min_share,
            tick_us,
            filters,
            symbols,
        } => {
            let locator: Locator = symbols.into();
            let mut profile = read_profile(&file, &locator)?;
            if filters.active() {
                profile = filters::profile(&profile, &locator, &filters);
            }
            let analysis = advise::Analysis::new(&profile, &locator);
            let tick_us = tick_us.unwrap_or_else(local_tick_us);
            let summary = |stacks: &Stacks, p: &Profile| {
                diff::Summary::new(stacks, p.records, p.maps.signal_weights, 1.0, true, tick_us)
            };
            // A past profile as the new one is seen: filtered alike.
            let past_summary = |p: &Profile| {
                let p = if filters.active() {
                    &filters::profile(p, &locator, &filters)
                } else {
                    p
                };
                summary(&Stacks::symbolise(p, &locator), p)
            };
            let report = match &history {
                Some(dir) => {
                    let past = if db::Database::is_database(dir) {
                        db_history(dir, &selection, &file, &locator, &past_summary)?
                    } else {
                        read_history(dir, &|path: &Path| Ok(past_summary(&read_profile(path, &locator)?)))?
                    };
                    let latest = summary(&analysis.stacks, &profile);
                    let header = String::new();
                    Some((
                        diff::against_history(&past, &latest, header, advise::diff_options()),
                        past.len(),
                    ))
                }
                None => None,
            };
            let advice = advise::advise(&analysis, report.as_ref().map(|(r, n)| (r, *n)));
            match format {
                AdviceFormat::Text => print!("{}", advice.text(min_share / 100.0, count)),
                AdviceFormat::Json => print!("{}", advice.json()),
            }
            Ok(0)
        }
        Command::Report {
            file,
            base,
            history,
            selection,
            output,
            tick_us,
            filters,
            symbols,
        } => {
            let locator: Locator = symbols.into();
            let baseline = match (base, history) {
                (Some(base), _) => html::Baseline::Profile(base),
                (None, Some(dir)) => html::Baseline::History(dir, selection),
                (None, None) => html::Baseline::None,
            };
            let opts = html::Options {
                locator: &locator,
                filters: &filters,
                tick_us: tick_us.unwrap_or_else(local_tick_us),
                title: file.display().to_string(),
            };
            let page = html::page(&file, &read_bytes(&file)?, &baseline, &opts)?;
            std::fs::write(&output, page).map_err(|e| format!("cannot write {}: {e}", output.display()))?;
            eprintln!("wrote {}", output.display());
            Ok(0)
        }
        Command::Collapse {
            file,
            db,
            output,
            filters,
            symbols,
        } => {
            let locator: Locator = symbols.into();
            let (file, bytes) = match &db.db {
                Some(dir) => db::merged_selection(dir, &db.selection, &locator)?,
                None => {
                    let file = given(file)?;
                    let bytes = read_bytes(&file)?;
                    (file, bytes)
                }
            };
            let stacks = raw_stacks(&file, &bytes, &locator, &filters)?;
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
        Command::Flamegraph {
            file,
            db,
            output,
            filters,
            symbols,
        } => {
            let locator: Locator = symbols.into();
            let stacks = match &db.db {
                Some(dir) => {
                    let (name, bytes) = db::merged_selection(dir, &db.selection, &locator)?;
                    raw_stacks(&name, &bytes, &locator, &filters)?
                }
                None => read_stacks(&given(file)?, &locator, &filters)?,
            };
            report::flamegraph(&stacks, &output)?;
            eprintln!("wrote {}", output.display());
            Ok(0)
        }
        Command::Convert {
            file,
            db,
            target,
            output,
            filters,
            symbols,
        } => {
            let locator: Locator = symbols.into();
            if let (Some(dir), Target::Dcpi) = (&db.db, target) {
                return db_to_dcpi(dir, &db.selection, &locator, &filters, &output);
            }
            let (file, bytes) = match &db.db {
                Some(dir) => db::merged_selection(dir, &db.selection, &locator)?,
                None => {
                    let file = given(file)?;
                    let bytes = read_bytes(&file)?;
                    (file, bytes)
                }
            };
            let mut profile = cut_short::read(&file, &bytes, &locator)?;
            if filters.active() {
                profile = filters::profile(&profile, &locator, &filters);
            }
            match target {
                Target::Pprof => pprof_out::write(&pprof_out::encode(&profile, &locator, &filters), &output)?,
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
        Command::Db { dir, symbols } => {
            print!("{}", db::listing(&dir, &symbols.into())?);
            Ok(0)
        }
        Command::History {
            db,
            selection,
            count,
            window,
            flat,
            alpha,
            confidence,
            tick_us,
            output,
            filters,
            symbols,
        } => {
            let locator: Locator = symbols.into();
            let database = db::Database::open(&db)?;
            let (program, selected) = database.select(&selection)?;
            let mut epochs = Vec::new();
            for (name, entries) in &selected {
                let Some(bytes) = db::merged(entries, &locator)? else {
                    eprintln!("cpuprof: epoch {name}: no readable profile of {program}; left out");
                    continue;
                };
                let profile = Profile::parse(&bytes).map_err(|e| format!("{name}: merged profile: {e}"))?;
                epochs.push(history::Epoch {
                    name: name.clone(),
                    processes: entries.len(),
                    stacks: Stacks::symbolise(&profile, &locator).filter(&filters),
                    records: profile.records,
                    weights: profile.maps.signal_weights,
                });
            }
            let opts = diff::Options {
                cumulative: !flat,
                alpha,
                confidence,
                rows: count,
            };
            let tick_us = tick_us.unwrap_or_else(local_tick_us);
            let window = usize::try_from(window).unwrap_or(usize::MAX);
            let result = history::history(&epochs, opts, window, count, tick_us);
            println!("{program} in {} (tick {tick_us} us)", db.display());
            print!("{}", result.table(opts, window));
            std::fs::write(&output, result.svg()).map_err(|e| format!("cannot write {}: {e}", output.display()))?;
            eprintln!("wrote {}", output.display());
            Ok(if result.flags.is_empty() { 0 } else { 3 })
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
            let contents = format!(
                "{} profile, period {} us, {} records, {} distinct stacks, {} samples, {} mappings",
                profile.format,
                profile.period_us,
                profile.records,
                profile.samples.len(),
                profile.total_samples(),
                profile.maps.entries.len()
            );
            // A wall-clock profile whose sampler could not see most threads' state is readable
            // but not what it claims to be: most of its blocked time is missing.
            match &profile.maps.wall_looks {
                Some(w) if w.missing > 0 => {
                    let missing = format!(
                        "{} of {} looks at threads ({:.1} %) are missing from this wall-clock profile, their \
                         blocked time with them ({})",
                        w.missing,
                        w.looks,
                        100.0 * w.missing_share(),
                        w.reasons_text()
                    );
                    if 2 * w.missing > w.looks {
                        println!("{}: INCOMPLETE {contents}: {missing}", file.display());
                        Ok(1)
                    } else {
                        println!("{}: valid {contents}", file.display());
                        eprintln!("cpuprof: WARNING: {}: {missing}", file.display());
                        Ok(0)
                    }
                }
                _ => {
                    println!("{}: valid {contents}", file.display());
                    Ok(0)
                }
            }
        }
    }
}

/// FILE, which clap requires when --db is absent.
fn given(file: Option<PathBuf>) -> Result<PathBuf, String> {
    file.ok_or_else(|| "a FILE or --db DIR is needed".to_string())
}

/// The epochs of a database as a history for `diff --history`: each epoch (its processes
/// summed) one run. The program is --program, else NEW's `<program>` if the database has it,
/// else the database's only program.
fn db_history(
    dir: &Path,
    selection: &db::Selection,
    new: &Path,
    locator: &Locator,
    summarise: &dyn Fn(&Profile) -> diff::Summary,
) -> Result<Vec<diff::Summary>, String> {
    let database = db::Database::open(dir)?;
    let (program, epochs) = database.select(&program_of(&database, selection, new))?;
    let mut past = Vec::new();
    for (name, entries) in &epochs {
        match db::merged(entries, locator)? {
            Some(bytes) => {
                let profile = Profile::parse(&bytes).map_err(|e| format!("{name}: merged profile: {e}"))?;
                past.push(summarise(&profile));
            }
            None => eprintln!("cpuprof: epoch {name}: no readable profile of {program}; left out"),
        }
    }
    if past.len() < 2 {
        return Err(format!(
            "{}: a history needs at least two epochs of {program}, found {}",
            dir.display(),
            past.len()
        ));
    }
    Ok(past)
}

/// `selection`, its program, when not given, NEW's `<program>` if the database has it.
fn program_of(database: &db::Database, selection: &db::Selection, new: &Path) -> db::Selection {
    let mut selection = selection.clone();
    if selection.program.is_none() {
        let name = new.file_name().and_then(|n| n.to_str()).unwrap_or("");
        if let FileKind::Profile(file) = cpuprof::format::database::parse_file_name(name) {
            if database.programs().contains(file.program.as_str()) {
                selection.program = Some(file.program);
            }
        }
    }
    selection
}

/// DCPI's layout: one directory per epoch, named after it, one v0.07 profile per image.
fn db_to_dcpi(
    dir: &Path,
    selection: &db::Selection,
    locator: &Locator,
    filters: &Filters,
    output: &Path,
) -> Result<u8, String> {
    let database = db::Database::open(dir)?;
    let (program, epochs) = database.select(selection)?;
    for (name, entries) in &epochs {
        let Some(bytes) = db::merged(entries, locator)? else {
            eprintln!("cpuprof: epoch {name}: no readable profile of {program}; left out");
            continue;
        };
        let mut profile = Profile::parse(&bytes).map_err(|e| format!("{name}: merged profile: {e}"))?;
        if filters.active() {
            profile = filters::profile(&profile, locator, filters);
        }
        let start = cpuprof::format::database::parse_epoch_name(name).unwrap_or(std::time::UNIX_EPOCH);
        for path in dcpi::export(&profile, locator, &output.join(name), start)? {
            eprintln!("wrote {}", path.display());
        }
    }
    Ok(0)
}

fn read_bytes(file: &Path) -> Result<Vec<u8>, String> {
    std::fs::read(file).map_err(|e| format!("cannot read {}: {e}", file.display()))
}

/// A raw profile; one cut short is read up to the cut, with a warning (see [`cut_short`]).
fn read_profile(file: &Path, locator: &Locator) -> Result<Profile, String> {
    cut_short::read(file, &read_bytes(file)?, locator)
}

/// Samples per function of a raw profile (summed as it is read: no chain is kept), a DCPI
/// profile, or a directory of DCPI profiles.
fn read_functions(file: &Path, locator: &Locator, filters: &Filters) -> Result<Functions, String> {
    if file.is_dir() {
        return Ok(read_stacks(file, locator, filters)?.functions());
    }
    let bytes = read_bytes(file)?;
    if dcpi::is_dcpi(&bytes) {
        let profile = dcpi::parse(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
        return Ok(dcpi::stacks(&[profile], locator).filter(filters).functions());
    }
    let outline = cut_short::outline(file, &bytes, locator)?;
    Ok(Functions::read(&bytes, &outline, locator, filters))
}

/// A raw profile, a DCPI profile, or a directory of DCPI profiles, symbolised, as `filters`
/// leave it.
fn read_stacks(file: &Path, locator: &Locator, filters: &Filters) -> Result<Stacks, String> {
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
        return Ok(dcpi::stacks(&profiles, locator).filter(filters));
    }
    let bytes = read_bytes(file)?;
    if dcpi::is_dcpi(&bytes) {
        let profile = dcpi::parse(&bytes).map_err(|e| format!("{}: {e}", file.display()))?;
        return Ok(dcpi::stacks(&[profile], locator).filter(filters));
    }
    raw_stacks(file, &bytes, locator, filters)
}

/// The raw profile in `bytes`, read from `file`, symbolised as it is read: one pass finds the
/// maps at the end (and judges a cut), a second aggregates the records; none is kept.
fn raw_stacks(file: &Path, bytes: &[u8], locator: &Locator, filters: &Filters) -> Result<Stacks, String> {
    let outline = cut_short::outline(file, bytes, locator)?;
    Ok(Stacks::read(bytes, &outline, locator, filters))
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

/// Every raw profile in `dir`, read by `read`; other files are skipped with a note.
fn read_history<T>(dir: &Path, read: &dyn Fn(&Path) -> Result<T, String>) -> Result<Vec<T>, String> {
    let files = sorted_files(dir)?;
    let mut out = Vec::new();
    let mut progress = progress::Progress::new("reading history", files.len());
    for (i, path) in files.iter().enumerate() {
        progress.update(i);
        match read(path) {
            Ok(p) => out.push(p),
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
