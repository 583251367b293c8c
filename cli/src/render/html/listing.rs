//! The page's source listings: `cpuprof list`'s text for the hottest functions, each line with
//! samples shaded by its share of the function's cumulative samples.
//!
//! The listing is computed once, by `list` itself (one pass for all the functions listed), so
//! the page and the command cannot disagree; this module only lays its lines out.

use crate::render::markup::escape;
use regex::Regex;
use std::fmt::Write;

/// One function's listing.
pub struct Routine {
    /// The function named in the `ROUTINE` line (one of those asked for).
    pub function: String,
    html: String,
}

impl Routine {
    pub fn html(&self, anchor: &str) -> String {
        format!("<article class=\"routine\" id=\"{anchor}\">{}</article>\n", self.html)
    }
}

/// Splits `list`'s output into one [`Routine`] per function; `functions` are the names asked
/// for (a `ROUTINE` line names one of them, then perhaps ` in FILE`).
pub fn routines(text: &str, functions: &[String]) -> Vec<Routine> {
    let counted = Regex::new(r"^ *([0-9]+|\.) +([0-9]+|\.) +([0-9]+|\?):(.*)$").unwrap();
    let mut out: Vec<(Routine, Vec<Line>)> = Vec::new();
    for line in text.lines() {
        if let Some(rest) = line.strip_prefix("ROUTINE ======================== ") {
            // The longest name asked for that the line starts with (one name may prefix another).
            let function = functions
                .iter()
                .filter(|f| rest == f.as_str() || rest.starts_with(&format!("{f} in ")))
                .max_by_key(|f| f.len())
                .cloned()
                .unwrap_or_else(|| rest.to_string());
            let place = rest[function.len().min(rest.len())..].trim_start_matches(" in ");
            let html = format!(
                "<h3><a href=\"#graph\" class=\"fn\" data-fn=\"{f}\">{f}</a> <span class=\"file\">{}</span></h3>",
                escape(place),
                f = escape(&function)
            );
            out.push((Routine { function, html }, Vec::new()));
            continue;
        }
        let Some((_, lines)) = out.last_mut() else { continue };
        lines.push(match counted.captures(line) {
            Some(c) => Line::Counted {
                flat: c[1].parse().unwrap_or(0),
                cum: c[2].parse().unwrap_or(0),
                number: c[3].to_string(),
                text: c[4].to_string(),
            },
            None => Line::Note(line.trim().to_string()),
        });
    }
    out.into_iter()
        .map(|(mut routine, lines)| {
            routine.html.push_str(&table(&lines));
            routine
        })
        .collect()
}

enum Line {
    Counted {
        flat: u64,
        cum: u64,
        number: String,
        text: String,
    },
    Note(String),
}

fn table(lines: &[Line]) -> String {
    let most = lines
        .iter()
        .map(|l| match l {
            Line::Counted { cum, .. } => *cum,
            Line::Note(_) => 0,
        })
        .max()
        .unwrap_or(0)
        .max(1);
    let mut html = String::from(
        "<table class=\"src\"><thead><tr><th>flat</th><th>cum</th><th>line</th><th></th></tr></thead><tbody>",
    );
    for line in lines {
        match line {
            Line::Counted {
                flat,
                cum,
                number,
                text,
            } => {
                let shown = |n: u64| if n == 0 { ".".to_string() } else { n.to_string() };
                let heat = *cum as f64 / most as f64;
                let style = if *cum > 0 {
                    format!(" style=\"--heat:{heat:.3}\" class=\"hot\"")
                } else {
                    String::new()
                };
                let _ = write!(
                    html,
                    "<tr{style}><td>{}</td><td>{}</td><td>{number}</td><td><code>{}</code></td></tr>",
                    shown(*flat),
                    shown(*cum),
                    escape(text)
                );
            }
            Line::Note(note) => {
                let _ = write!(html, "<tr class=\"note\"><td colspan=\"4\">{}</td></tr>", escape(note));
            }
        }
    }
    html.push_str("</tbody></table>");
    html
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn list_output_becomes_one_table_per_function() {
        let text = "Total: 10 samples (0.01 s at 1000 us per sample)\n\
ROUTINE ======================== hot_a in /src/hot.c\n         7          7 (flat, cum) 70.00% of Total\n\
         .          .     10:int x;\n         7          7     11:  x <<= 1; // <b>\n\
ROUTINE ======================== hot\n (no line information: stripped)\n";
        let names = ["hot".to_string(), "hot_a".to_string()];
        let routines = routines(text, &names);
        assert_eq!(routines.len(), 2);
        assert_eq!(routines[0].function, "hot_a");
        let html = routines[0].html("src-0");
        assert!(html.contains("/src/hot.c") && html.contains("--heat:1.000"), "{html}");
        assert!(html.contains("&lt;b&gt;"), "source is escaped: {html}");
        assert!(routines[1].html("x").contains("no line information"));
    }
}
