//! Tables of text cells, written three ways: plain columns for a terminal, a GitHub markdown
//! table, and a standalone HTML page.

/// Left-aligned columns, two spaces apart, trailing spaces trimmed.
pub fn plain(header: &[&str], rows: &[Vec<String>]) -> String {
    let mut w: Vec<usize> = header.iter().map(|h| h.chars().count()).collect();
    for r in rows {
        for (i, c) in r.iter().enumerate() {
            w[i] = w[i].max(c.chars().count());
        }
    }
    let line = |cells: Vec<&str>| {
        let s: Vec<String> = cells
            .iter()
            .enumerate()
            .map(|(i, c)| format!("{c:<0$}", w[i]))
            .collect();
        s.join("  ").trim_end().to_string() + "\n"
    };
    let mut out = line(header.to_vec());
    for r in rows {
        out += &line(r.iter().map(String::as_str).collect());
    }
    out
}

/// A GitHub markdown table (`|` in a cell escaped).
pub fn markdown(header: &[&str], rows: &[Vec<String>]) -> String {
    let line = |cells: Vec<String>| format!("| {} |\n", cells.join(" | "));
    let esc = |c: &str| c.replace('|', "\\|");
    let mut out = line(header.iter().map(|h| esc(h)).collect());
    out += &line(header.iter().map(|_| "---".to_string()).collect());
    for r in rows {
        out += &line(r.iter().map(|c| esc(c)).collect());
    }
    out
}

/// `s` with `&`, `<`, `>` and `"` escaped for HTML text and attributes.
pub fn html_escape(s: &str) -> String {
    s.replace('&', "&amp;")
        .replace('<', "&lt;")
        .replace('>', "&gt;")
        .replace('"', "&quot;")
}

/// A standalone HTML page titled `title` holding one table.
pub fn html(title: &str, header: &[&str], rows: &[Vec<String>]) -> String {
    let cells = |tag: &str, cells: &mut dyn Iterator<Item = &str>| {
        let c: String = cells
            .map(|c| format!("<{tag}>{}</{tag}>", html_escape(c)))
            .collect();
        format!("<tr>{c}</tr>\n")
    };
    let mut body = cells("th", &mut header.iter().copied());
    for r in rows {
        body += &cells("td", &mut r.iter().map(String::as_str));
    }
    let title = html_escape(title);
    format!(
        "<!DOCTYPE html>\n<html lang=\"en\">\n<head>\n<meta charset=\"utf-8\">\n\
         <title>{title}</title>\n<style>\ntable {{ border-collapse: collapse; font-family: \
         sans-serif; }}\nth, td {{ border: 1px solid #ccc; padding: 4px 8px; text-align: left; \
         }}\n</style>\n</head>\n<body>\n<h1>{title}</h1>\n<table>\n{body}</table>\n</body>\n\
         </html>\n"
    )
}

#[cfg(test)]
mod tests {
    use super::*;

    fn rows() -> Vec<Vec<String>> {
        vec![vec!["a|b".into(), "<x>".into()]]
    }

    #[test]
    fn plain_aligns_columns() {
        let t = plain(&["name", "v"], &[vec!["long name".into(), "1".into()]]);
        assert_eq!(t, "name       v\nlong name  1\n");
    }

    #[test]
    fn markdown_escapes_bars_and_has_a_rule() {
        let t = markdown(&["h1", "h2"], &rows());
        assert_eq!(t, "| h1 | h2 |\n| --- | --- |\n| a\\|b | <x> |\n");
    }

    #[test]
    fn html_escapes_cells_and_stands_alone() {
        let t = html("T & U", &["h"], &rows());
        assert!(t.starts_with("<!DOCTYPE html>"), "{t}");
        assert!(t.contains("<td>&lt;x&gt;</td>"), "{t}");
        assert!(t.contains("<title>T &amp; U</title>"), "{t}");
        assert!(t.trim_end().ends_with("</html>"), "{t}");
    }
}
