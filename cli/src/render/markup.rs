//! Text made safe inside HTML and SVG (element content and quoted attributes alike): the one
//! escaper every page and chart uses.

/// `text` with `&`, `<`, `>`, `"` and `'` as character references.
pub fn escape(text: &str) -> String {
    let mut out = String::with_capacity(text.len());
    for c in text.chars() {
        match c {
            '&' => out.push_str("&amp;"),
            '<' => out.push_str("&lt;"),
            '>' => out.push_str("&gt;"),
            '"' => out.push_str("&quot;"),
            '\'' => out.push_str("&#39;"),
            c => out.push(c),
        }
    }
    out
}
