//! Which errors are the user's (exit code 2) and which are ours (exit code 1).

/// An error caused by the user's input (bad arguments, file or model name): exit code 2.
#[derive(Debug)]
pub struct UserError(String);

impl std::fmt::Display for UserError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

impl std::error::Error for UserError {}

/// Mark an error as the user's fault, keeping its whole message on one line.
pub fn user<E: Into<anyhow::Error>>(e: E) -> anyhow::Error {
    anyhow::Error::new(UserError(one_line(&e.into())))
}

/// The error and its causes on one line, "outer: inner", leaving out a cause whose text the
/// message already holds (errors that print their source, like "file: what", would otherwise
/// repeat it).
pub fn one_line(e: &anyhow::Error) -> String {
    let mut msg = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if msg.contains(&text) {
            continue;
        }
        if !msg.is_empty() {
            msg.push_str(": ");
        }
        msg.push_str(&text);
    }
    msg
}

/// A facade error: the user's fault or not, as the facade says.
pub fn facade(e: opsched::Error) -> anyhow::Error {
    if e.is_user_error() {
        user(e)
    } else {
        anyhow::Error::new(e)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Debug, thiserror::Error)]
    #[error("{path}: {source}")]
    struct InFile {
        path: String,
        #[source]
        source: std::io::Error,
    }

    #[test]
    fn one_line_keeps_contexts_and_drops_repeated_causes() {
        let inner = std::io::Error::other("expected value at line 1");
        let e = anyhow::Error::new(InFile {
            path: "g.json".into(),
            source: inner,
        })
        .context("loading the model");
        assert_eq!(
            one_line(&e),
            "loading the model: g.json: expected value at line 1"
        );
    }
}
