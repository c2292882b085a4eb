//! README.md read as a program: its fenced blocks, and the shell blocks split into commands with
//! the answers the README shows beside them.

/// A fenced block: its language tag (`sh`, `toml`, …, or empty) and its lines, the fence's
/// indentation removed (a block inside a numbered list is indented).
pub struct Block {
    pub lang: String,
    /// Line number of the opening fence in README.md (1-based), for failure messages.
    pub line: usize,
    pub lines: Vec<String>,
}

/// One command of a shell block and what the README shows it answers.
pub struct Example {
    /// Line number in README.md of the command's first line.
    pub line: usize,
    /// The command as a shell reads it: continuations joined, the comment removed.
    pub command: String,
    /// Answer lines shown beside it (`# {…}` after it or on its line, `# HTTP/1.1 …` and the
    /// header lines that follow one), in order.
    pub answers: Vec<String>,
}

/// Every fenced block of `markdown`.
pub fn blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut open: Option<(usize, Block)> = None;
    for (i, line) in markdown.lines().enumerate() {
        let trimmed = line.trim_start();
        let indent = line.len() - trimmed.len();
        match (&mut open, trimmed.strip_prefix("```")) {
            (None, Some(lang)) => {
                let block = Block {
                    lang: lang.trim().to_string(),
                    line: i + 1,
                    lines: Vec::new(),
                };
                open = Some((indent, block));
            }
            (Some(_), Some(_)) => out.push(open.take().expect("open block").1),
            (Some((indent, block)), None) => {
                let cut = line.len() - line.trim_start().len();
                block.lines.push(line[cut.min(*indent)..].to_string());
            }
            (None, None) => {}
        }
    }
    out
}

/// The commands of every shell block (`sh`, `bash`, `console`), in README order.
pub fn examples(markdown: &str) -> Vec<Example> {
    blocks(markdown)
        .into_iter()
        .filter(|b| matches!(b.lang.as_str(), "sh" | "bash" | "shell" | "console"))
        .flat_map(|b| split(&b))
        .collect()
}

/// Split a shell block into commands: `\` continues a line, `#` starts a comment (outside
/// quotes), and a comment that shows an answer is kept with the command before it. In a
/// `console` block commands start with `$ ` and the other lines are their output.
fn split(block: &Block) -> Vec<Example> {
    let console = block.lang == "console";
    let mut out: Vec<Example> = Vec::new();
    let mut pending = String::new();
    let mut first_line = 0;
    for (i, raw) in block.lines.iter().enumerate() {
        let line_no = block.line + 1 + i;
        let mut line = raw.as_str();
        if pending.is_empty() {
            let trimmed = line.trim();
            if trimmed.is_empty() {
                continue;
            }
            if console {
                match trimmed.strip_prefix("$ ") {
                    Some(command) => line = command,
                    None => {
                        if let Some(last) = out.last_mut() {
                            last.answers.push(trimmed.to_string());
                        }
                        continue;
                    }
                }
            } else if let Some(comment) = trimmed.strip_prefix('#') {
                if let Some(last) = out.last_mut() {
                    if is_answer(comment.trim(), &last.answers) {
                        last.answers.push(comment.trim().to_string());
                    }
                }
                continue;
            }
            first_line = line_no;
        } else {
            line = line.trim_start();
        }
        if let Some(head) = line.trim_end().strip_suffix('\\') {
            pending.push_str(head.trim_end());
            pending.push(' ');
            continue;
        }
        pending.push_str(line);
        let (command, comment) = split_comment(&pending);
        let mut example = Example {
            line: first_line,
            command: command.trim().to_string(),
            answers: Vec::new(),
        };
        if let Some(comment) = comment.filter(|c| is_answer(c, &[])) {
            example.answers.push(comment.to_string());
        }
        out.push(example);
        pending.clear();
    }
    out
}

/// A comment shows an answer when it is a JSON object, an HTTP status line, or a header line
/// after one; anything else is prose ("# or, without a file:").
fn is_answer(comment: &str, before: &[String]) -> bool {
    let header = before.first().is_some_and(|a| a.starts_with("HTTP/"))
        && comment.split_once(": ").is_some_and(|(name, _)| {
            !name.is_empty() && name.chars().all(|c| c.is_ascii_alphanumeric() || c == '-')
        });
    comment.starts_with('{') || comment.starts_with("HTTP/") || header
}

/// The command and its comment: `#` at the start of a word, outside quotes.
fn split_comment(line: &str) -> (&str, Option<&str>) {
    let mut quote: Option<char> = None;
    let mut word_start = true;
    for (i, c) in line.char_indices() {
        match (quote, c) {
            (Some(q), _) if c == q => quote = None,
            (Some(_), _) => {}
            (None, '\'' | '"') => quote = Some(c),
            (None, '#') if word_start => return (&line[..i], Some(line[i + 1..].trim())),
            _ => {}
        }
        word_start = quote.is_none() && c.is_whitespace();
    }
    (line, None)
}

#[test]
fn commands_comments_continuations_and_answers() {
    let md = "text\n\n   ```sh\n   a 'x # y' # note\n   # {\"k\":1}\n   b --x \\\n       --y  # {\"ok\":true}\n   # prose\n   c\n   # HTTP/1.1 429 Too Many Requests\n   # retry-after: 1\n   ```\n";
    let examples = examples(md);
    let got: Vec<(&str, usize, Vec<&str>)> = examples
        .iter()
        .map(|e| {
            let answers = e.answers.iter().map(String::as_str).collect();
            (e.command.as_str(), e.line, answers)
        })
        .collect();
    assert_eq!(
        got,
        vec![
            ("a 'x # y'", 4, vec!["{\"k\":1}"]),
            ("b --x --y", 6, vec!["{\"ok\":true}"]),
            (
                "c",
                9,
                vec!["HTTP/1.1 429 Too Many Requests", "retry-after: 1"]
            ),
        ]
    );
}
